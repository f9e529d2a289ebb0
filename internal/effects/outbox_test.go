package effects_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// The outbox's promise under concurrency, crashes and faults: each test forces
// an interleaving that broke an earlier version, with hooks between statements.
func TestSweeperCannotRequeueABegunSend(t *testing.T) { apptest.EachEffects(t, testSweeperVsBegin) }
func TestBeginNeedsALiveLease(t *testing.T)           { apptest.EachEffects(t, testBeginNeedsLiveLease) }
func TestApprovedRunSettlesWhenEffectsFinishTogether(t *testing.T) {
	apptest.EachEffects(t, testSettleWriteSkew)
}
func TestCompleteAndQueueRace(t *testing.T)        { apptest.EachEffects(t, testCompleteQueueRace) }
func TestReconcileDoesNotStarve(t *testing.T)      { apptest.EachEffects(t, testReconcileNoStarvation) }
func TestShutdownDrainsInFlightSends(t *testing.T) { apptest.EachEffects(t, testShutdownDrains) }
func TestKillSwitchThatCommitsFirstWins(t *testing.T) {
	apptest.EachEffects(t, testKillSwitchCommitsFirst)
}
func TestOutcomeRecordingIsRetried(t *testing.T) { apptest.EachEffects(t, testRecordRetried) }
func TestFailedTerminalRunSendsNothing(t *testing.T) {
	apptest.EachEffects(t, testFailedTerminalSendsNothing)
}
func TestHangingProviderDoesNotDelayOtherTypes(t *testing.T) {
	apptest.EachEffects(t, testHangingProvider)
}
func TestRateCapsLeases(t *testing.T)       { apptest.EachEffects(t, testRateCap) }
func TestQueueWakesDispatcher(t *testing.T) { apptest.EachEffects(t, testQueueWakes) }

// Instance B's sweeper lists an effect whose lease it sees expired (its clock runs ahead)
// and not begun; instance A then begins and sends it; B's requeue must not apply.
func testSweeperVsBegin(t *testing.T, e *apptest.EffectsEnv) {
	eff := e.Queue(t, "k1", "note", "default", `{"n":1}`)
	b := e.NewService(e.Store, func() time.Time { return e.Clock.Now().Add(3 * time.Minute) })
	leased, proceed, sent, swept := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	e.Effects.Hook = func(p string) {
		switch p {
		case "leased":
			close(leased)
			<-proceed
		case "sent": // A has sent; it records the outcome only after B's sweep
			close(sent)
			<-swept
		}
	}
	done := make(chan error)
	go func() { _, err := e.Dispatcher.Tick(ctx); done <- err }()
	<-leased
	b.Hook = apptest.HookOn("sweep_listed", func() { close(proceed); <-sent })
	err := b.SweepExpired(ctx)
	close(swept)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	e.Effects.Hook, b.Hook = nil, nil
	e.Tick(t)
	apptest.Equal(t, "state", e.EffectState(t, eff.ID), store.EffectCompleted)
	apptest.Equal(t, "provider requests", e.Provider.Requests(effects.ProviderKey(eff)), 1)
}

// A lease that lapses between the lease and the begin-mark: the mark refuses, nothing is
// sent by that dispatcher, and the effect goes out once after the sweep.
func testBeginNeedsLiveLease(t *testing.T, e *apptest.EffectsEnv) {
	eff := e.Queue(t, "k1", "note", "default", `{"n":1}`)
	e.Effects.Hook = apptest.HookOn("leased", func() { e.Clock.Advance(3 * time.Minute) })
	e.Tick(t)
	e.Effects.Hook = nil
	apptest.Equal(t, "requests while the lease lapsed", e.Provider.Total(), 0)
	apptest.Equal(t, "state", e.EffectState(t, eff.ID), store.EffectSending)
	e.Tick(t) // sweeps (never begun: queued again), then sends
	e.Tick(t)
	apptest.Equal(t, "state", e.EffectState(t, eff.ID), store.EffectCompleted)
	apptest.Equal(t, "provider requests", e.Provider.Requests(effects.ProviderKey(eff)), 1)
}

// approvedRunWithTwoEffects: an ungated note queued, then a gated email approved: the run
// is approved with two open effects.
func approvedRunWithTwoEffects(t *testing.T, e *apptest.EffectsEnv, key string) {
	t.Helper()
	e.Queue(t, key, "note", "default", `{"n":1}`)
	r := e.Current(t, key)
	sub, err := e.Effects.Submit(ctx, effects.QueueRequest{Key: key, Owner: r.LeaseOwner, Version: r.Version,
		ActionType: "email", Target: "default", Payload: json.RawMessage(`{"to":"a"}`), Actor: "apikey:wf"})
	if err != nil || sub.Approval == nil {
		t.Fatalf("gated submit: %+v %v", sub, err)
	}
	if _, err := e.Approvals.Decide(ctx, approvals.HashToken(sub.Approval.Token), approvals.Approve, "",
		approvals.Person{Subject: "lead", Roles: []string{"support-lead"}}); err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "run", e.Current(t, key).State, store.StateApproved)
}

