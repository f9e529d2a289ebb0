package storetest

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/ledger"
	"github.com/airlockhq/airlock/internal/retention"
	"github.com/airlockhq/airlock/internal/store"
)

// RunConsistency is the part of the suite about concurrent writers: what readers see
// while transactions commit out of order, and transactions that must be retried.
func RunConsistency(t *testing.T, b Backend) {
	tests := []struct {
		name string
		fn   func(t *testing.T, e *Env)
	}{
		{"EventPagesNeverSkip", testEventPagesNeverSkip},
		{"EventsHeldBehindOlderWriter", testEventsHeldBehindOlderWriter},
		{"DeadlockRetried", testDeadlockRetried},
		{"CountersSaturate", testCountersSaturate},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.fn(t, NewEnv(t, b, false))
		})
	}
	effectsTests := []struct {
		name string
		fn   func(t *testing.T, e *EffectsEnv)
	}{
		{"ResumeAfterManyHeartbeats", testResumeAfterManyHeartbeats},
		{"LargeRunVerdicts", testLargeRunVerdicts},
		{"RetentionKeepsResendablePayloads", testRetentionKeepsResendablePayloads},
	}
	for _, tt := range effectsTests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, NewEffectsEnv(t, b, "")) })
	}
}

// testEventPagesNeverSkip: ids are taken at insert, not at commit. Writer A takes its
// transaction id first (an event on another run), writer B then inserts the run's event
// with the lower id and stays open, A inserts the higher id (waiting for B: one run's
// events are written one transaction at a time, for its hash chain). A reader paging
// by "after the last id I saw" meanwhile, then again once B commits, must see both
// events exactly once. On SQLite writers take turns, so the same pages run in turn.
func testEventPagesNeverSkip(t *testing.T, e *Env) {
	const key = "paged"
	insert := func(q store.Queries, runKey, kind string) {
		if _, err := q.EventInsert(ctx, store.EventInsertParams{RunKey: runKey, Kind: kind, Actor: "test"}); err != nil {
			t.Error(err)
		}
	}
	var got []string
	after := int64(0)
	page := func() {
		for {
			evs, err := e.Store.EventList(ctx, key, after, 1)
			if err != nil {
				t.Fatal(err)
			}
			if len(evs) == 0 {
				return
			}
			got = append(got, evs[0].Kind)
			after = evs[0].ID
		}
	}
	if e.Store.Backend() != "postgres" {
		for _, kind := range []string{"first", "second"} {
			if err := e.Store.Transact(ctx, func(q store.Queries) error { insert(q, key, kind); return nil }); err != nil {
				t.Fatal(err)
			}
			page()
		}
		equal(t, "events paged", got, []string{"first", "second"})
		return
	}
	aStarted, aGo, aDone := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	bInserted, bGo, bDone := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		aDone <- e.Store.Transact(ctx, func(q store.Queries) error {
			insert(q, "other", "xid_taken")
			close(aStarted)
			<-aGo
			insert(q, key, "second")
			return nil
		})
	}()
	<-aStarted
	go func() {
		bDone <- e.Store.Transact(ctx, func(q store.Queries) error {
			insert(q, key, "first")
			close(bInserted)
			<-bGo
			return nil
		})
	}()
	<-bInserted
	// Since the hash chain (0015_chain.sql), A's event of the run waits for B's
	// transaction, which holds the run's chain head: A commits after B whatever the ids.
	close(aGo)
	page() // B is still open: its event, and A's after it, may not be passed yet
	close(bGo)
	if err := wait(t, bDone); err != nil {
		t.Fatal(err)
	}
	if err := wait(t, aDone); err != nil {
		t.Fatal(err)
	}
	page()
	if len(got) != 2 || got[0] == got[1] {
		t.Fatalf("events paged = %v, want first and second once each", got)
	}
}

func wait(t *testing.T, done chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("a writer transaction did not finish")
		return nil
	}
}

