package storetest

import (
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

// The store's part of the suite about concurrent writers:
// what readers see while transactions commit out of order (the rest is with the runs
// service and internal/app).
func TestEventPagesNeverSkip(t *testing.T)         { each(t, testEventPagesNeverSkip) }
func TestEventsHeldBehindOlderWriter(t *testing.T) { each(t, testEventsHeldBehindOlderWriter) }

// testEventPagesNeverSkip: ids are taken at insert, not at commit. Writer A takes its
// transaction id first (an event on another run), writer B then inserts the run's event
// with the lower id and stays open, A inserts the higher id (waiting for B: one run's
// events are written one transaction at a time, for its hash chain). A reader paging
// by "after the last id I saw" meanwhile, then again once B commits, must see both
// events exactly once. On SQLite writers take turns, so the same pages run in turn.
func testEventPagesNeverSkip(t *testing.T, e *env) {
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
	// A page that fails ends the test while B waits for bGo: its transaction, left open
	// holding the run's chain head, would hang the schema's cleanup (as EventList's error on
	// Citus once did). Release both writers whatever happens.
	var release sync.Once
	releaseAll := func() { release.Do(func() { close(bGo) }) }
	defer releaseAll()
	var releaseA sync.Once
	defer releaseA.Do(func() { close(aGo) })
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
	// A's event of the run waits for B's transaction, which holds the run's chain head
	// (0015_chain.sql): one run's events are written one transaction at a time, so A
	// commits after B whatever the ids.
	releaseA.Do(func() { close(aGo) })
	page() // B is still open: its event, and A's after it, may not be passed yet
	releaseAll()
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
func testEventsHeldBehindOlderWriter(t *testing.T, e *env) {
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
