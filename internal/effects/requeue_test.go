package effects_test

import (
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
	"github.com/airlockhq/airlock/internal/ledger"
	"github.com/airlockhq/airlock/internal/store"
)

// Every path that makes an effect sendable again, each with a stale writer forced against
// it. The census (census_test.go) finds every such path in the code and fails
// when one has no entry here or in outbox_test.go: a new way back into the queue comes with
// the test that tries to break it.
func TestStaleReconcileAnswerLoses(t *testing.T) { apptest.EachEffects(t, testStaleReconcileAnswer) }
func TestTwoInstancesNeverLookUpTheSameEffect(t *testing.T) {
	apptest.EachEffects(t, testReconcileClaim)
}
func TestLookupInFlightLosesToAnOperator(t *testing.T) { apptest.EachEffects(t, testLookupVsOperator) }
func TestOperatorDecisionOnAChangedEffectIsRefused(t *testing.T) {
	apptest.EachEffects(t, testResolveChangedVersion)
}
func TestUnfencedRequeueIsRefused(t *testing.T)     { apptest.EachEffects(t, testUnfencedRequeue) }
func TestCheckLaterLeavesAMovedEffect(t *testing.T) { apptest.EachEffects(t, testCheckLaterMoved) }
func TestStaleRetryOutcomeLoses(t *testing.T)       { apptest.EachEffects(t, testStaleRetryOutcome) }
func TestAgentReconcileNeedsTheLease(t *testing.T)  { apptest.EachEffects(t, testAgentReconcileStale) }
func TestApprovalDecidedTwiceQueuesOnce(t *testing.T) {
	apptest.EachEffects(t, testApprovalDecidedTwice)
}
func TestRequeueFailedOnlyTakesFailed(t *testing.T) {
	apptest.EachEffects(t, testRequeueFailedOnlyTakesFailed)
}

// lossyAfterStore makes the provider lose the first send of each key and store every
// later one while still answering 500: each send ends unknown, and only an honest lookup
// tells the two apart. Its lookup is authoritative (invoice).
func lossyAfterStore(p *apptest.Provider) {
	p.Reply = func(w http.ResponseWriter, r *http.Request, n int) {
		if n > 1 {
			p.Store(r.Header.Get("Idempotency-Key"), fmt.Sprintf("rec-%d", n))
		}
		w.WriteHeader(http.StatusInternalServerError)
	}
}

// holdLookup makes the next lookup's answer wait until release is called: it was read
// when the lookup arrived, so it is stale by the time it is applied.
func holdLookup(p *apptest.Provider) (held <-chan struct{}, release func()) {
	h, r := make(chan struct{}), make(chan struct{})
	var once sync.Once
	p.SetLookup(func(string) {
		first := false
		once.Do(func() { first = true })
		if first {
			close(h)
			<-r
		}
	})
	return h, sync.OnceFunc(func() { close(r) })
}

// reconcileHeld starts instance A's reconciliation and returns once its first lookup's
// answer is held; release lets the answer through, done reports Reconcile's end.
func reconcileHeld(e *apptest.EffectsEnv) (release func(), done <-chan error) {
	held, release := holdLookup(e.Provider)
	d := make(chan error, 1)
	go func() { d <- e.Effects.Reconcile(ctx) }()
	<-held
	return release, d
}

func tickWith(t *testing.T, d *effects.Dispatcher) {
	t.Helper()
	if _, err := d.Tick(ctx); err != nil {
		t.Fatal(err)
	}
}

func reconcile(t *testing.T, s *effects.Service) {
	t.Helper()
	if err := s.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
}

// noneOnce moves the clock past the settle window of an unknown invoice's send and
// reconciles: the first "none" that counts. The clock then moves a settle window on, so
// the next "none" queues it again.
func noneOnce(t *testing.T, e *apptest.EffectsEnv) {
	t.Helper()
	e.Clock.Advance(e.Policy.Settle("invoice"))
	reconcile(t, e.Effects)
	e.Clock.Advance(e.Policy.Settle("invoice"))
}

// unknownInvoice queues one invoice whose first send the provider loses: unknown.
func unknownInvoice(t *testing.T, e *apptest.EffectsEnv, key string) store.Effect {
	t.Helper()
	lossyAfterStore(e.Provider)
	eff := e.Queue(t, key, "invoice", "default", `{"amount":10}`)
	e.Tick(t)
	apptest.Equal(t, "after the lost send", e.EffectState(t, eff.ID), store.EffectUnknown)
	return eff
}

