package effects_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/connector"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/failures"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// Faults injected (storetest.Faults) into the outbox's own statements — the lease, the
// begin-mark pipeline, the grouped outcome statements — and into every transaction that
// puts an effect back into the queue or takes it out: each fails before it is made, or
// after it committed (its reply lost). Whatever falls where, every outcome is recorded
// exactly once, each event is written once, and nothing is sent twice.
//
// The fault suite, each test on every backend.
func TestGroupOutcomeFaultsRecordEachOutcomeOnce(t *testing.T) {
	apptest.EachEffects(t, testGroupOutcomeFaults)
}
func TestBeginMarkReplyLostIsLookedUpNeverResent(t *testing.T) {
	apptest.EachEffects(t, testBeginMarkReplyLost)
}
func TestBeginMarkFailedIsRequeued(t *testing.T) { apptest.EachEffects(t, testBeginMarkFailed) }
func TestBeginRestFailedStillSendsTheMarked(t *testing.T) {
	apptest.EachEffects(t, testBeginRestFailed)
}
func TestShutdownDuringTheBeginMarkStillSends(t *testing.T) {
	apptest.EachEffects(t, testShutdownDuringMark)
}
func TestReconcileStoreErrorLooksUpTheRest(t *testing.T) {
	apptest.EachEffects(t, testReconcileStoreError)
}
func TestLeaseReplyLostIsRequeued(t *testing.T) { apptest.EachEffects(t, testLeaseReplyLost) }
func TestLeaseThatBeganReplyLostIsResentOnce(t *testing.T) {
	apptest.EachEffects(t, testLeaseThatBeganReplyLost)
}
func TestSweepReplyLostChangesTheEffectOnce(t *testing.T) { apptest.EachEffects(t, testSweepReplyLost) }
func TestReconcileReplyLostAppliesOnce(t *testing.T)      { apptest.EachEffects(t, testReconcileReplyLost) }
func TestResolveReplyLostAppliesOnce(t *testing.T)        { apptest.EachEffects(t, testResolveReplyLost) }
func TestKillSwitchHoldReplyLostHoldsOnce(t *testing.T)   { apptest.EachEffects(t, testBlockReplyLost) }
func TestRequeueFailedReplyLostQueuesOnce(t *testing.T) {
	apptest.EachEffects(t, testRequeueFailedReplyLost)
}
func TestApprovalReplyLostQueuesOnce(t *testing.T)       { apptest.EachEffects(t, testApprovalReplyLost) }
func TestQueueReplyLostQueuesOnce(t *testing.T)          { apptest.EachEffects(t, testQueueReplyLost) }
func TestWorkerReplyLostNeverHandsOutTwice(t *testing.T) { apptest.EachEffects(t, testWorkerReplyLost) }
func TestFailedRunReplyLostCancelsOnce(t *testing.T)     { apptest.EachEffects(t, testFailedRunReplyLost) }

// rule fails the first call it matches, at when (with storetest.ErrInjected).
type rule struct {
	match func(c storetest.Call) bool
	when  storetest.When
	fired atomic.Bool
}

func on(op storetest.Op, when storetest.When) *rule {
	return &rule{match: func(c storetest.Call) bool { return c.Op == op && !c.InTx }, when: when}
}

// inTx is a rule on a call made inside a transaction.
func inTx(op storetest.Op, when storetest.When, match func(c storetest.Call) bool) *rule {
	return &rule{match: func(c storetest.Call) bool { return c.Op == op && c.InTx && (match == nil || match(c)) }, when: when}
}

// rules is an Injector of rules, each firing once.
func rules(rs ...*rule) storetest.Injector {
	return func(c storetest.Call) (storetest.When, error) {
		for _, r := range rs {
			if r.match(c) && r.fired.CompareAndSwap(false, true) {
				return r.when, nil
			}
		}
		return storetest.Pass, nil
	}
}

func allFired(t *testing.T, rs ...*rule) {
	t.Helper()
	for i, r := range rs {
		if !r.fired.Load() {
			t.Fatalf("fault %d never hit its call: the test did not test what it says", i)
		}
	}
}

// faultyService is an outbox service over f's wrapping of e.Store, logging into logs.
func faultyService(e *apptest.EffectsEnv, f *storetest.Faults, logs *apptest.LockedBuffer) *effects.Service {
	b := e.Base(f.Wrap(e.Store), e.Clock.Now)
	b.Log = slog.New(slog.NewJSONHandler(logs, nil))
	return e.NewServiceOn(b)
}

// holdGroup holds the recorder's first leader until n outcomes have queued, so the n are
// recorded as one group; then it calls armed (once).
func holdGroup(n int32, armed func()) func(string) {
	var queued atomic.Int32
	all := make(chan struct{})
	var once sync.Once
	return func(p string) {
		switch p {
		case "record_queued":
			if queued.Add(1) == n {
				close(all)
			}
		case "record_lead":
			once.Do(func() {
				select {
				case <-all:
				case <-time.After(10 * time.Second): // a deadline for a failing test
				}
				armed()
			})
		}
	}
}

func writesAre(t *testing.T, what string, got []storetest.Write, want ...storetest.Write) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s: committed writes %v, want %v", what, got, want)
	}
}

func lines(logs *apptest.LockedBuffer, msg string) int {
	return strings.Count(logs.String(), `"msg":"`+msg+`"`)
}

