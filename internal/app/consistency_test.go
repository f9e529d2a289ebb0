package app_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/ledger"
	"github.com/airlockhq/airlock/internal/retention"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/google/uuid"
)

// The part of the consistency suite that spans the
// services: a resume after many heartbeats, verdicts of a large run, and retention that
// keeps what may still be sent.
func TestResumeAfterManyHeartbeats(t *testing.T) {
	apptest.EachEffects(t, testResumeAfterManyHeartbeats)
}
func TestLargeRunVerdicts(t *testing.T) { apptest.EachEffects(t, testLargeRunVerdicts) }
func TestRetentionKeepsResendablePayloads(t *testing.T) {
	apptest.EachEffects(t, testRetentionKeepsResendablePayloads)
}

// testResumeAfterManyHeartbeats: a run that heartbeat more than a page of times before
// its real work began has still started: resume says stop, never continue from scratch.
func testResumeAfterManyHeartbeats(t *testing.T, e *apptest.EffectsEnv) {
	r := e.ClaimRun(t, "busy")
	for range 12 {
		if _, err := e.Runs.Heartbeat(ctx, apptest.Lease(r), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.Plan("busy", "x", "in"); err != nil {
		t.Fatal(err)
	}
	if v, err := e.Ledger.Resume(ctx, "busy"); err != nil || v.Verdict != ledger.Stop {
		t.Fatalf("resume after 12 heartbeats and a plan = %+v, %v; want stop", v, err)
	}
}

// bulkEffects gives the run n sent dispatcher effects, then moves the clock on, so an
// effect made next sorts after them.
func bulkEffects(t *testing.T, e *apptest.EffectsEnv, key string, n int) {
	t.Helper()
	err := e.Store.Transact(ctx, func(q store.Queries) error {
		for i := range n {
			now := e.Clock.Now()
			if _, _, err := q.EffectInsert(ctx, store.Effect{ID: uuid.NewString(), RunKey: key, EffectID: fmt.Sprintf("bulk-%04d", i),
				ActionType: "note", Target: "default", Executor: store.ExecutorDispatcher, Payload: json.RawMessage(`{}`),
				PayloadHash: "h", State: store.EffectCompleted, NotBefore: now, CreatedAt: now}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	e.Clock.Advance(time.Second)
}

// testLargeRunVerdicts: a run with more than 1,000 effects still gets the verdicts of
// all of them: resume sees the agent effect planned after them, and the cancel link
// finds the windowed effect queued after them.
func testLargeRunVerdicts(t *testing.T, e *apptest.EffectsEnv) {
	r := e.ClaimRun(t, "big")
	if _, _, err := e.Ledger.Save(ctx, "big", r.LeaseOwner, apptest.LedgerDoc("big", 1, "compare_figures"), "t"); err != nil {
		t.Fatal(err)
	}
	bulkEffects(t, e, "big", 1000)
	if _, err := e.Plan("big", "share-draft-01", "in-1"); err != nil {
		t.Fatal(err)
	}
	if v, err := e.Ledger.Resume(ctx, "big"); err != nil || v.Verdict != ledger.Reconcile {
		t.Fatalf("resume of a run with 1,001 effects, the last planned = %+v, %v; want reconcile", v, err)
	}
	l, err := e.Ledger.Get(ctx, "big")
	if err != nil || len(l.Effects) != 1 {
		t.Fatalf("ledger effects = %d, %v; want the one agent effect", len(l.Effects), err)
	}

	w := e.ClaimRun(t, "big-window")
	bulkEffects(t, e, "big-window", 1000)
	sub, err := e.Effects.Submit(ctx, effects.QueueRequest{Key: w.Key, Owner: w.LeaseOwner, Version: w.Version,
		ActionType: "digest", Target: "default", Payload: json.RawMessage(`{"week":48}`), Actor: "test"})
	if err != nil || sub.Approval == nil {
		t.Fatalf("queue in a window: %+v, %v", sub, err)
	}
	lead := approvals.Person{Subject: "lead", Roles: []string{"support-lead"}}
	if _, err := e.Approvals.Decide(ctx, approvals.HashToken(sub.Approval.Token), approvals.Cancel, "not this week", lead); err != nil {
		t.Fatalf("cancel the 1,001st effect of a run: %v", err)
	}
	got, err := e.Effects.Get(ctx, sub.Effect.ID)
	if err != nil || got.State != store.EffectCancelled {
		t.Fatalf("after the cancel: %s, %v", got.State, err)
	}
}

// testRetentionKeepsResendablePayloads: a failed effect may still be resent by an
// operator (resolve not_sent), so retention never removes its payload, however old.
func testRetentionKeepsResendablePayloads(t *testing.T, e *apptest.EffectsEnv) {
	e.Provider.SetReply(func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"id":"resent"}`)
	})
	eff := e.Queue(t, "old-failure", "note", "default", `{"note":"refund approved"}`)
	e.Tick(t)
	apptest.Equal(t, "after a 400", e.EffectState(t, eff.ID), store.EffectFailed)
	if _, err := retention.Purge(ctx, e.Store, e.Policy, e.Clock.Now().Add(400*24*time.Hour), false); err != nil {
		t.Fatal(err)
	}
	if got, err := e.Effects.Get(ctx, eff.ID); err != nil || got.Payload == nil {
		t.Fatalf("the failed effect's payload after retention: %s, %v", got.Payload, err)
	}
	if _, err := e.Effects.Resolve(ctx, eff.ID, effects.Resolution{Outcome: effects.OutcomeNotSent, ProviderID: "", Note: "checked the CRM: nothing there"}, "op"); err != nil {
		t.Fatal(err)
	}
	e.Tick(t)
	got, _ := e.Effects.Get(ctx, eff.ID)
	if got.State != store.EffectCompleted || got.ProviderID != "resent" {
		t.Fatalf("resent after retention: %s/%q (%s)", got.State, got.ProviderID, got.LastErrorClass)
	}
}
