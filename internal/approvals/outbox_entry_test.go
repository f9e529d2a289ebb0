package approvals_test

import (
	"encoding/json"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// TestApprovedEffectEntersOutboxAsQueuedOne: an approved effect enters the outbox through
// the same step as an ungated one, so its effect_queued event carries the same facts —
// not_before (the row's) and payload_fields (the payload as the policy redacts it) — plus
// the approval that let it in.
func TestApprovedEffectEntersOutboxAsQueuedOne(t *testing.T) {
	storetest.Each(t, func(t *testing.T, b storetest.Backend) {
		e := apptest.NewEffectsEnv(t, b, "")
		queuedDetail := func(key string) map[string]json.RawMessage {
			t.Helper()
			evs, err := e.Store.EventList(ctx, key, 0, 100)
			if err != nil {
				t.Fatal(err)
			}
			for _, ev := range evs {
				if ev.Kind == string(store.EventEffectQueued) {
					var d map[string]json.RawMessage
					if err := json.Unmarshal(ev.Detail, &d); err != nil {
						t.Fatal(err)
					}
					return d
				}
			}
			t.Fatalf("%s: no effect_queued event", key)
			return nil
		}

		direct := e.ClaimRun(t, "direct")
		if _, err := e.Effects.Submit(ctx, effects.QueueRequest{Key: "direct", Owner: direct.LeaseOwner, Version: direct.Version,
			ActionType: "note", Target: "default", Payload: json.RawMessage(`{"text":"hi"}`), Actor: "apikey:n8n"}); err != nil {
			t.Fatal(err)
		}

		r := e.ClaimRun(t, "gated")
		sub, err := e.Effects.Submit(ctx, effects.QueueRequest{Key: "gated", Owner: r.LeaseOwner, Version: r.Version,
			ActionType: "email", Target: "default", Payload: json.RawMessage(`{"text":"hi"}`), Actor: "apikey:n8n"})
		if err != nil || sub.Approval == nil {
			t.Fatalf("submit: %+v %v", sub, err)
		}
		e.Clock.Advance(time.Minute)
		if _, err := e.Approvals.Decide(ctx, approvals.HashToken(sub.Approval.Token), approvals.Approve, "",
			approvals.Person{Subject: "lead", Roles: []string{"support-lead"}}); err != nil {
			t.Fatal(err)
		}
		eff, err := e.Store.EffectByRunEffectID(ctx, "gated", sub.Approval.Approval.EffectID)
		if err != nil {
			t.Fatal(err)
		}

		d := queuedDetail("gated")
		want := slices.Sorted(maps.Keys(queuedDetail("direct")))
		want = slices.Sorted(slices.Values(append(want, "approval_id")))
		apptest.Equal(t, "effect_queued fields", slices.Sorted(maps.Keys(d)), want)
		var notBefore time.Time
		if err := json.Unmarshal(d["not_before"], &notBefore); err != nil || !notBefore.Equal(eff.NotBefore) {
			t.Fatalf("not_before %s (%v), the row's %s", d["not_before"], err, eff.NotBefore)
		}
		var fields map[string]any
		if err := json.Unmarshal(d["payload_fields"], &fields); err != nil {
			t.Fatal(err)
		}
		apptest.Equal(t, "payload_fields", fields, e.Policy.Action("email").Redact(eff.Payload))
		var approvalID string
		_ = json.Unmarshal(d["approval_id"], &approvalID)
		apptest.Equal(t, "approval_id", approvalID, sub.Approval.Approval.ID)
	})
}