// A group of four Sent outcomes whose grouped statement fails, one way or another. Each
// case names the call that must have recorded every outcome: the fallback it drives.
//   - The group's outcome statements fail (PostgreSQL: the autocommit one and then the
//     transaction's batch; SQLite: the transaction's first update): each outcome is
//     recorded by the per-effect path (isolate: one savepoint each), in the same round.
//   - PostgreSQL's autocommit group statement fails: the group's transaction records them.
//   - Its reply is lost after it committed: the transaction that follows finds them
//     recorded and writes nothing more.
//   - The group transaction's commit reply is lost: isolate finds them recorded.
//   - isolate's own commit reply is lost: every outcome goes back to its sender's retry,
//     which finds it recorded.
func testGroupOutcomeFaults(t *testing.T, e *apptest.EffectsEnv) {
	_, pg := e.Store.(store.BatchQueries)
	completed := func(c storetest.Call) bool { return len(c.Updates) > 0 && c.Updates[0].To == store.EffectCompleted }
	type outcomeCase struct {
		name   string
		pgOnly bool
		// notCitus: the case needs the autocommit group statement to apply, which on a
		// Citus coordinator declines (its run locks would cross shards).
		notCitus bool
		rules    func() []*rule
		by       storetest.Op // the call that recorded each outcome
		retried  bool         // the outcomes went back to their senders' retry
		lost     bool         // the record after the lost reply found the outcomes recorded
	}
	cases := []outcomeCase{
		{name: "group statements fail", rules: func() []*rule {
			if pg {
				return []*rule{on(storetest.OpEffectUpdateManyLocked, storetest.Before), inTx(storetest.OpEffectUpdateMany, storetest.Before, nil)}
			}
			return []*rule{inTx(storetest.OpEffectUpdate, storetest.Before, completed)}
		}, by: storetest.OpEffectUpdate},
		{name: "autocommit group statement fails", pgOnly: true, rules: func() []*rule {
			return []*rule{on(storetest.OpEffectUpdateManyLocked, storetest.Before)}
		}, by: storetest.OpEffectUpdateMany},
		{name: "autocommit group statement's reply lost", pgOnly: true, notCitus: true, rules: func() []*rule {
			return []*rule{on(storetest.OpEffectUpdateManyLocked, storetest.After)}
		}, by: storetest.OpEffectUpdateManyLocked, lost: true},
		{name: "group transaction's reply lost", rules: func() []*rule {
			if pg {
				return []*rule{on(storetest.OpEffectUpdateManyLocked, storetest.Before), on(storetest.OpTransact, storetest.After)}
			}
			return []*rule{on(storetest.OpTransact, storetest.After)}
		}, by: map[bool]storetest.Op{true: storetest.OpEffectUpdateMany, false: storetest.OpEffectUpdate}[pg], lost: true},
		{name: "isolation's reply lost", rules: func() []*rule {
			if pg {
				return []*rule{on(storetest.OpEffectUpdateManyLocked, storetest.Before), inTx(storetest.OpEffectUpdateMany, storetest.Before, nil),
					on(storetest.OpWithin, storetest.After)}
			}
			return []*rule{inTx(storetest.OpEffectUpdate, storetest.Before, completed), on(storetest.OpWithin, storetest.After)}
		}, by: storetest.OpEffectUpdate, retried: true, lost: true},
	}
	for ci, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.pgOnly && !pg {
				t.Skip("SQLite has no batch statements: the group's transaction is its only grouped path")
			}
			if c.notCitus && os.Getenv("AIRLOCK_TEST_CITUS") == "1" {
				t.Skip("on Citus EffectUpdateManyLocked applies nothing (docs/scaling.md): the group's transaction records it")
			}
			var effs []store.Effect
			for i := range 4 {
				effs = append(effs, e.Queue(t, fmt.Sprintf("g%d-%d", ci, i), "note", "default", `{"n":1}`))
			}
			f := &storetest.Faults{}
			logs := &apptest.LockedBuffer{}
			svc := faultyService(e, f, logs)
			rs := c.rules()
			svc.Hook = holdGroup(4, func() { f.Set(rules(rs...)) })
			d := &effects.Dispatcher{Service: svc, BatchSize: 16, Concurrency: 16, Lease: 2 * time.Minute}
			if _, err := d.Tick(ctx); err != nil {
				t.Fatal(err)
			}
			allFired(t, rs...)
			for _, eff := range effs {
				got, _ := e.Effects.Get(ctx, eff.ID)
				if want := "p-" + effects.ProviderKey(eff); got.State != store.EffectCompleted || got.ProviderID != want {
					t.Errorf("%s: %s with provider id %q, want completed with %q", eff.RunKey, got.State, got.ProviderID, want)
				}
				apptest.Equal(t, "provider requests", e.Provider.Requests(effects.ProviderKey(eff)), 1)
				apptest.Equal(t, "events of "+eff.RunKey, e.Kinds(t, eff.RunKey)[2:], []string{"effect_completed"})
				writesAre(t, eff.RunKey, f.WritesOf(eff.ID),
					storetest.Write{Op: storetest.OpLeaseEffects, ID: eff.ID, To: store.EffectSending},
					storetest.Write{Op: storetest.OpBeginSends, ID: eff.ID, To: store.EffectSending},
					storetest.Write{Op: c.by, ID: eff.ID, To: store.EffectCompleted})
			}
			wantRetries := 0
			if c.retried {
				wantRetries = 4
			}
			apptest.Equal(t, "retries by the senders", lines(logs, "recording a dispatch outcome failed: retrying"), wantRetries)
			wantLost := 0
			if c.lost {
				wantLost = 4
			}
			apptest.Equal(t, "outcomes found recorded", lines(logs, "dispatch outcome not recorded"), wantLost)
		})
	}
}

