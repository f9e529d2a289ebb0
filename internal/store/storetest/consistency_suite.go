package storetest

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/ledger"
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
	}
	for _, tt := range effectsTests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, NewEffectsEnv(t, b, "")) })
	}
}

// testEventPagesNeverSkip: ids are taken at insert, not at commit. Writer A takes its
// transaction id first (an event on another run), writer B then inserts the run's event
// with the lower id and stays open, A inserts the higher id and commits. A reader paging
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
	close(aGo)
	if err := wait(t, aDone); err != nil {
		t.Fatal(err)
	}
	page() // B is still open: its event, and A's after it, may not be passed yet
	close(bGo)
	if err := wait(t, bDone); err != nil {
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
	evs, err := e.Store.EventList(ctx, key, 0, 10)
	if err != nil {
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
		equal(t, "transaction runs", tries.Load(), 3)
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