// Two effects of one approved run finish at once in two instances: each must not see the
// other still open (write skew), or the run stays approved forever.
func testSettleWriteSkew(t *testing.T, e *apptest.EffectsEnv) {
	approvedRunWithTwoEffects(t, e, "k1")
	// Two instances, one effect each; whoever counts first waits (up to 300 ms) for the
	// other to count too. Holding the run's lock, the other cannot.
	var arrived atomic.Int32
	barrier := func() {
		arrived.Add(1)
		for i := 0; i < 60 && arrived.Load() < 2; i++ {
			time.Sleep(5 * time.Millisecond)
		}
	}
	var wg sync.WaitGroup
	for i := range 2 {
		svc := e.NewService(e.Store, e.Clock.Now)
		svc.Hook = apptest.HookOn("settle_counted", barrier)
		d := &effects.Dispatcher{Service: svc, BatchSize: 1, Lease: 2 * time.Minute}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each takes one effect; a lease may find the other's candidate still locked
			// by the first lease statement, so it tries again.
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
				n, err := d.Tick(ctx)
				if err != nil {
					t.Errorf("dispatcher %d: %v", i, err)
				}
				if n > 0 || err != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	apptest.Equal(t, "requests", e.Provider.Total(), 2)
	apptest.Equal(t, "run", e.Current(t, "k1").State, store.StateCompleted)
}

// A client completes its run while (under the same lease) it queues an effect: either the
// effect is refused or the completion is; never a completed run with a pending effect.
func testCompleteQueueRace(t *testing.T, e *apptest.EffectsEnv) {
	r := e.ClaimRun(t, "k1")
	queued := make(chan error, 1)
	e.Runs.Hook = apptest.HookOn("complete_counted", func() {
		go func() {
			_, _, _, err := e.Effects.Queue(ctx, effects.QueueRequest{Key: "k1", Owner: r.LeaseOwner, Version: r.Version,
				ActionType: "note", Target: "default", Payload: json.RawMessage(`{"n":1}`), Actor: "test"})
			queued <- err
		}()
		select { // give the queue every chance to slip in between count and transition
		case err := <-queued:
			queued <- err
		case <-time.After(300 * time.Millisecond):
		}
	})
	_, cerr := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: apptest.Lease(r), To: store.StateCompleted})
	qerr := <-queued
	e.Runs.Hook = nil
	effs, err := e.Effects.List(ctx, store.EffectListParams{RunKey: "k1"})
	if err != nil {
		t.Fatal(err)
	}
	state := e.Current(t, "k1").State
	if state == store.StateCompleted && len(effs) > 0 {
		t.Fatalf("run completed with %d effect(s) queued (complete: %v, queue: %v)", len(effs), cerr, qerr)
	}
	if (cerr == nil) == (qerr == nil) {
		t.Fatalf("exactly one of complete (%v) and queue (%v) should win", cerr, qerr)
	}
}

// 100 unknown effects that no lookup can settle must not stop a newer one from being
// reconciled.
func testReconcileNoStarvation(t *testing.T, e *apptest.EffectsEnv) {
	e.Provider.Reply = func(w http.ResponseWriter, _ *http.Request, _ int) { w.WriteHeader(http.StatusInternalServerError) }
	d := &effects.Dispatcher{Service: e.Effects, BatchSize: 200, Concurrency: 200, Lease: 2 * time.Minute}
	for i := range 100 {
		e.Queue(t, fmt.Sprintf("old-%03d", i), "note", "default", `{"n":1}`)
	}
	drain := func() {
		for {
			n, err := d.Tick(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				return
			}
		}
	}
	drain()
	e.Clock.Advance(time.Second)
	newest := e.Queue(t, "new", "note", "default", `{"n":1}`)
	drain()
	unknown, err := e.Effects.List(ctx, store.EffectListParams{States: []store.EffectState{store.EffectUnknown}})
	if err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "unknown effects", len(unknown), 101)
	e.Provider.Store(effects.ProviderKey(newest), "p-new")
	for range 3 {
		if err := e.Effects.Reconcile(ctx); err != nil {
			t.Fatal(err)
		}
	}
	apptest.Equal(t, "newest", e.EffectState(t, newest.ID), store.EffectCompleted)
}