// beginMarkLost leases and begin-marks eff through a dispatcher over new faults with the
// begin-mark's reply lost: the mark committed, the dispatcher does not know it, so it
// sends nothing.
func beginMarkLost(t *testing.T, e *apptest.EffectsEnv, eff store.Effect) *storetest.Faults {
	t.Helper()
	f := &storetest.Faults{}
	r := on(storetest.OpBeginSends, storetest.After)
	f.Set(rules(r))
	d := &effects.Dispatcher{Service: faultyService(e, f, &apptest.LockedBuffer{}), BatchSize: 1, Lease: 2 * time.Minute}
	_, err := d.Tick(ctx)
	apptest.Equal(t, "requests after the lost reply", e.Provider.Total(), 0)
	if !errors.Is(err, storetest.ErrInjected) {
		t.Fatalf("tick with the begin-mark's reply lost: %v, want the injected fault", err)
	}
	allFired(t, r)
	got, _ := e.Effects.Get(ctx, eff.ID)
	if got.State != store.EffectSending || got.SendStartedAt == nil {
		t.Fatalf("after the lost reply: %s, send started %v; want sending with the begin-mark committed", got.State, got.SendStartedAt)
	}
	writesAre(t, "lease and mark", f.WritesOf(eff.ID),
		storetest.Write{Op: storetest.OpLeaseEffects, ID: eff.ID, To: store.EffectSending},
		storetest.Write{Op: storetest.OpBeginSends, ID: eff.ID, To: store.EffectSending})
	return f
}

// The begin-mark pipeline's reply is lost after it committed: the dispatcher sent nothing
// (it cannot know the mark committed); past the lease the effect is unknown, the
// authoritative lookup finds nothing, and it is sent once — never resent on a guess. The
// lost-commit test does this with a real cut connection on PostgreSQL; this is the same
// path on both stores.
func testBeginMarkReplyLost(t *testing.T, e *apptest.EffectsEnv) {
	eff := e.Queue(t, "bm", "invoice", "default", `{"n":1}`)
	beginMarkLost(t, e, eff)
	e.Clock.Advance(3 * time.Minute)
	e.Tick(t) // sweeps: unknown
	apptest.Equal(t, "after the sweep", e.EffectState(t, eff.ID), store.EffectUnknown)
	apptest.Equal(t, "requests before the lookup", e.Provider.Total(), 0)
	confirmNone(t, e, e.Effects)
	apptest.Equal(t, "lookups", e.Provider.Lookups(), 2)
	e.Tick(t)
	e.Clock.Advance(time.Hour)
	e.Tick(t)
	if err := e.Effects.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "state", e.EffectState(t, eff.ID), store.EffectCompleted)
	apptest.Equal(t, "provider requests", e.Provider.Requests(effects.ProviderKey(eff)), 1)
	apptest.Equal(t, "events", e.Kinds(t, "bm")[2:], []string{"effect_unknown", "alert", "effect_reconciled", "effect_completed"})
}

// The begin-mark fails before it is made: nothing is marked or sent; past the lease the
// sweeper queues the effect again (it provably was not sent) and it goes out once.
func testBeginMarkFailed(t *testing.T, e *apptest.EffectsEnv) {
	eff := e.Queue(t, "bf", "invoice", "default", `{"n":1}`)
	f := &storetest.Faults{}
	r := on(storetest.OpBeginSends, storetest.Before)
	f.Set(rules(r))
	d := &effects.Dispatcher{Service: faultyService(e, f, &apptest.LockedBuffer{}), BatchSize: 1, Lease: 2 * time.Minute}
	_, err := d.Tick(ctx)
	apptest.Equal(t, "requests after the failed mark", e.Provider.Total(), 0)
	if !errors.Is(err, storetest.ErrInjected) {
		t.Fatalf("tick with the begin-mark failing: %v", err)
	}
	allFired(t, r)
	if got, _ := e.Effects.Get(ctx, eff.ID); got.State != store.EffectSending || got.SendStartedAt != nil {
		t.Fatalf("after the failed mark: %s, send started %v; want sending, not begun", got.State, got.SendStartedAt)
	}
	e.Clock.Advance(3 * time.Minute)
	e.Tick(t) // requeued, then sent
	e.Tick(t)
	apptest.Equal(t, "state", e.EffectState(t, eff.ID), store.EffectCompleted)
	apptest.Equal(t, "provider requests", e.Provider.Requests(effects.ProviderKey(eff)), 1)
	apptest.Equal(t, "lookups", e.Provider.Lookups(), 0)
	apptest.Equal(t, "events", e.Kinds(t, "bf")[2:], []string{"effect_requeued", "effect_completed"})
}

// The lease's reply is lost after it committed: the dispatcher sends nothing; past the
// lease the effect is queued again and goes out once.
func testLeaseReplyLost(t *testing.T, e *apptest.EffectsEnv) {
	eff := leaseReplyLost(t, e, "lr", "invoice")
	apptest.Equal(t, "leased, unbegun", eff.SendStartedAt == nil, true)
	e.Clock.Advance(3 * time.Minute)
	e.Tick(t)
	e.Tick(t)
	apptest.Equal(t, "state", e.EffectState(t, eff.ID), store.EffectCompleted)
	apptest.Equal(t, "provider requests", e.Provider.Requests(effects.ProviderKey(eff)), 1)
	apptest.Equal(t, "events", e.Kinds(t, "lr")[2:], []string{"effect_requeued", "effect_completed"})
}

// The lease of an idempotent type is its begin-mark too: with its reply lost the effect
// was begun by a sender that never sent. The sweeper takes it for a send that may have
// happened and, the provider honouring the key, queues it again: sent once, under its key.
func testLeaseThatBeganReplyLost(t *testing.T, e *apptest.EffectsEnv) {
	eff := leaseReplyLost(t, e, "lb", "crm")
	apptest.Equal(t, "leased, begun", eff.SendStartedAt != nil, true)
	e.Clock.Advance(3 * time.Minute)
	e.Tick(t) // the sweep: queued again, after the retry's backoff
	apptest.Equal(t, "state after the sweep", e.EffectState(t, eff.ID), store.EffectPending)
	e.Clock.Advance(time.Hour)
	e.Tick(t)
	apptest.Equal(t, "state", e.EffectState(t, eff.ID), store.EffectCompleted)
	apptest.Equal(t, "provider requests", e.Provider.Requests(effects.ProviderKey(eff)), 1)
	apptest.Equal(t, "events", e.Kinds(t, "lb")[2:], []string{"effect_retry_scheduled", "effect_completed"})
}