// Instance A looks the effect up and gets "none"; before A applies it, its claim lapses
// (B's clock is past it), B looks up, queues it again, and the resend is stored but ends
// unknown (500). A's "none" is about the first send: applying it would send a second copy.
func testStaleReconcileAnswer(t *testing.T, e *apptest.EffectsEnv) {
	eff := unknownInvoice(t, e, "k1")
	key := effects.ProviderKey(eff)
	release, done := reconcileHeld(e)
	defer release()

	b := e.NewService(e.Store, func() time.Time { return e.Clock.Now().Add(10 * time.Minute) })
	bd := &effects.Dispatcher{Service: b, BatchSize: 16, Lease: 2 * time.Minute, Interval: 10 * time.Millisecond}
	reconcile(t, b) // none, past the settle window: asked again a settle window later
	e.Clock.Advance(e.Policy.Settle("invoice"))
	reconcile(t, b) // none again: queued again
	tickWith(t, bd) // resent: stored, 500: unknown again
	apptest.Equal(t, "stored after B's resend", e.Provider.Stored(key), 1)
	apptest.Equal(t, "unknown again", e.EffectState(t, eff.ID), store.EffectUnknown)

	release() // A's stale "none" arrives
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	tickWith(t, bd)
	tickWith(t, bd)
	apptest.Equal(t, "records at the provider", e.Provider.Stored(key), 1)
	apptest.Equal(t, "sends", e.Provider.Requests(key), 2)

	// A fresh lookup, once due, finds the one record.
	c := e.NewService(e.Store, func() time.Time { return e.Clock.Now().Add(time.Hour) })
	reconcile(t, c)
	got, err := e.Effects.Get(ctx, eff.ID)
	if err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "state", got.State, store.EffectCompleted)
	apptest.Equal(t, "receipt", got.ProviderID, "rec-2")
}

// While A holds its claim mid-lookup, B (same clock) finds nothing to look up.
func testReconcileClaim(t *testing.T, e *apptest.EffectsEnv) {
	eff := unknownInvoice(t, e, "k1")
	noneOnce(t, e)
	release, done := reconcileHeld(e)
	defer release()
	b := e.NewService(e.Store, e.Clock.Now)
	reconcile(t, b)
	apptest.Equal(t, "lookups while A holds the claim", e.Provider.Lookups(), 2)
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "queued again by A", e.EffectState(t, eff.ID), store.EffectPending)
	// Many instances at once: each due effect is looked up exactly once.
	for i := range 6 {
		unknownInvoice(t, e, fmt.Sprintf("m%d", i))
	}
	before := e.Provider.Lookups()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		s := e.NewService(e.Store, e.Clock.Now)
		wg.Go(func() { errs <- s.Reconcile(ctx) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// k1 was resent by the first tick above (stored, 500): it is due again too.
	apptest.Equal(t, "lookups by 4 instances of 7 due effects", e.Provider.Lookups()-before, 7)
	apptest.Equal(t, "k1 found at the provider", e.EffectState(t, eff.ID), store.EffectCompleted)
}

// One instance: a lookup is in flight when an operator resolves the effect as not sent;
// it is resent (stored, 500: unknown); then the lookup's stale "none" arrives.
func testLookupVsOperator(t *testing.T, e *apptest.EffectsEnv) {
	eff := unknownInvoice(t, e, "k1")
	key := effects.ProviderKey(eff)
	release, done := reconcileHeld(e)
	defer release()
	if _, err := e.Effects.Resolve(ctx, eff.ID, effects.Resolution{Outcome: effects.OutcomeNotSent,
		Note: "not in the provider's list"}, "cli:ana"); err != nil {
		t.Fatal(err)
	}
	e.Tick(t)
	apptest.Equal(t, "unknown after the resend", e.EffectState(t, eff.ID), store.EffectUnknown)
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	e.Tick(t)
	e.Tick(t)
	apptest.Equal(t, "records at the provider", e.Provider.Stored(key), 1)
	apptest.Equal(t, "sends", e.Provider.Requests(key), 2)
}

// Two operators look at the same unknown effect; the first says not sent, it is resent and
// is unknown again; the second's "not sent", decided on what they saw before, is refused.
func testResolveChangedVersion(t *testing.T, e *apptest.EffectsEnv) {
	eff := unknownInvoice(t, e, "k1")
	key := effects.ProviderKey(eff)
	seen, err := e.Effects.Get(ctx, eff.ID)
	if err != nil {
		t.Fatal(err)
	}
	first := effects.Resolution{Outcome: effects.OutcomeNotSent, Note: "checked", Version: seen.Version}
	if _, err := e.Effects.Resolve(ctx, eff.ID, first, "console:ana"); err != nil {
		t.Fatal(err)
	}
	e.Tick(t)
	apptest.Equal(t, "unknown again", e.EffectState(t, eff.ID), store.EffectUnknown)
	_, err = e.Effects.Resolve(ctx, eff.ID, first, "console:bo")
	if !errors.Is(err, effects.ErrEffectChanged) {
		t.Fatalf("a decision on version %d after the effect moved on: %v", seen.Version, err)
	}
	e.Tick(t)
	apptest.Equal(t, "records", e.Provider.Stored(key), 1)
	apptest.Equal(t, "sends", e.Provider.Requests(key), 2)
	now, _ := e.Effects.Get(ctx, eff.ID)
	if now.Version <= seen.Version {
		t.Fatalf("version did not move: %d then %d", seen.Version, now.Version)
	}
	// On the version it is now, the decision applies.
	if _, err := e.Effects.Resolve(ctx, eff.ID, effects.Resolution{Outcome: effects.OutcomeSent, ProviderID: "rec-2",
		Note: "found it", Version: now.Version}, "console:bo"); err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "resolved", e.EffectState(t, eff.ID), store.EffectCompleted)
}