// testEventsHeldBehindOlderWriter: an event committed while an older writer is still
// open is not returned until that writer ends (it could still commit an event before
// it), then it is.
func testEventsHeldBehindOlderWriter(t *testing.T, e *Env) {
	const key = "held"
	if e.Store.Backend() != "postgres" {
		t.Skip("one writer at a time: no older writer can be open")
	}
	started, release, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		done <- e.Store.Transact(ctx, func(q store.Queries) error {
			if _, err := q.EventInsert(ctx, store.EventInsertParams{RunKey: "other", Kind: "older"}); err != nil {
				return err
			}
			close(started)
			<-release
			return nil
		})
	}()
	<-started
	if _, err := e.Store.EventInsert(ctx, store.EventInsertParams{RunKey: key, Kind: "newer"}); err != nil {
		t.Fatal(err)
	}
	// Read in a read-only transaction, which returns the safe page at once instead of
	// waiting for the writer: the writer stays open only for this test's few statements.
	var evs []store.Event
	if err := e.Store.Transact(ctx, func(q store.Queries) error {
		var err error
		evs, err = q.EventList(ctx, key, 0, 10)
		return err
	}); err != nil {
		close(release)
		t.Fatal(err)
	}
	equal(t, "events while an older writer is open", len(evs), 0)
	close(release)
	if err := wait(t, done); err != nil {
		t.Fatal(err)
	}
	equal(t, "events once it ended", kinds(t, e, key), []string{"newer"})
}

// testDeadlockRetried: two transactions lock two runs in opposite orders. PostgreSQL
// aborts one with a deadlock; Transact runs it again, so both commit, each change once.
func testDeadlockRetried(t *testing.T, e *Env) {
	claim(t, e, "k1", "h1")
	claim(t, e, "k2", "h2")
	count := func(q store.Queries, key string) error {
		_, err := q.RunCount(ctx, store.RunCountParams{Key: key, ModelCalls: 1})
		return err
	}
	var tries atomic.Int64
	// lockBoth counts on first, then (after between, on its first run only) on second.
	lockBoth := func(first, second string, between func()) error {
		var ran bool
		return e.Store.Transact(ctx, func(q store.Queries) error {
			tries.Add(1)
			if err := count(q, first); err != nil {
				return err
			}
			if !ran {
				ran = true
				between()
			}
			return count(q, second)
		})
	}
	if e.Store.Backend() != "postgres" {
		// One writer at a time: the two cannot interleave.
		for _, ks := range [][2]string{{"k1", "k2"}, {"k2", "k1"}} {
			if err := lockBoth(ks[0], ks[1], func() {}); err != nil {
				t.Fatal(err)
			}
		}
	} else {
		oneLocked, twoLocked := make(chan struct{}), make(chan struct{})
		done := make(chan error, 2)
		go func() { done <- lockBoth("k1", "k2", func() { close(oneLocked); <-twoLocked }) }()
		go func() {
			<-oneLocked
			done <- lockBoth("k2", "k1", func() { close(twoLocked) })
		}()
		for range 2 {
			if err := wait(t, done); err != nil {
				t.Fatalf("a transaction that lost a deadlock was not run again: %v", err)
			}
		}
		// At least one rerun (a loaded machine may see the rerun wait or deadlock again).
		if n := tries.Load(); n < 3 {
			t.Fatalf("transaction runs = %d, want a rerun after the deadlock", n)
		}
	}
	for _, key := range []string{"k1", "k2"} {
		r, err := e.Runs.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		equal(t, key+" model calls", r.ModelCalls, 2)
	}
}