// leaseReplyLost queues an effect of action under key and has a dispatcher lease it with
// the lease's reply lost after it committed; it returns the effect as stored then, once
// a tick has shown that nobody takes it while the lease lives.
func leaseReplyLost(t *testing.T, e *apptest.EffectsEnv, key, action string) store.Effect {
	t.Helper()
	eff := e.Queue(t, key, action, "default", `{"n":1}`)
	f := &storetest.Faults{}
	r := on(storetest.OpLeaseEffects, storetest.After)
	f.Set(rules(r))
	d := &effects.Dispatcher{Service: faultyService(e, f, &apptest.LockedBuffer{}), BatchSize: 1, Lease: 2 * time.Minute}
	if _, err := d.Tick(ctx); !errors.Is(err, storetest.ErrInjected) {
		t.Fatalf("tick with the lease's reply lost: %v", err)
	}
	allFired(t, r)
	writesAre(t, "lease", f.WritesOf(eff.ID), storetest.Write{Op: storetest.OpLeaseEffects, ID: eff.ID, To: store.EffectSending})
	got, err := e.Effects.Get(ctx, eff.ID)
	if err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "state after the lease", got.State, store.EffectSending)
	e.Tick(t) // the lease is live: nobody else takes it
	apptest.Equal(t, "requests while the lost lease lives", e.Provider.Total(), 0)
	return got
}

// The sweeper's transaction commits and its reply is lost, for an unbegun effect (queued
// again) and a begun one (unknown): the sweep reports the failure, the next sweep finds
// nothing to do, each event is written once, and each effect is sent once in all.
func testSweepReplyLost(t *testing.T, e *apptest.EffectsEnv) {
	unbegun := e.Queue(t, "su", "invoice", "default", `{"n":1}`)
	f := &storetest.Faults{}
	lr := on(storetest.OpLeaseEffects, storetest.After) // leased, never begun
	f.Set(rules(lr))
	svc := faultyService(e, f, &apptest.LockedBuffer{})
	d := &effects.Dispatcher{Service: svc, BatchSize: 1, Lease: 2 * time.Minute}
	if _, err := d.Tick(ctx); !errors.Is(err, storetest.ErrInjected) {
		t.Fatalf("lease: %v", err)
	}
	begun := e.Queue(t, "sb", "invoice", "default", `{"n":2}`)
	beginMarkLost(t, e, begun)
	e.Clock.Advance(3 * time.Minute)
	for range 2 { // each sweep changes one effect, then fails: the other is left for the next
		r := on(storetest.OpTransact, storetest.After)
		f.Set(rules(r))
		if err := svc.SweepExpired(ctx); !errors.Is(err, storetest.ErrInjected) {
			t.Fatalf("sweep with its reply lost: %v", err)
		}
		allFired(t, r)
	}
	f.Set(nil)
	if err := svc.SweepExpired(ctx); err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "unbegun after the sweeps", e.EffectState(t, unbegun.ID), store.EffectPending)
	apptest.Equal(t, "begun after the sweeps", e.EffectState(t, begun.ID), store.EffectUnknown)
	e.Tick(t)
	confirmNone(t, e, e.Effects)
	e.Tick(t)
	for _, eff := range []store.Effect{unbegun, begun} {
		apptest.Equal(t, "state of "+eff.RunKey, e.EffectState(t, eff.ID), store.EffectCompleted)
		apptest.Equal(t, "requests of "+eff.RunKey, e.Provider.Requests(effects.ProviderKey(eff)), 1)
	}
	apptest.Equal(t, "events of the unbegun", e.Kinds(t, "su")[2:], []string{"effect_requeued", "effect_completed"})
	apptest.Equal(t, "events of the begun", e.Kinds(t, "sb")[2:], []string{"effect_unknown", "alert", "effect_reconciled", "effect_completed"})
}