// Stopping a dispatcher mid-send lets the send finish and records its outcome.
func testShutdownDrains(t *testing.T, e *apptest.EffectsEnv) {
	release := make(chan struct{})
	e.Provider.Reply = func(w http.ResponseWriter, r *http.Request, _ int) {
		<-release
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"id":"p-1"}`)
	}
	eff := e.Queue(t, "k1", "note", "default", `{"n":1}`)
	d := &effects.Dispatcher{Service: e.Effects, Lease: 2 * time.Minute, Interval: 10 * time.Millisecond, Drain: 10 * time.Second}
	runCtx, stop := context.WithCancel(ctx)
	stopped := make(chan struct{})
	go func() { d.Run(runCtx); close(stopped) }()
	apptest.WaitFor(t, "the send to reach the provider", func() bool { return e.Provider.Total() == 1 })
	stop()
	time.Sleep(50 * time.Millisecond) // shutdown is under way while the provider answers
	close(release)
	<-stopped
	apptest.Equal(t, "state after shutdown", e.EffectState(t, eff.ID), store.EffectCompleted)
}

// A disable that commits while a dispatcher is about to begin a send wins: the send waits
// for the switch and sees it off.
func testKillSwitchCommitsFirst(t *testing.T, e *apptest.EffectsEnv) {
	eff := e.Queue(t, "k1", "note", "default", `{"n":1}`)
	folded := e.Queue(t, "k2", "crm", "default", `{"n":2}`) // idempotent: the lease is its begin-mark
	other := e.NewService(e.Store, e.Clock.Now)
	ticked := make(chan error, 1)
	other.Hook = apptest.HookOn("kill_switch_written", func() {
		go func() { _, err := e.Dispatcher.Tick(ctx); ticked <- err }()
		select { // the disable is written, not committed: give the dispatcher time to slip past it
		case err := <-ticked:
			ticked <- err
		case <-time.After(300 * time.Millisecond):
		}
	})
	if err := other.SetKillSwitch(ctx, effects.GlobalScope, false, "incident", "ops"); err != nil {
		t.Fatal(err)
	}
	if err := <-ticked; err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "requests after a disable committed", e.Provider.Total(), 0)
	apptest.Equal(t, "state", e.EffectState(t, eff.ID), store.EffectPending)
	apptest.Equal(t, "state of the idempotent type's", e.EffectState(t, folded.ID), store.EffectPending)
}

// flaky fails the next n transactions and statements that commit on their own (the
// lease, the begin-mark, the batch outcome statement), as a database restart would.
type flaky struct {
	fail   atomic.Int32
	faults storetest.Faults
}

// newFlaky returns the counter and st behind it.
func newFlaky(st store.Store) (*flaky, store.Store) {
	f := &flaky{}
	f.faults.Set(func(c storetest.Call) (storetest.When, error) {
		if !c.InTx && f.fail.Add(-1) >= 0 {
			return storetest.Before, errors.New("connection reset by peer")
		}
		return storetest.Pass, nil
	})
	return f, f.faults.Wrap(st)
}

// The provider answered 2xx, then recording the outcome failed twice: the outcome is
// kept and recorded, never dropped to unknown.
func testRecordRetried(t *testing.T, e *apptest.EffectsEnv) {
	eff := e.Queue(t, "k1", "note", "default", `{"n":1}`)
	flaky, st := newFlaky(e.Store)
	svc := e.NewService(st, e.Clock.Now)
	svc.Hook = apptest.HookOn("sent", func() { flaky.fail.Store(2) })
	d := &effects.Dispatcher{Service: svc, Lease: 2 * time.Minute}
	if _, err := d.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "state", e.EffectState(t, eff.ID), store.EffectCompleted)
	apptest.Equal(t, "requests", e.Provider.Total(), 1)
}

// Effects of a run that ends failed_terminal never leave: pending ones are cancelled with
// the run, and one already leased but not begun is cancelled at the begin-mark.
func testFailedTerminalSendsNothing(t *testing.T, e *apptest.EffectsEnv) {
	pending := e.Queue(t, "k1", "note", "default", `{"n":1}`)
	r := e.Current(t, "k1")
	if _, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: apptest.Lease(r), To: store.StateFailedTerminal}); err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "pending effect of a failed run", e.EffectState(t, pending.ID), store.EffectCancelled)
	e.Tick(t)

	leased := e.Queue(t, "k2", "note", "default", `{"n":2}`)
	r = e.Current(t, "k2")
	e.Effects.Hook = apptest.HookOn("leased", func() {
		if _, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: apptest.Lease(r), To: store.StateFailedTerminal}); err != nil {
			t.Error(err)
		}
	})
	e.Tick(t)
	e.Effects.Hook = nil
	apptest.Equal(t, "leased effect of a failed run", e.EffectState(t, leased.ID), store.EffectCancelled)
	apptest.Equal(t, "requests", e.Provider.Total(), 0)
	apptest.Equal(t, "events", e.Kinds(t, "k2")[2:], []string{"transition", "effect_cancelled"})
}

// A provider that hangs holds at most its type's max_in_flight; another type's effects
// still go out meanwhile.
func testHangingProvider(t *testing.T, e *apptest.EffectsEnv) {
	hang := make(chan struct{})
	defer close(hang)
	e.Provider.Reply = func(w http.ResponseWriter, r *http.Request, _ int) {
		if r.URL.Path == "/notes" {
			select {
			case <-hang:
			case <-r.Context().Done():
			}
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"id":"p"}`)
	}
	for i := range 40 {
		e.Queue(t, fmt.Sprintf("slow-%d", i), "note", "default", `{"n":1}`)
	}
	var fast []store.Effect
	for i := range 5 {
		fast = append(fast, e.Queue(t, fmt.Sprintf("fast-%d", i), "crm", "default", `{"n":1}`))
	}
	d := &effects.Dispatcher{Service: e.Effects, Concurrency: 32, Lease: 2 * time.Minute, Interval: 10 * time.Millisecond, Drain: time.Millisecond}
	runCtx, stop := context.WithCancel(ctx)
	stopped := make(chan struct{})
	go func() { d.Run(runCtx); close(stopped) }()
	defer func() { stop(); <-stopped }()
	apptest.WaitFor(t, "the other type's effects while one provider hangs", func() bool {
		for _, f := range fast {
			if e.EffectState(t, f.ID) != store.EffectCompleted {
				return false
			}
		}
		return true
	})
	sending, err := e.Effects.List(ctx, store.EffectListParams{States: []store.EffectState{store.EffectSending}})
	if err != nil {
		t.Fatal(err)
	}
	if max := e.Policy.Action("note").MaxInFlight; len(sending) > max || e.Provider.Total() > max+len(fast) {
		t.Fatalf("%d sending, %d requests: more than note's max_in_flight %d", len(sending), e.Provider.Total(), max)
	}
}

