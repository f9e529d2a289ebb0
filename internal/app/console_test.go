package app_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/failures"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

var ctx = context.Background()

// The operator console's conformance suite, each test on every backend: its keyset lists
// and the unpark operation.
func TestUnparkUnknownCommit(t *testing.T)   { apptest.EachEffects(t, testUnpark) }
func TestParkedRunsPaged(t *testing.T)       { apptest.EachEffects(t, testParkedPaged) }
func TestEffectsInStatePaged(t *testing.T)   { apptest.EachEffects(t, testEffectsInStatePaged) }
func TestApprovalsPendingPaged(t *testing.T) { apptest.EachEffects(t, testApprovalsPendingPaged) }

func park(t *testing.T, e *apptest.EffectsEnv, key string) store.Run {
	t.Helper()
	e.ClaimRun(t, key)
	d := e.Fail(t, key, "unknown_commit", 0)
	if d.Run.State != store.StateAwaitingHuman || d.Run.ParkReason != "unknown_commit" {
		t.Fatalf("park %s: %+v", key, d.Run)
	}
	return d.Run
}

func testUnpark(t *testing.T, e *apptest.EffectsEnv) {
	park(t, e, "p1")
	// Refused without a reason or with another target state; nothing changes.
	if _, err := e.Failures.Unpark(ctx, "p1", store.StateFailedRetryable, " ", "op"); err == nil {
		t.Fatal("unpark without a reason was accepted")
	}
	if _, err := e.Failures.Unpark(ctx, "p1", store.StateCompleted, "checked", "op"); err == nil {
		t.Fatal("unpark to completed was accepted")
	}
	apptest.Equal(t, "state after refusals", e.Current(t, "p1").State, store.StateAwaitingHuman)
	// Back to failed_retryable: the next delivery with the same payload reclaims it.
	r, err := e.Failures.Unpark(ctx, "p1", store.StateFailedRetryable, "the CRM has no such note", "console:ops")
	if err != nil {
		t.Fatal(err)
	}
	if r.State != store.StateFailedRetryable || r.ParkReason != "" {
		t.Fatalf("unparked: %+v", r)
	}
	if res := e.Claim(t, "p1", "h-p1"); !res.Claimed || !res.Reclaimed {
		t.Fatalf("the delivery after unpark: %+v", res)
	}
	// Twice is refused: it is no longer parked.
	if _, err := e.Failures.Unpark(ctx, "p1", store.StateFailedTerminal, "again", "op"); !errors.Is(err, failures.ErrNotParked) {
		t.Fatalf("unpark of a running run: %v", err)
	}
	evs, err := e.Store.EventList(ctx, "p1", 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, ev := range evs {
		if ev.Kind == "run_unparked" {
			var d map[string]any
			_ = json.Unmarshal(ev.Detail, &d)
			found = ev.Actor == "console:ops" && d["reason"] == "the CRM has no such note" && d["parked_for"] == "unknown_commit" && d["to"] == "failed_retryable"
		}
	}
	if !found {
		t.Fatalf("no run_unparked event with actor and reason: %+v", evs)
	}

	// To failed_terminal: finished, with a result that says so; claims only report it.
	park(t, e, "p2")
	r, err = e.Failures.Unpark(ctx, "p2", store.StateFailedTerminal, "sent by hand", "op")
	if err != nil || r.State != store.StateFailedTerminal {
		t.Fatalf("unpark to failed_terminal: %+v %v", r, err)
	}
	if res := e.Claim(t, "p2", "h-p2"); res.Claimed {
		t.Fatal("a failed_terminal run was claimed again")
	}
	// A run waiting for an approval is not parked: its approval decides it.
	e.ClaimRun(t, "p3")
	if _, err := e.Store.RunSetState(ctx, store.RunSetStateParams{Key: "p3", From: store.StateProcessing, To: store.StateAwaitingHuman, ParkReason: "approval"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Failures.Unpark(ctx, "p3", store.StateFailedTerminal, "no", "op"); !errors.Is(err, failures.ErrNotParked) {
		t.Fatalf("unpark of an approval's run: %v", err)
	}
	if _, err := e.Failures.Unpark(ctx, "nope", store.StateFailedTerminal, "no", "op"); !errors.Is(err, runs.ErrNotFound) {
		t.Fatalf("unpark of no run: %v", err)
	}
}

func keysOf(rs []store.Run) []string {
	out := []string{}
	for _, r := range rs {
		out = append(out, r.Key)
	}
	return out
}

func testParkedPaged(t *testing.T, e *apptest.EffectsEnv) {
	for i := range 5 {
		park(t, e, fmt.Sprintf("k%d", i))
		e.Clock.Advance(time.Second)
	}
	e.ClaimRun(t, "running") // not parked: never listed
	var got []string
	var after store.Cursor
	for {
		page, err := e.Store.RunsParked(ctx, after, 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		got = append(got, keysOf(page)...)
		last := page[len(page)-1]
		after = store.Cursor{At: last.UpdatedAt, ID: last.Key}
	}
	apptest.Equal(t, "parked runs, newest first, in pages of 2", got, []string{"k4", "k3", "k2", "k1", "k0"})
	if _, err := e.Failures.Unpark(ctx, "k2", store.StateFailedTerminal, "done", "op"); err != nil {
		t.Fatal(err)
	}
	page, err := e.Store.RunsParked(ctx, store.Cursor{}, 10)
	if err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "after unparking k2", keysOf(page), []string{"k4", "k3", "k1", "k0"})
}

func testEffectsInStatePaged(t *testing.T, e *apptest.EffectsEnv) {
	e.ClaimRun(t, "r1")
	base := e.Clock.Now()
	for i, st := range []store.EffectState{store.EffectUnknown, store.EffectFailed, store.EffectUnknown, store.EffectCompleted, store.EffectUnknown} {
		at := base.Add(time.Duration(i) * time.Second)
		if _, _, err := e.Store.EffectInsert(ctx, store.Effect{ID: uuid.NewString(), RunKey: "r1", EffectID: fmt.Sprintf("e%d", i),
			ActionType: "note", Target: "default", Executor: store.ExecutorDispatcher, Payload: json.RawMessage(`{}`), PayloadHash: "h",
			State: st, NotBefore: at, CreatedAt: at}); err != nil {
			t.Fatal(err)
		}
	}
	ids := func(state store.EffectState, n int) []string {
		var out []string
		var after store.Cursor
		for {
			page, err := e.Store.EffectsInState(ctx, state, after, n)
			if err != nil {
				t.Fatal(err)
			}
			if len(page) == 0 {
				return out
			}
			for _, f := range page {
				out = append(out, f.EffectID)
			}
			last := page[len(page)-1]
			after = store.Cursor{At: last.UpdatedAt, ID: last.ID}
		}
	}
	apptest.Equal(t, "unknown, oldest first, pages of 1", ids(store.EffectUnknown, 1), []string{"e0", "e2", "e4"})
	apptest.Equal(t, "failed", ids(store.EffectFailed, 2), []string{"e1"})
}

func testApprovalsPendingPaged(t *testing.T, e *apptest.EffectsEnv) {
	base := e.Clock.Now()
	add := func(id, mode string, created time.Time, ttl time.Duration, consumed bool) {
		e.ClaimRun(t, "a-"+id)
		a := store.Approval{ID: id, RunKey: "a-" + id, TokenHash: "th-" + id, Mode: mode, AllowedDecisions: []string{"approve", "reject"},
			ExpiresAt: created.Add(ttl), ApproverRoles: []string{"lead"}, ActionType: "email", Target: "default", EffectID: "x",
			Executor: store.ExecutorDispatcher, Payload: json.RawMessage(`{}`), PayloadHash: "h", CreatedAt: created}
		if err := e.Store.ApprovalInsert(ctx, a); err != nil {
			t.Fatal(err)
		}
		if consumed {
			if _, err := e.Store.ApprovalConsume(ctx, store.ApprovalConsumeParams{TokenHash: a.TokenHash, Decision: "approve", Subject: "x", Now: &created}); err != nil {
				t.Fatal(err)
			}
		}
	}
	add("a0", "approve_before_act", base, time.Hour, false)
	add("a1", "approve_before_act", base.Add(time.Second), time.Hour, true) // decided
	add("a2", "review", base.Add(2*time.Second), time.Hour, false)          // a sampled review
	add("a3", "approve_before_act", base.Add(3*time.Second), time.Second, false)
	add("a4", "approve_before_act", base.Add(4*time.Second), time.Hour, false)
	add("a5", "act_with_window", base.Add(4*time.Second), time.Hour, false) // same time as a4: the id orders them
	now := base.Add(10 * time.Second)                                       // a3 has expired
	var got []string
	var after store.Cursor
	for {
		page, err := e.Store.ApprovalsPending(ctx, after, &now, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		got = append(got, page[0].ID)
		after = store.Cursor{At: page[0].CreatedAt, ID: page[0].ID}
	}
	apptest.Equal(t, "pending approvals, newest first", got, []string{"a5", "a4", "a0"})
}