// unknownEffect queues an effect whose send ends ambiguous (the provider answers 502
// once): unknown, due for reconciliation.
func unknownEffect(t *testing.T, e *apptest.EffectsEnv, key, action string) store.Effect {
	t.Helper()
	e.Provider.Reply = func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"p-%s"}`, r.Header.Get("Idempotency-Key"))
	}
	eff := e.Queue(t, key, action, "default", `{"n":1}`)
	e.Tick(t)
	apptest.Equal(t, "after the ambiguous send", e.EffectState(t, eff.ID), store.EffectUnknown)
	got, _ := e.Effects.Get(ctx, eff.ID)
	return got
}

// The transaction that applies a lookup's answer commits and its reply is lost, for a
// match (completed) and for an authoritative none (queued again): Reconcile reports the
// failure, the next finds nothing to do, the answer's event is written once, and the
// effect queued again is sent once.
func testReconcileReplyLost(t *testing.T, e *apptest.EffectsEnv) {
	found := unknownEffect(t, e, "rf", "invoice")
	e.Provider.Store(effects.ProviderKey(found), "rec-1")
	none := unknownEffect(t, e, "rn", "invoice")
	f := &storetest.Faults{}
	svc := faultyService(e, f, &apptest.LockedBuffer{})
	// The claim is the first transaction of a round, the answers the next ones.
	claim, answer := on(storetest.OpTransact, storetest.Pass), on(storetest.OpTransact, storetest.After)
	for range 2 {
		claim.fired.Store(false)
		answer.fired.Store(false)
		f.Set(rules(claim, answer))
		if err := svc.Reconcile(ctx); !errors.Is(err, storetest.ErrInjected) {
			t.Fatalf("reconcile with the answer's reply lost: %v", err)
		}
		allFired(t, answer)
		e.Clock.Advance(time.Hour) // the other claimed effect is due again
	}
	f.Set(nil)
	for range 2 {
		if err := svc.Reconcile(ctx); err != nil {
			t.Fatal(err)
		}
	}
	got, _ := e.Effects.Get(ctx, found.ID)
	apptest.Equal(t, "found", got.State, store.EffectCompleted)
	apptest.Equal(t, "its receipt", got.ProviderID, "rec-1")
	apptest.Equal(t, "none found", e.EffectState(t, none.ID), store.EffectPending)
	e.Tick(t)
	apptest.Equal(t, "sent again", e.EffectState(t, none.ID), store.EffectCompleted)
	apptest.Equal(t, "requests of the found", e.Provider.Requests(effects.ProviderKey(found)), 1)
	apptest.Equal(t, "requests of the none", e.Provider.Requests(effects.ProviderKey(none)), 2)
	apptest.Equal(t, "events of the found", e.Kinds(t, "rf")[2:], []string{"effect_unknown", "alert", "effect_reconciled"})
	apptest.Equal(t, "events of the none", e.Kinds(t, "rn")[2:], []string{"effect_unknown", "alert", "effect_reconciled", "effect_completed"})
}

// An operator's resolution commits and its reply is lost: the operator, told it failed,
// decides again on the version they saw and is refused (the effect changed); the effect
// is resolved once, and the one resolved not_sent is sent once.
func testResolveReplyLost(t *testing.T, e *apptest.EffectsEnv) {
	eff := unknownEffect(t, e, "rs", "note")
	f := &storetest.Faults{}
	svc := faultyService(e, f, &apptest.LockedBuffer{})
	r := on(storetest.OpTransact, storetest.After)
	f.Set(rules(r))
	res := effects.Resolution{Outcome: effects.OutcomeNotSent, Note: "checked: not there", Version: eff.Version}
	if _, err := svc.Resolve(ctx, eff.ID, res, "ops"); !errors.Is(err, storetest.ErrInjected) {
		t.Fatalf("resolve with its reply lost: %v", err)
	}
	allFired(t, r)
	if _, err := svc.Resolve(ctx, eff.ID, res, "ops"); !errors.Is(err, effects.ErrEffectChanged) {
		t.Fatalf("the operator's second try: %v, want ErrEffectChanged", err)
	}
	apptest.Equal(t, "resolved", e.EffectState(t, eff.ID), store.EffectPending)
	e.Tick(t)
	e.Tick(t)
	apptest.Equal(t, "state", e.EffectState(t, eff.ID), store.EffectCompleted)
	apptest.Equal(t, "requests", e.Provider.Requests(effects.ProviderKey(eff)), 2) // the ambiguous one, and this
	apptest.Equal(t, "events", e.Kinds(t, "rs")[2:], []string{"effect_unknown", "alert", "effect_resolved", "effect_completed"})
}

// The kill switch turned off between the lease and the begin-mark: the hold (back to
// pending, a send_blocked event) commits and its reply is lost. Nothing is sent while the
// switch is off, the hold is written once, and the effect goes out once when it is on.
func testBlockReplyLost(t *testing.T, e *apptest.EffectsEnv) {
	eff := e.Queue(t, "kb", "note", "default", `{"n":1}`)
	f := &storetest.Faults{}
	svc := faultyService(e, f, &apptest.LockedBuffer{})
	r := on(storetest.OpTransact, storetest.After)
	svc.Hook = apptest.HookOn("leased", func() {
		if err := e.Effects.SetKillSwitch(ctx, effects.GlobalScope, false, "incident", "ops"); err != nil {
			t.Error(err)
		}
		f.Set(rules(r))
	})
	d := &effects.Dispatcher{Service: svc, BatchSize: 1, Lease: 2 * time.Minute}
	_, err := d.Tick(ctx)
	apptest.Equal(t, "requests after the kill switch went off", e.Provider.Total(), 0)
	if !errors.Is(err, storetest.ErrInjected) {
		t.Fatalf("tick with the hold's reply lost: %v", err)
	}
	allFired(t, r)
	svc.Hook = nil
	got, _ := e.Effects.Get(ctx, eff.ID)
	apptest.Equal(t, "held", got.State, store.EffectPending)
	apptest.Equal(t, "attempts after the hold", got.Attempts, 0)
	apptest.Equal(t, "requests while off", e.Provider.Total(), 0)
	e.Clock.Advance(time.Hour)
	if err := e.Effects.SetKillSwitch(ctx, effects.GlobalScope, true, "over", "ops"); err != nil {
		t.Fatal(err)
	}
	e.Tick(t)
	apptest.Equal(t, "state", e.EffectState(t, eff.ID), store.EffectCompleted)
	apptest.Equal(t, "requests", e.Provider.Requests(effects.ProviderKey(eff)), 1)
	kinds := e.Kinds(t, "kb")[2:]
	apptest.Equal(t, "send_blocked events", strings.Count(strings.Join(kinds, " "), "send_blocked"), 1)
	apptest.Equal(t, "completions", strings.Count(strings.Join(kinds, " "), "effect_completed"), 1)
}

// An agent's partial_success report, which queues the run's failed writes again, commits
// and its reply is lost; the agent reports again (no Idempotency-Key: with one, the API
// replays the first answer). The failed effect is queued once and sent once more.
func testRequeueFailedReplyLost(t *testing.T, e *apptest.EffectsEnv) {
	e.Provider.Reply = func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			w.WriteHeader(http.StatusBadRequest) // refused: failed, definitely not performed
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"p-%s"}`, r.Header.Get("Idempotency-Key"))
	}
	eff := e.Queue(t, "rq", "invoice", "default", `{"n":1}`)
	e.Tick(t)
	apptest.Equal(t, "refused", e.EffectState(t, eff.ID), store.EffectFailed)
	f := &storetest.Faults{}
	fs, err := failures.New(e.Base(f.Wrap(e.Store), e.Clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	r := on(storetest.OpTransact, storetest.After)
	f.Set(rules(r))
	req := failures.FailureRequest{LeaseRequest: apptest.Lease(e.Current(t, "rq")), Class: policy.ClassPartialSuccess}
	if _, err := fs.Failure(ctx, req); !errors.Is(err, storetest.ErrInjected) {
		t.Fatalf("partial_success with its reply lost: %v", err)
	}
	allFired(t, r)
	apptest.Equal(t, "queued again", e.EffectState(t, eff.ID), store.EffectPending)
	d, err := fs.Failure(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "queued again by the second report", d.Requeued, 0)
	e.Tick(t)
	e.Tick(t)
	apptest.Equal(t, "state", e.EffectState(t, eff.ID), store.EffectCompleted)
	apptest.Equal(t, "sends", e.Provider.Requests(effects.ProviderKey(eff)), 2) // the refused one, and this
}

// A person's approval, which queues the held effect, commits and its reply is lost; they
// approve again: the link is used, and shows them their own decision. One effect is
// queued and sent once.
func testApprovalReplyLost(t *testing.T, e *apptest.EffectsEnv) {
	r := e.ClaimRun(t, "ap")
	sub, err := e.Effects.Submit(ctx, effects.QueueRequest{Key: "ap", Owner: r.LeaseOwner, Version: r.Version,
		ActionType: "email", Target: "default", Payload: json.RawMessage(`{"to":"a"}`), Actor: "apikey:wf"})
	if err != nil || sub.Approval == nil {
		t.Fatalf("gated submit: %+v %v", sub, err)
	}
	f := &storetest.Faults{}
	svc := e.NewApprovals(f.Wrap(e.Store), e.Clock.Now)
	rl := on(storetest.OpTransact, storetest.After)
	f.Set(rules(rl))
	lead := approvals.Person{Subject: "lead", Roles: []string{"support-lead"}}
	hash := approvals.HashToken(sub.Approval.Token)
	if _, err := svc.Decide(ctx, hash, approvals.Approve, "", lead); !errors.Is(err, storetest.ErrInjected) {
		t.Fatalf("approval with its reply lost: %v", err)
	}
	allFired(t, rl)
	if _, err := svc.Decide(ctx, hash, approvals.Approve, "", lead); !errors.Is(err, approvals.ErrNotFound) {
		t.Fatalf("the second approval: %v, want ErrNotFound (a used link)", err)
	}
	if a, err := svc.Closed(ctx, hash, lead); err != nil || a.ApproverSubject != "lead" {
		t.Fatalf("what the link shows them now: %+v %v; want their own decision", a, err)
	}
	effs, err := e.Effects.List(ctx, store.EffectListParams{RunKey: "ap"})
	if err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "effects queued", len(effs), 1)
	e.Tick(t)
	e.Tick(t)
	apptest.Equal(t, "state", e.EffectState(t, effs[0].ID), store.EffectCompleted)
	apptest.Equal(t, "sends", e.Provider.Requests(effects.ProviderKey(effs[0])), 1)
	kinds := strings.Join(e.Kinds(t, "ap"), " ")
	apptest.Equal(t, "effect_queued events", strings.Count(kinds, "effect_queued"), 1)
}