// testResumeAfterManyHeartbeats: a run that heartbeat more than a page of times before
// its real work began has still started: resume says stop, never continue from scratch.
func testResumeAfterManyHeartbeats(t *testing.T, e *EffectsEnv) {
	r := claimRun(t, e, "busy")
	for range 12 {
		if _, err := e.Runs.Heartbeat(ctx, lease(r), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := plan(e, "busy", "x", "in"); err != nil {
		t.Fatal(err)
	}
	if v, err := e.Ledger.Resume(ctx, "busy"); err != nil || v.Verdict != ledger.Stop {
		t.Fatalf("resume after 12 heartbeats and a plan = %+v, %v; want stop", v, err)
	}
}

// bulkEffects gives the run n sent dispatcher effects, then moves the clock on, so an
// effect made next sorts after them.
func bulkEffects(t *testing.T, e *EffectsEnv, key string, n int) {
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
func testLargeRunVerdicts(t *testing.T, e *EffectsEnv) {
	r := claimRun(t, e, "big")
	if _, _, err := e.Ledger.Save(ctx, "big", r.LeaseOwner, ledgerDoc("big", 1, "compare_figures"), "t"); err != nil {
		t.Fatal(err)
	}
	bulkEffects(t, e, "big", 1000)
	if _, err := plan(e, "big", "share-draft-01", "in-1"); err != nil {
		t.Fatal(err)
	}
	if v, err := e.Ledger.Resume(ctx, "big"); err != nil || v.Verdict != ledger.Reconcile {
		t.Fatalf("resume of a run with 1,001 effects, the last planned = %+v, %v; want reconcile", v, err)
	}
	l, err := e.Ledger.Get(ctx, "big")
	if err != nil || len(l.Effects) != 1 {
		t.Fatalf("ledger effects = %d, %v; want the one agent effect", len(l.Effects), err)
	}

	w := claimRun(t, e, "big-window")
	bulkEffects(t, e, "big-window", 1000)
	sub, err := e.Effects.Submit(ctx, effects.QueueRequest{Key: w.Key, Owner: w.LeaseOwner, Version: w.Version,
		ActionType: "digest", Target: "default", Payload: json.RawMessage(`{"week":48}`), Actor: "test"}, e.Approvals)
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
func testRetentionKeepsResendablePayloads(t *testing.T, e *EffectsEnv) {
	e.Provider.mu.Lock()
	e.Provider.Reply = func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"id":"resent"}`)
	}
	e.Provider.mu.Unlock()
	eff := queue(t, e, "old-failure", "note", "default", `{"note":"refund approved"}`)
	tick(t, e)
	equal(t, "after a 400", effectState(t, e, eff.ID), store.EffectFailed)
	if _, err := retention.Purge(ctx, e.Store, e.Policy, e.Clock.Now().Add(400*24*time.Hour), false); err != nil {
		t.Fatal(err)
	}
	if got, err := e.Effects.Get(ctx, eff.ID); err != nil || got.Payload == nil {
		t.Fatalf("the failed effect's payload after retention: %s, %v", got.Payload, err)
	}
	if _, err := e.Effects.Resolve(ctx, eff.ID, effects.Resolution{Outcome: effects.OutcomeNotSent, ProviderID: "", Note: "checked the CRM: nothing there"}, "op"); err != nil {
		t.Fatal(err)
	}
	tick(t, e)
	got, _ := e.Effects.Get(ctx, eff.ID)
	if got.State != store.EffectCompleted || got.ProviderID != "resent" {
		t.Fatalf("resent after retention: %s/%q (%s)", got.State, got.ProviderID, got.LastErrorClass)
	}
}

// testCountersSaturate: a run's running totals stop at their column's largest value
// instead of overflowing (an error, and the budget check never reached).
func testCountersSaturate(t *testing.T, e *Env) {
	claim(t, e, "big-spender", "h")
	for _, p := range []store.RunCountParams{
		{Key: "big-spender", ModelCalls: math.MaxInt32 - 10, Tokens: math.MaxInt64 - 10},
		{Key: "big-spender", ModelCalls: 1000, Tokens: 1000},
	} {
		if _, err := e.Store.RunCount(ctx, p); err != nil {
			t.Fatalf("count %+v: %v", p, err)
		}
	}
	r, err := e.Runs.Get(ctx, "big-spender")
	if err != nil {
		t.Fatal(err)
	}
	if r.ModelCalls != math.MaxInt32 || r.Tokens != math.MaxInt64 {
		t.Fatalf("totals = %d calls, %d tokens; want them saturated", r.ModelCalls, r.Tokens)
	}
}
