package runs_test

import (
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/store"
)

// The part of the consistency suite that is the runs
// service's: a claim's deadlock is retried, counters saturate.
// Consistency under racing transactions, each test on every backend.
func TestDeadlockRetried(t *testing.T)  { apptest.EachEnv(t, testDeadlockRetried) }
func TestCountersSaturate(t *testing.T) { apptest.EachEnv(t, testCountersSaturate) }

// testDeadlockRetried: two transactions lock two runs in opposite orders. PostgreSQL
// aborts one with a deadlock; Transact runs it again, so both commit, each change once.
func testDeadlockRetried(t *testing.T, e *apptest.Env) {
	e.Claim(t, "k1", "h1")
	e.Claim(t, "k2", "h2")
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
		apptest.Equal(t, key+" model calls", r.ModelCalls, 2)
	}
}

// testCountersSaturate: a run's running totals stop at their column's largest value
// instead of overflowing (an error, and the budget check never reached).
func testCountersSaturate(t *testing.T, e *apptest.Env) {
	e.Claim(t, "big-spender", "h")
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