// An agent's queue of an effect commits and its reply is lost; the agent queues it again
// (the same effect id): it gets the first, and one effect is sent once.
func testQueueReplyLost(t *testing.T, e *apptest.EffectsEnv) {
	r := e.ClaimRun(t, "qr")
	f := &storetest.Faults{}
	svc := faultyService(e, f, &apptest.LockedBuffer{})
	rl := on(storetest.OpTransact, storetest.After)
	f.Set(rules(rl))
	req := effects.QueueRequest{Key: "qr", Owner: r.LeaseOwner, Version: r.Version, ActionType: "note", Target: "default",
		Payload: json.RawMessage(`{"n":1}`), Actor: "test"}
	if _, _, _, err := svc.Queue(ctx, req); !errors.Is(err, storetest.ErrInjected) {
		t.Fatalf("queue with its reply lost: %v", err)
	}
	allFired(t, rl)
	eff, created, _, err := svc.Queue(ctx, req)
	if err != nil || created {
		t.Fatalf("the agent's second queue: created %v, %v; want the first effect", created, err)
	}
	e.Tick(t)
	e.Tick(t)
	effs, err := e.Effects.List(ctx, store.EffectListParams{RunKey: "qr"})
	if err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "effects", len(effs), 1)
	apptest.Equal(t, "the second queue's answer", effs[0].ID, eff.ID)
	apptest.Equal(t, "state", effs[0].State, store.EffectCompleted)
	apptest.Equal(t, "sends", e.Provider.Requests(effects.ProviderKey(eff)), 1)
	apptest.Equal(t, "effect_queued events", strings.Count(strings.Join(e.Kinds(t, "qr"), " "), "effect_queued"), 1)
}

