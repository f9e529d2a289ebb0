package app_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/airlockhq/airlock/internal/app"
	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// TestNewBuildsEveryServiceOnOneBase: every service shares the one Base New builds (nothing
// is set on a service after construction); the outbox's gauges are registered once; the
// handler serves.
func TestNewBuildsEveryServiceOnOneBase(t *testing.T) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			a, err := app.New(app.Options{Store: b.Open(t, nil), Policy: policy.Empty(), Runs: apptest.LeaseConfig})
			if err != nil {
				t.Fatal(err)
			}
			// Every service is built on one Base: the metrics count what each does, the
			// relay raises what each commits. (An approval's effect entering the outbox is
			// TestApprovedEffectEntersOutboxAsQueuedOne's.)
			for name, b := range map[string]runs.Base{"runs": a.Runs.Base, "failures": a.Failures.Base,
				"effects": a.Effects.Base, "approvals": a.Approvals.Base, "ledger": a.Ledger.Base, "slack": a.Slack.Base} {
				if b.Observer != runs.Observer(a.Metrics) {
					t.Errorf("%s does not count into the app's metrics", name)
				}
				if b.Alerts != runs.AlertWaker(a.Alerts) {
					t.Errorf("%s does not wake the app's alert relay", name)
				}
				if b.Store == nil || b.Policy == nil || b.Log == nil {
					t.Errorf("%s lacks its store, policy or log: %+v", name, b)
				}
			}
			families, err := a.Metrics.Registry.Gather()
			if err != nil {
				t.Fatal(err)
			}
			found := map[string]bool{}
			for _, f := range families {
				found[f.GetName()] = true
			}
			for _, name := range []string{"airlock_effects", "airlock_kill_switch_enabled"} {
				if !found[name] {
					t.Errorf("gauge %s is not registered", name)
				}
			}
			rec := httptest.NewRecorder()
			a.Handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
			if rec.Code != http.StatusOK {
				t.Errorf("/healthz: %d %s", rec.Code, rec.Body)
			}
		})
	}
}

// TestNewNeedsStoreAndPolicy: a graph without either would fail on its first request.
func TestNewNeedsStoreAndPolicy(t *testing.T) {
	if _, err := app.New(app.Options{Policy: policy.Empty()}); err == nil {
		t.Error("New without a store succeeded")
	}
	if _, err := app.New(app.Options{Store: storetest.Backends[0].Open(t, nil)}); err == nil {
		t.Error("New without a policy succeeded")
	}
}
