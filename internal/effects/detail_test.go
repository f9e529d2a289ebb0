package effects

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/connector"
	"github.com/airlockhq/airlock/internal/connector/httpconn"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

// mapDetail is an outcome event's detail as planOutcome built it before outcomeDetail: a
// map, encoded by encoding/json with its keys sorted. The struct must encode to the same
// bytes for every outcome: events are hashed into the audit chain and read by clients.
func mapDetail(e store.Effect, res connector.Result, idempotent bool, maxAttempts int, wait time.Duration, reconciled bool) (map[string]any, map[string]any) {
	if res.Outcome == connector.Sent {
		if id, note := connector.SafeProviderID(res.ProviderID); note != "" {
			res.ProviderID, res.Note = id, note
		}
	}
	d := map[string]any{"effect_id": e.EffectID, "action_type": e.ActionType, "target": e.Target, "attempts": e.Attempts}
	if res.Class != "" {
		d["error_class"] = res.Class
	}
	alert := ""
	switch {
	case res.Outcome == connector.Sent:
		d["provider_id"] = res.ProviderID
		if res.Note != "" {
			d["provider_id_note"] = res.Note
		}
		if reconciled {
			d["from"], d["found"], d["source"] = store.EffectUnknown, 1, LateOutcomeSource
		}
	case (res.Outcome == connector.Retryable || res.Outcome == connector.Ambiguous && idempotent) && e.Attempts < maxAttempts:
		d["retry_in_ms"] = wait.Milliseconds()
		if res.Outcome == connector.Ambiguous {
			d["ambiguous"] = true
		}
	case res.Outcome == connector.Ambiguous:
		alert = "effect_unknown"
	default:
		alert = "effect_failed"
		if res.Outcome == connector.Retryable {
			d["retry_cap"] = maxAttempts
		}
	}
	if alert == "" {
		return d, nil
	}
	return d, map[string]any{"alert": alert, "effect_id": e.EffectID, "error_class": res.Class}
}

func TestOutcomeDetailIsTheMapsJSON(t *testing.T) {
	pol, err := policy.Parse([]byte(`
actions:
  idem:
    connector: http
    gate: none
    http: {url: "http://127.0.0.1:1/x", idempotent: true}
    retry: {max_attempts: 3, backoff: 1s, max_backoff: 4s}
  plain:
    connector: http
    gate: none
    http: {url: "http://127.0.0.1:1/y"}
    retry: {max_attempts: 2, backoff: 0s}
`), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	conns := map[string]connector.Connector{}
	for _, name := range []string{"idem", "plain"} {
		h := pol.Action(name).Section.(*httpconn.Section)
		if conns[name], err = httpconn.New(httpconn.Config{Targets: h.Targets, Idempotent: h.Idempotent}); err != nil {
			t.Fatal(err)
		}
	}
	s := &Service{Outbox: &Outbox{Base: runs.Base{Policy: pol}}, connectors: conns}
	now, at := time.Now(), time.Now()
	n := 0
	for _, typ := range []string{"idem", "plain"} {
		a := pol.Action(typ)
		for _, attempts := range []int{1, 2, 3} {
			for _, res := range []connector.Result{
				{Outcome: connector.Sent, ProviderID: "p-1"},
				{Outcome: connector.Sent},
				{Outcome: connector.Sent, ProviderID: "<b>&\u2028", Note: "a note"},
				{Outcome: connector.Sent, ProviderID: "bad\xff\x00id"},
				{Outcome: connector.Retryable, Class: "http_503", RetryAfter: 1500 * time.Millisecond},
				{Outcome: connector.Retryable, Class: "dns"},
				{Outcome: connector.Ambiguous, Class: "timeout"},
				{Outcome: connector.Refused, Class: "http_400"},
				{Outcome: connector.Refused},
			} {
				for _, reconciled := range []bool{false, true} {
					if reconciled && res.Outcome != connector.Sent {
						continue
					}
					e := store.Effect{ID: "id", RunKey: "k", EffectID: "fx<1>", ActionType: typ, Target: "t&\"x\"",
						Executor: store.ExecutorDispatcher, Attempts: attempts}
					pl := s.planOutcome(sent{e: e, owner: "owner", res: res, actor: "airlock"}, now, &at)
					if reconciled {
						pl.reconcile()
					}
					wait := time.Duration(0)
					if pl.update.NotBefore != nil {
						wait = pl.update.NotBefore.Sub(now)
					}
					wantDetail, wantAlert := mapDetail(e, res, conns[typ].Idempotent(), a.Retry.MaxAttempts, wait, reconciled)
					evs := pl.events()
					want := []map[string]any{wantDetail}
					if wantAlert != nil {
						want = append(want, wantAlert)
					}
					name := fmt.Sprintf("%s/attempts %d/%+v/reconciled %t", typ, attempts, res, reconciled)
					if len(evs) != len(want) {
						t.Fatalf("%s: %d events, want %d", name, len(evs), len(want))
					}
					for i := range evs {
						got, err := json.Marshal(evs[i].detail)
						if err != nil {
							t.Fatal(err)
						}
						w, _ := json.Marshal(want[i])
						if string(got) != string(w) {
							t.Errorf("%s, event %d:\n got  %s\n want %s", name, i, got, w)
						}
						n++
					}
				}
			}
		}
	}
	t.Logf("%d event details compared", n)
}
