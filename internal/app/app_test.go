package app_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/airlockhq/airlock/internal/app"
	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// TestNewWiresEveryCallback: the callbacks the copies of the wiring used to set by hand,
// and disagree on, are all set by New; the outbox's gauges are registered once; the
// handler serves.
func TestNewWiresEveryCallback(t *testing.T) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			a, err := app.New(app.Options{Store: b.Open(t, nil), Policy: policy.Empty(), Runs: apptest.LeaseConfig})
			if err != nil {
				t.Fatal(err)
			}
			for name, set := range map[string]bool{
				"approvals.Settle":   a.Approvals.Settle != nil,
				"approvals.Queued":   a.Approvals.Queued != nil,
				"approvals.Observer": a.Approvals.Observer != nil,
				"failures.Observer":  a.Failures.Observer != nil,
				"effects.Observe":    a.Effects.Observe != nil,
				"runs.Outcomes":      a.Runs.Outcomes != nil,
				"runs.Budgets":       a.Runs.Budgets != nil,
			} {
				if !set {
					t.Errorf("%s is not wired", name)
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