// An external worker's claim commits and its reply is lost: the worker never got the
// effect, but airlock cannot know that, so the effect is handed to no one else while the
// lease lives and is unknown (for a person) when it lapses — never handed out again on a
// guess. A worker's report that commits with its reply lost is recorded once; the
// worker's second report is told the lease is gone.
func testWorkerReplyLost(t *testing.T, e *apptest.EffectsEnv) {
	claimed := e.Queue(t, "wc", "task", "slack", `{"msg":"hi"}`)
	f := &storetest.Faults{}
	svc := faultyService(e, f, &apptest.LockedBuffer{})
	rl := on(storetest.OpTransact, storetest.After)
	f.Set(rules(rl))
	if _, _, err := svc.WorkerClaim(ctx, []string{"task"}, time.Minute, "w"); !errors.Is(err, storetest.ErrInjected) {
		t.Fatalf("claim with its reply lost: %v", err)
	}
	allFired(t, rl)
	if _, ok, err := svc.WorkerClaim(ctx, []string{"task"}, time.Minute, "w"); ok || err != nil {
		t.Fatalf("claimed again while the lost claim's lease lives: %v %v", ok, err)
	}
	e.Clock.Advance(2 * time.Minute)
	e.Tick(t)
	apptest.Equal(t, "after the lost claim's lease", e.EffectState(t, claimed.ID), store.EffectUnknown)
	if _, ok, err := svc.WorkerClaim(ctx, []string{"task"}, time.Minute, "w"); ok || err != nil {
		t.Fatalf("an unknown effect was handed out: %v %v", ok, err)
	}

	reported := e.Queue(t, "wr", "task", "slack", `{"msg":"again"}`)
	got, ok, err := svc.WorkerClaim(ctx, []string{"task"}, time.Minute, "w")
	if err != nil || !ok || got.ID != reported.ID {
		t.Fatalf("claim: %v %v %+v", ok, err, got)
	}
	rr := on(storetest.OpTransact, storetest.After)
	f.Set(rules(rr))
	res := connector.Result{Outcome: connector.Sent, ProviderID: "slack-ts-1"}
	if _, err := svc.WorkerReport(ctx, got.ID, got.LeaseOwner, res, "w"); !errors.Is(err, storetest.ErrInjected) {
		t.Fatalf("report with its reply lost: %v", err)
	}
	allFired(t, rr)
	if _, err := svc.WorkerReport(ctx, got.ID, got.LeaseOwner, res, "w"); !errors.Is(err, effects.ErrEffectLeaseLost) {
		t.Fatalf("the worker's second report: %v, want ErrEffectLeaseLost", err)
	}
	done, _ := e.Effects.Get(ctx, got.ID)
	if done.State != store.EffectCompleted || done.ProviderID != "slack-ts-1" {
		t.Fatalf("after the lost report: %s %q", done.State, done.ProviderID)
	}
	apptest.Equal(t, "events", e.Kinds(t, "wr")[2:], []string{"effect_claimed", "effect_completed"})
}

// A run ending failed_terminal takes its effects out of the queue: a pending one is
// cancelled with the run, a leased one at the begin-mark. Each transaction commits with
// its reply lost: the client's second transition is refused, each effect is cancelled
// once, and nothing is sent.
func testFailedRunReplyLost(t *testing.T, e *apptest.EffectsEnv) {
	pending := e.Queue(t, "fp", "note", "default", `{"n":1}`)
	f := &storetest.Faults{}
	rs, err := runs.New(e.Base(f.Wrap(e.Store), e.Clock.Now), apptest.LeaseConfig)
	if err != nil {
		t.Fatal(err)
	}
	rl := on(storetest.OpTransact, storetest.After)
	f.Set(rules(rl))
	req := runs.TransitionRequest{LeaseRequest: apptest.Lease(e.Current(t, "fp")), To: store.StateFailedTerminal}
	if _, err := rs.Transition(ctx, req); !errors.Is(err, storetest.ErrInjected) {
		t.Fatalf("transition with its reply lost: %v", err)
	}
	allFired(t, rl)
	if _, err := rs.Transition(ctx, req); !errors.Is(err, runs.ErrLeaseLost) && !errors.Is(err, runs.ErrVersionConflict) {
		t.Fatalf("the client's second transition: %v, want the lease or version refused", err)
	}
	apptest.Equal(t, "pending effect of the failed run", e.EffectState(t, pending.ID), store.EffectCancelled)
	apptest.Equal(t, "its events", e.Kinds(t, "fp")[2:], []string{"transition", "effect_cancelled"})

	leased := e.Queue(t, "fl", "note", "default", `{"n":2}`)
	r := e.Current(t, "fl")
	svc := faultyService(e, f, &apptest.LockedBuffer{})
	rc := on(storetest.OpTransact, storetest.After)
	svc.Hook = apptest.HookOn("leased", func() {
		if _, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: apptest.Lease(r), To: store.StateFailedTerminal}); err != nil {
			t.Error(err)
		}
		f.Set(rules(rc))
	})
	d := &effects.Dispatcher{Service: svc, BatchSize: 1, Lease: 2 * time.Minute}
	_, err = d.Tick(ctx)
	apptest.Equal(t, "requests", e.Provider.Total(), 0)
	if !errors.Is(err, storetest.ErrInjected) {
		t.Fatalf("tick with the cancel's reply lost: %v", err)
	}
	allFired(t, rc)
	svc.Hook = nil
	e.Clock.Advance(time.Hour)
	e.Tick(t)
	e.Tick(t)
	apptest.Equal(t, "leased effect of the failed run", e.EffectState(t, leased.ID), store.EffectCancelled)
	apptest.Equal(t, "its events", e.Kinds(t, "fl")[2:], []string{"transition", "effect_cancelled"})
	apptest.Equal(t, "requests in all", e.Provider.Total(), 0)
}