// The store refuses an update to pending or planned that names neither the lease nor the
// version it decided on, on every backend.
func testUnfencedRequeue(t *testing.T, e *apptest.EffectsEnv) {
	eff := unknownInvoice(t, e, "k1")
	for _, to := range []store.EffectState{store.EffectPending, store.EffectPlanned} {
		err := e.Store.Transact(ctx, func(q store.Queries) error {
			_, err := q.EffectUpdate(ctx, store.EffectUpdateParams{ID: eff.ID, From: []store.EffectState{store.EffectUnknown}, To: to})
			return err
		})
		if !errors.Is(err, store.ErrUnfenced) {
			t.Fatalf("unfenced update to %s: %v", to, err)
		}
	}
	got, _ := e.Effects.Get(ctx, eff.ID)
	err := e.Store.Transact(ctx, func(q store.Queries) error {
		_, err := q.EffectUpdate(ctx, store.EffectUpdateParams{ID: eff.ID, From: []store.EffectState{store.EffectUnknown},
			To: store.EffectPending, Version: got.Version - 1})
		return err
	})
	if !errors.Is(err, store.ErrNoMatch) {
		t.Fatalf("update on a past version: %v", err)
	}
	apptest.Equal(t, "still unknown", e.EffectState(t, eff.ID), store.EffectUnknown)
}

// A check-later for a version the effect has left changes nothing.
func testCheckLaterMoved(t *testing.T, e *apptest.EffectsEnv) {
	eff := unknownInvoice(t, e, "k1")
	got, _ := e.Effects.Get(ctx, eff.ID)
	err := e.Store.Transact(ctx, func(q store.Queries) error {
		return q.EffectCheckLater(ctx, eff.ID, got.Version-1, e.Clock.Now().Add(time.Hour))
	})
	if !errors.Is(err, store.ErrNoMatch) {
		t.Fatalf("check later on a past version: %v", err)
	}
	after, _ := e.Effects.Get(ctx, eff.ID)
	apptest.Equal(t, "checks", after.Checks, got.Checks)
	apptest.Equal(t, "version", after.Version, got.Version)
	if after.NextCheckAt != nil {
		t.Fatalf("next check moved: %v", after.NextCheckAt)
	}
}