// A rate-capped type is leased only as fast as its tokens allow.
func testRateCap(t *testing.T, e *apptest.EffectsEnv) {
	for i := range 6 {
		e.Queue(t, fmt.Sprintf("k%d", i), "ping", "default", `{"n":1}`)
	}
	d := &effects.Dispatcher{Service: e.Effects, Lease: 2 * time.Minute}
	n, err := d.Tick(ctx)
	if err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "leased at once under rate 2/s (burst 2)", n, 2)
	n, err = d.Tick(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n > 1 {
		t.Fatalf("leased %d right after the burst", n)
	}
}

// An effect queued in this instance wakes its dispatcher: with the poll an hour apart it
// is still sent at once. On PostgreSQL, one queued through another instance wakes it too
// (LISTEN/NOTIFY).
func testQueueWakes(t *testing.T, e *apptest.EffectsEnv) {
	d := &effects.Dispatcher{Service: e.Effects, Lease: 2 * time.Minute, Interval: time.Hour}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	stopped := make(chan struct{})
	go func() { d.Run(runCtx); close(stopped) }()
	defer func() { stop(); <-stopped }()
	time.Sleep(50 * time.Millisecond) // the first round (and LISTEN) has begun
	local := e.Queue(t, "k1", "note", "default", `{"n":1}`)
	apptest.WaitFor(t, "a locally queued effect to be sent", func() bool { return e.EffectState(t, local.ID) == store.EffectCompleted })
	// An approval that puts its effect into the outbox wakes the dispatcher too.
	r := e.ClaimRun(t, "k3")
	sub, err := e.Effects.Submit(ctx, effects.QueueRequest{Key: "k3", Owner: r.LeaseOwner, Version: r.Version,
		ActionType: "email", Target: "default", Payload: json.RawMessage(`{"to":"a"}`), Actor: "apikey:wf"})
	if err != nil || sub.Approval == nil {
		t.Fatalf("gated submit: %+v %v", sub, err)
	}
	if _, err := e.Approvals.Decide(ctx, approvals.HashToken(sub.Approval.Token), approvals.Approve, "",
		approvals.Person{Subject: "lead", Roles: []string{"support-lead"}}); err != nil {
		t.Fatal(err)
	}
	apptest.WaitFor(t, "an approved effect to be sent", func() bool { return e.Current(t, "k3").State == store.StateCompleted })
	if e.Store.Backend() != "postgres" {
		return // other processes on one SQLite file find effects by polling
	}
	other := e.NewService(e.Store, e.Clock.Now)
	r = e.ClaimRun(t, "k2")
	eff, _, _, err := other.Queue(ctx, effects.QueueRequest{Key: "k2", Owner: r.LeaseOwner, Version: r.Version,
		ActionType: "note", Target: "default", Payload: json.RawMessage(`{"n":2}`), Actor: "test"})
	if err != nil {
		t.Fatal(err)
	}
	apptest.WaitFor(t, "an effect queued by another instance to be sent", func() bool { return e.EffectState(t, eff.ID) == store.EffectCompleted })
}
