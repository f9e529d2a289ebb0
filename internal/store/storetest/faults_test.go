package storetest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

// The fault wrapper itself, on each backend: Before makes nothing, After commits and
// fails, a rolled-back transaction records no write, the injector sees which calls are
// inside a transaction, and store.BatchQueries is offered exactly when the store has it.
func TestFaults(t *testing.T) {
	Each(t, func(t *testing.T, b Backend) {
		clock := NewClock()
		st := b.Open(t, clock)
		now := clock.Now()
		if _, err := st.RunClaim(ctx, store.RunClaimParams{Key: "f1", PayloadHash: "h", Owner: "o", Lease: time.Minute}); err != nil {
			t.Fatal(err)
		}
		eff, _, err := st.EffectInsert(ctx, store.Effect{ID: "e1", RunKey: "f1", EffectID: "x", ActionType: "note", Target: "default",
			Executor: store.ExecutorDispatcher, Payload: []byte(`{}`), PayloadHash: "ph", State: store.EffectPending,
			NotBefore: now.Add(-time.Second), CreatedAt: now})
		if err != nil {
			t.Fatal(err)
		}
		f := &Faults{}
		w := f.Wrap(st)
		_, innerBatch := st.(store.BatchQueries)
		if _, ok := w.(store.BatchQueries); ok != innerBatch {
			t.Fatalf("the wrapper offers BatchQueries: %v; the store: %v", ok, innerBatch)
		}
		var seen []Call
		fail := func(op Op, when When) {
			f.Set(func(c Call) (When, error) {
				seen = append(seen, c)
				if c.Op == op {
					return when, nil
				}
				return Pass, nil
			})
		}
		state := func() store.EffectState {
			t.Helper()
			e, err := st.EffectGet(ctx, eff.ID)
			if err != nil {
				t.Fatal(err)
			}
			return e.State
		}
		lease := store.EffectLeaseParams{Executor: store.ExecutorDispatcher, Caps: map[string]int{"note": 1}, Owner: "d1",
			Lease: time.Minute, Limit: 1}

		fail(OpLeaseEffects, Before)
		if _, err := w.LeaseEffects(ctx, lease); !errors.Is(err, ErrInjected) {
			t.Fatalf("lease failing before: %v", err)
		}
		if s := state(); s != store.EffectPending || len(f.Writes()) != 0 {
			t.Fatalf("after a fault before the lease: %s, writes %v", s, f.Writes())
		}
		fail(OpLeaseEffects, After)
		if _, err := w.LeaseEffects(ctx, lease); !errors.Is(err, ErrInjected) {
			t.Fatalf("lease failing after: %v", err)
		}
		if s := state(); s != store.EffectSending || !slices.Equal(f.Writes(), []Write{{OpLeaseEffects, eff.ID, store.EffectSending}}) {
			t.Fatalf("after a lost lease reply: %s, writes %v", s, f.Writes())
		}
		injected(t, f, OpLeaseEffects, 2)

		back := store.EffectUpdateParams{ID: eff.ID, From: []store.EffectState{store.EffectSending}, Owner: "d1",
			To: store.EffectPending, ReleaseAttempt: true, NotStarted: true}
		f.Set(nil)
		rolledBack := errors.New("the caller's own failure")
		err = w.Transact(ctx, func(q store.Queries) error {
			if _, innerQ := q.(store.BatchQueries); innerQ != innerBatch {
				t.Errorf("a transaction's Queries offer BatchQueries: %v; the store: %v", innerQ, innerBatch)
			}
			if _, err := q.EffectUpdate(ctx, back); err != nil {
				return err
			}
			return rolledBack
		})
		if !errors.Is(err, rolledBack) || state() != store.EffectSending || len(f.Writes()) != 1 {
			t.Fatalf("a rolled-back transaction: %v, %s, writes %v", err, state(), f.Writes())
		}
		seen = nil
		fail("", Pass) // record the calls only
		err = w.Within(ctx, func(ctx context.Context) error {
			return w.Transact(ctx, func(q store.Queries) error { _, err := q.EffectUpdate(ctx, back); return err })
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range seen {
			if c.Op == OpWithin && c.InTx || c.Op != OpWithin && !c.InTx {
				t.Fatalf("calls %+v: only the Within is outside a transaction", seen)
			}
		}
		want := []Write{{OpLeaseEffects, eff.ID, store.EffectSending}, {OpEffectUpdate, eff.ID, store.EffectPending}}
		if state() != store.EffectPending || !slices.Equal(f.Writes(), want) {
			t.Fatalf("after the Within: %s, writes %v, want %v", state(), f.Writes(), want)
		}
	})
}

func injected(t *testing.T, f *Faults, op Op, n int) {
	t.Helper()
	if got := f.Injected(op); got != n {
		t.Fatalf("%s faults injected: %d, want %d", op, got, n)
	}
}