// confirmNone runs reconciliation twice, a settle window apart: an authoritative lookup's
// "none" queues an effect again only when it is confirmed (the second answer), both past
// the settle window of the ambiguous attempt (the caller has moved the clock past it).
func confirmNone(t *testing.T, e *apptest.EffectsEnv, s *effects.Service) {
	t.Helper()
	if err := s.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	e.Clock.Advance(e.Policy.Settle("invoice"))
	if err := s.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
}

// The batch mark takes part of a batch (the kill switch holds the other type), then the
// transaction for the rest fails: the marked effect is sent all the same — once marked, it
// is sent or it is a lookup's business, never left for a person — and every slot of the
// round is given back.
func testBeginRestFailed(t *testing.T, e *apptest.EffectsEnv) {
	e.Provider.SetReply(func(w http.ResponseWriter, r *http.Request, n int) {
		w.WriteHeader(http.StatusOK)
		fmt.Fprintf(w, `{"id":"p-%d"}`, n)
	})
	if err := e.Effects.SetKillSwitch(ctx, effects.ActionScope("ping"), false, "test", "ops"); err != nil {
		t.Fatal(err)
	}
	inv := e.Queue(t, "br-inv", "invoice", "default", `{"n":1}`)
	e.Queue(t, "br-ping", "ping", "default", `{"n":2}`)
	f := &storetest.Faults{}
	r := on(storetest.OpTransact, storetest.Before)
	f.Set(rules(r))
	d := &effects.Dispatcher{Service: faultyService(e, f, &apptest.LockedBuffer{}), BatchSize: 2, Concurrency: 2,
		Lease: 2 * time.Minute}
	if _, err := d.Tick(ctx); !errors.Is(err, storetest.ErrInjected) {
		t.Fatalf("tick with the rest's transaction failing: %v, want the injected fault", err)
	}
	allFired(t, r)
	apptest.Equal(t, "the marked invoice", e.EffectState(t, inv.ID), store.EffectCompleted)
	apptest.Equal(t, "its requests", e.Provider.Requests(effects.ProviderKey(inv)), 1)
	// Both slots are free again: two more invoices go out in one round.
	e.Queue(t, "br-2", "invoice", "default", `{"n":3}`)
	e.Queue(t, "br-3", "invoice", "default", `{"n":4}`)
	n, err := d.Tick(ctx)
	if err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "leased in the next round", n, 2)
}

// A clean shutdown (Run's context cancelled) arrives while the begin-mark is on its way:
// the mark is not cut off mid-statement (which could commit it and lose its reply, an
// effect that never left ending unknown), and what it marked is sent during the drain.
func testShutdownDuringMark(t *testing.T, e *apptest.EffectsEnv) {
	e.Provider.SetReply(func(w http.ResponseWriter, r *http.Request, n int) {
		w.WriteHeader(http.StatusOK)
		fmt.Fprintf(w, `{"id":"p-%d"}`, n)
	})
	eff := e.Queue(t, "sd", "invoice", "default", `{"n":1}`)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	f := &storetest.Faults{}
	var hit atomic.Bool
	f.Set(func(c storetest.Call) (storetest.When, error) {
		if c.Op == storetest.OpBeginSends && hit.CompareAndSwap(false, true) {
			stop() // SIGTERM, as the mark is being made
		}
		return storetest.Pass, nil
	})
	d := &effects.Dispatcher{Service: faultyService(e, f, &apptest.LockedBuffer{}), BatchSize: 1,
		Lease: 2 * time.Minute, Interval: 10 * time.Millisecond, Drain: 10 * time.Second}
	d.Run(runCtx)
	if !hit.Load() {
		t.Fatal("the begin-mark was never made: the test did not test what it says")
	}
	apptest.Equal(t, "state after the shutdown", e.EffectState(t, eff.ID), store.EffectCompleted)
	apptest.Equal(t, "requests", e.Provider.Requests(effects.ProviderKey(eff)), 1)
}

// A store error while applying one lookup's answer does not leave the rest of the claimed
// batch unlooked-up until their claims lapse (5 minutes): the round goes on, then reports
// the error; the failed one is looked up again once its claim lapses.
func testReconcileStoreError(t *testing.T, e *apptest.EffectsEnv) {
	e.Provider.SetReply(func(w http.ResponseWriter, r *http.Request, n int) {
		e.Provider.Store(r.Header.Get("Idempotency-Key"), fmt.Sprintf("rec-%d", n))
		w.WriteHeader(http.StatusBadGateway) // performed, answer lost: unknown
	})
	a := e.Queue(t, "rse-a", "note", "default", `{"n":1}`)
	b := e.Queue(t, "rse-b", "note", "default", `{"n":2}`)
	e.Tick(t)
	f := &storetest.Faults{}
	var transacts atomic.Int32
	f.Set(func(c storetest.Call) (storetest.When, error) {
		if c.Op == storetest.OpTransact && !c.InTx && transacts.Add(1) == 2 { // the first answer's
			return storetest.Before, nil
		}
		return storetest.Pass, nil
	})
	svc := faultyService(e, f, &apptest.LockedBuffer{})
	if err := svc.Reconcile(ctx); !errors.Is(err, storetest.ErrInjected) {
		t.Fatalf("reconcile with one answer's transaction failing: %v, want the injected fault", err)
	}
	apptest.Equal(t, "lookups in the round", e.Provider.Lookups(), 2)
	done := 0
	for _, eff := range []store.Effect{a, b} {
		if e.EffectState(t, eff.ID) == store.EffectCompleted {
			done++
		}
	}
	apptest.Equal(t, "answers applied", done, 1)
	e.Clock.Advance(6 * time.Minute) // the failed one's claim lapses
	reconcile(t, e.Effects)
	for _, eff := range []store.Effect{a, b} {
		apptest.Equal(t, "state of "+eff.RunKey, e.EffectState(t, eff.ID), store.EffectCompleted)
	}
}