// A dispatcher's retryable outcome, recorded after its lease was swept and the effect
// leased and sent by another, does not queue it again: the owner is the lease's own.
func testStaleRetryOutcome(t *testing.T, e *apptest.EffectsEnv) {
	eff := e.Queue(t, "k1", "note", "default", `{"n":1}`) // note: 3 attempts
	sent, proceed := make(chan struct{}), make(chan struct{})
	e.Provider.Reply = func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable) // retryable: would be queued again
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"id":"p-2"}`)
	}
	e.Effects.Hook = apptest.HookOn("sent", func() { close(sent); <-proceed })
	done := make(chan error, 1)
	go func() { _, err := e.Dispatcher.Tick(ctx); done <- err }()
	<-sent
	// A's lease lapses: B (clock past it) sweeps it unknown... it was begun, so unknown;
	// an operator says not sent; B sends it: completed.
	b := e.NewService(e.Store, func() time.Time { return e.Clock.Now().Add(5 * time.Minute) })
	bd := &effects.Dispatcher{Service: b, BatchSize: 16, Lease: 2 * time.Minute, Interval: 10 * time.Millisecond}
	if err := b.SweepExpired(ctx); err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "swept", e.EffectState(t, eff.ID), store.EffectUnknown)
	if _, err := b.Resolve(ctx, eff.ID, effects.Resolution{Outcome: effects.OutcomeNotSent, Note: "503: not taken"}, "cli:ana"); err != nil {
		t.Fatal(err)
	}
	tickWith(t, bd)
	apptest.Equal(t, "completed by B", e.EffectState(t, eff.ID), store.EffectCompleted)
	close(proceed) // A records its 503 as "retry": it must not apply
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	tickWith(t, bd)
	apptest.Equal(t, "still completed", e.EffectState(t, eff.ID), store.EffectCompleted)
	apptest.Equal(t, "sends", e.Provider.Requests(effects.ProviderKey(eff)), 2)
}

// An agent whose run lease was taken over cannot clear its planned effect (which would let
// it run again); the agent holding the run now can.
func testAgentReconcileStale(t *testing.T, e *apptest.EffectsEnv) {
	e.ClaimRun(t, "r1")
	a := e.Owner(t, "r1")
	if _, err := e.Plan("r1", "draft", "in"); err != nil {
		t.Fatal(err)
	}
	e.Clock.Advance(apptest.LeaseConfig.DefaultLease + time.Minute)
	if res := e.ClaimRun(t, "r1"); res.LeaseOwner == a {
		t.Fatal("the run was not reclaimed")
	}
	b := e.Owner(t, "r1")
	if _, err := e.Ledger.Reconcile(ctx, ledger.ReconcileRequest{Key: "r1", EffectID: "draft", Owner: a, Found: []string{}, Actor: "stale agent"}); err == nil {
		t.Fatal("an agent that lost its lease cleared a planned effect")
	}
	eff, err := e.Store.EffectByRunEffectID(ctx, "r1", "draft")
	if err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "still planned", eff.State, store.EffectPlanned)
	if got, err := e.Ledger.Reconcile(ctx, ledger.ReconcileRequest{Key: "r1", EffectID: "draft", Owner: b, Found: []string{}, Actor: "agent"}); err != nil || got != "cleared" {
		t.Fatalf("reconcile by the holder: %s %v", got, err)
	}
}

// Two approvers decide one approval at the same moment (two instances): one decision
// queues the effect, the other is refused, and the provider gets one send.
func testApprovalDecidedTwice(t *testing.T, e *apptest.EffectsEnv) {
	r := e.ClaimRun(t, "k1")
	sub, err := e.Effects.Submit(ctx, effects.QueueRequest{Key: "k1", Owner: r.LeaseOwner, Version: r.Version,
		ActionType: "email", Target: "default", Payload: json.RawMessage(`{"to":"a"}`), Actor: "apikey:wf"})
	if err != nil || sub.Approval == nil {
		t.Fatalf("gated submit: %+v %v", sub, err)
	}
	hash := approvals.HashToken(sub.Approval.Token)
	var wg sync.WaitGroup
	var ok atomic.Int32
	for i := range 2 {
		svc := e.NewApprovals(e.Store, e.Clock.Now)
		wg.Go(func() {
			if _, err := svc.Decide(ctx, hash, approvals.Approve, "",
				approvals.Person{Subject: fmt.Sprintf("lead-%d", i), Roles: []string{"support-lead"}}); err == nil {
				ok.Add(1)
			}
		})
	}
	wg.Wait()
	apptest.Equal(t, "decisions that applied", ok.Load(), int32(1))
	effs, err := e.Effects.List(ctx, store.EffectListParams{RunKey: "k1"})
	if err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "effects queued", len(effs), 1)
	e.Tick(t)
	e.Tick(t)
	apptest.Equal(t, "sends", e.Provider.Requests(effects.ProviderKey(effs[0])), 1)
}

// The write-retry re-queue takes failed rows only, in the statement that changes them:
// two at once re-queue each failed effect once, and a later call finds nothing once the
// effect is sending, unknown or completed.
func testRequeueFailedOnlyTakesFailed(t *testing.T, e *apptest.EffectsEnv) {
	e.Provider.Reply = func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			w.WriteHeader(http.StatusBadRequest) // refused: failed, definitely not performed
			return
		}
		w.WriteHeader(http.StatusInternalServerError) // then: unknown
	}
	eff := e.Queue(t, "k1", "invoice", "default", `{"amount":1}`)
	e.Tick(t)
	apptest.Equal(t, "refused", e.EffectState(t, eff.ID), store.EffectFailed)
	var wg sync.WaitGroup
	var requeued atomic.Int32
	for range 2 {
		wg.Go(func() {
			err := e.Store.Transact(ctx, func(q store.Queries) error {
				got, err := q.EffectRequeueFailed(ctx, "k1", e.Effects.At())
				requeued.Add(int32(len(got)))
				return err
			})
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	apptest.Equal(t, "re-queued", requeued.Load(), int32(1))
	e.Tick(t)
	apptest.Equal(t, "resent into the unknown", e.EffectState(t, eff.ID), store.EffectUnknown)
	err := e.Store.Transact(ctx, func(q store.Queries) error {
		got, err := q.EffectRequeueFailed(ctx, "k1", e.Effects.At())
		apptest.Equal(t, "re-queued once unknown", len(got), 0)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "sends", e.Provider.Requests(effects.ProviderKey(eff)), 2)
}
