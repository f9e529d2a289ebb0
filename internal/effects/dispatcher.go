package effects

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"golang.org/x/time/rate"

	"github.com/airlockhq/airlock/internal/connector"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/tracing"
)

// Dispatcher sends due effects through their connectors. Any number may run, in one
// process or many, against one database.
//
// One effect's path: leased with others in one statement (the lease caps each action
// type at its max_in_flight and its rate); its begin is committed together with the
// others' in one transaction that also reads the kill switch and requires a live lease;
// the connector is called with a deadline inside the lease; the outcome is recorded by
// compare-and-set on the lease, grouped with the outcomes that finish at the same time
// into one transaction (record.go: an outcome the store refuses is isolated and kept in a
// safe form, a transient failure is retried until the lease ends, and a Sent outcome
// still unrecorded then is applied late).
type Dispatcher struct {
	*Service
	BatchSize   int             // most effects leased in one statement
	Concurrency int             // most sends in flight in this instance
	Lease       time.Duration   // how long a send may take before it counts as crashed
	Interval    time.Duration   // the fallback poll
	Tracer      *tracing.Tracer // nil: sends carry the queuing request's trace, without a span of their own
	Drain       time.Duration   // how long Run lets in-flight sends finish once stopped
	// Crash, when set, is called at the named points (after_lease, after_send): the crash
	// tests use it to SIGKILL the process there. Never set in production.
	Crash func(point string)

	once     sync.Once
	mu       sync.Mutex
	inFlight map[string]int // by action type
	total    int
	limiters map[string]*rate.Limiter
	wakeC    chan struct{}
	rec      recorder
	late     lateOutcomes
}

func (d *Dispatcher) init() {
	d.once.Do(func() {
		d.Concurrency = cmp.Or(d.Concurrency, 32)
		d.BatchSize = cmp.Or(d.BatchSize, d.Concurrency)
		d.Lease = cmp.Or(d.Lease, 2*time.Minute)
		d.Interval = cmp.Or(d.Interval, 500*time.Millisecond)
		d.inFlight = map[string]int{}
		d.limiters = map[string]*rate.Limiter{}
		for t := range d.connectors {
			if a := d.Policy.Action(t); a != nil && a.Rate > 0 {
				d.limiters[t] = rate.NewLimiter(rate.Limit(a.Rate), max(1, int(a.Rate)))
			}
		}
		d.wakeC = make(chan struct{}, 1)
		d.rec.d = d
	})
}

// wakeUp asks the loop to look for due effects now.
func (d *Dispatcher) wakeUp() {
	select {
	case d.wakeC <- struct{}{}:
	default:
	}
}

// Run dispatches until ctx ends, then stops leasing and lets in-flight sends finish (up to
// Drain) and record their outcomes: a stopping instance does not turn sent effects into
// unknown ones. Meanwhile it applies the Sent outcomes kept past their lease as the store
// accepts them, and at the end logs each one it could not apply, with its provider id.
func (d *Dispatcher) Run(ctx context.Context) {
	d.init()
	wake := d.wakeUp
	d.wake.Store(&wake)
	defer d.wake.CompareAndSwap(&wake, nil)
	if l, ok := d.Store.(store.EffectListener); ok {
		go l.ListenEffects(ctx, d.wakeUp)
	}
	sendCtx, cancelSends := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelSends()
	lateDone := make(chan struct{})
	go func() { defer close(lateDone); d.lateLoop(ctx) }()
	var sends sync.WaitGroup
	pool := newSenders()
	defer pool.stop() // after the drain below: every send has returned
	t := time.NewTicker(d.Interval)
	defer t.Stop()
	for ctx.Err() == nil {
		leased, more, err := d.fill(ctx, sendCtx, &sends, pool.do)
		if err != nil && ctx.Err() == nil {
			d.Log.ErrorContext(ctx, "dispatch round failed", "err", err)
		}
		if more && leased > 0 {
			continue // the lease came back full and there is room: lease again at once
		}
		select {
		case <-ctx.Done():
		case <-t.C:
		case <-d.wakeC:
		}
	}
	done := make(chan struct{})
	go func() { sends.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d.Drain):
		d.Log.Warn("dispatcher drain timed out: cancelling in-flight sends", "drain", d.Drain)
		cancelSends()
		<-done
	}
	<-lateDone
	d.flushLate(ctx)
}

// Tick runs one round and waits for it: expired leases are swept, late outcomes that are
// due applied, then one batch of due effects is leased, sent and recorded. It returns how
// many effects it leased.
func (d *Dispatcher) Tick(ctx context.Context) (int, error) {
	d.init()
	if err := d.SweepExpired(ctx); err != nil {
		return 0, err
	}
	d.applyLate(ctx, false)
	var sends sync.WaitGroup
	n, _, err := d.fill(ctx, ctx, &sends, func(f func()) { go f() })
	sends.Wait()
	return n, err
}

func (d *Dispatcher) crash(point string) {
	if d.Crash != nil {
		d.Crash(point)
	}
}

// caps is how many effects of each type this instance may lease now, and in all.
func (d *Dispatcher) caps(now time.Time) (map[string]int, int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	free := d.Concurrency - d.total
	caps := map[string]int{}
	if free <= 0 {
		return caps, 0
	}
	for t := range d.connectors {
		a := d.Policy.Action(t)
		if a == nil {
			continue
		}
		// Never probe a type for more than one lease can take: rows probed but not taken
		// stay locked (and skipped by other instances) until the lease commits.
		n := min(free, d.BatchSize, max(a.MaxInFlight, 1)-d.inFlight[t])
		if l := d.limiters[t]; l != nil {
			n = min(n, int(l.TokensAt(now)))
		}
		if n > 0 {
			caps[t] = n
		}
	}
	return caps, min(free, d.BatchSize)
}

func (d *Dispatcher) take(batch []store.Effect, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, e := range batch {
		d.inFlight[e.ActionType]++
		d.total++
		if l := d.limiters[e.ActionType]; l != nil {
			l.AllowN(now, 1) // leased within the tokens there were: never refused
		}
	}
}

func (d *Dispatcher) release(e store.Effect) {
	d.mu.Lock()
	d.inFlight[e.ActionType]--
	d.total--
	d.mu.Unlock()
	d.wakeUp()
}

// fill leases as many due effects as there is room for, commits their begin and starts
// their sends, each on a goroutine of spawn's. more reports that the lease came back full.
func (d *Dispatcher) fill(ctx, sendCtx context.Context, sends *sync.WaitGroup, spawn func(func())) (int, bool, error) {
	caps, limit := d.caps(time.Now())
	if limit == 0 || len(caps) == 0 {
		return 0, false, nil
	}
	owner := "dispatcher:" + uuid.NewString()
	// The send deadline is measured on this process's monotonic clock from before the
	// lease statement, so it falls before the lease's end whatever the clocks say.
	deadline := time.Now().Add(d.Lease - leaseMargin(d.Lease))
	// The lease commits on its own, before the begin-mark: an instance that dies between
	// the two has sent nothing, and the sweeper returns the effect to pending (a retry).
	// For types whose provider honours the key the lease is the begin-mark too (one
	// statement and one row version fewer per send): one that dies after it left a begun
	// effect, which the sweeper resends with the same key.
	batch, err := d.Store.LeaseEffects(ctx, store.EffectLeaseParams{Executor: store.ExecutorDispatcher,
		Caps: caps, Owner: owner, Lease: d.Lease, Limit: limit, Now: d.At(), Begin: d.beginWithLease(caps)})
	if err != nil {
		return 0, false, fmt.Errorf("lease effects: %w", err)
	}
	if len(batch) == 0 {
		return 0, false, nil
	}
	d.take(batch, time.Now())
	d.hook("leased")
	d.crash("after_lease")
	// Once marked, sent: the begin-mark runs on a context a shutdown does not cancel, so a
	// SIGTERM cannot commit a mark and lose its reply (the effect would end unknown, never
	// having left); its statements are bounded by the lease's own margin.
	markCtx, cancelMark := context.WithTimeout(context.WithoutCancel(ctx), leaseMargin(d.Lease)+time.Until(deadline))
	started, err := d.begin(markCtx, owner, batch)
	cancelMark()
	for _, e := range batch {
		if !started[e.ID] {
			d.release(e)
		}
	}
	// An error after part of the batch was marked (the transaction for the rest failed)
	// still sends the marked ones: each holds its slot until its send returns.
	for _, e := range batch {
		if !started[e.ID] {
			continue
		}
		sends.Add(1)
		spawn(func() {
			defer sends.Done()
			defer d.release(e)
			d.send(sendCtx, e, owner, deadline)
		})
	}
	if err != nil {
		return len(batch), false, err
	}
	return len(batch), len(batch) == limit, nil
}

// senderIdle is how long a send's goroutine waits for the next send before it exits.
const senderIdle = 5 * time.Second

// senders runs Run's sends on goroutines that outlive one send: a goroutine that has sent
// once has the stack a send needs (net/http, pgx, the outcome's group commit), where a
// new one per send grows its stack again each time (runtime.newstack and copystack were
// ~4% of the drain's CPU). There are never more of them than sends in flight at once
// (d.Concurrency); an idle one exits after senderIdle, or at stop.
type senders struct {
	idle chan func() // unbuffered: a send succeeds only if a goroutine waits
	quit chan struct{}
}

func newSenders() *senders {
	return &senders{idle: make(chan func()), quit: make(chan struct{})}
}

// do runs f on an idle goroutine, or on a new one if none waits.
func (s *senders) do(f func()) {
	select {
	case s.idle <- f:
	default:
		go s.work(f)
	}
}

func (s *senders) work(f func()) {
	t := time.NewTimer(senderIdle)
	defer t.Stop()
	for {
		f()
		f = nil // keep nothing of the last send while idle
		t.Reset(senderIdle)
		select {
		case f = <-s.idle:
		case <-t.C:
			return
		case <-s.quit:
			return
		}
	}
}

// stop lets the idle goroutines exit; do must not be called after.
func (s *senders) stop() { close(s.quit) }

// leaseMargin is the part of a lease kept for recording the outcome after a send.
func leaseMargin(lease time.Duration) time.Duration {
	return min(lease/10, 5*time.Second)
}

// beginWithLease lists the types of caps whose begin-mark the lease writes: those whose
// connector is idempotent (a begun effect whose sender died is resent with the same key,
// as if it had never begun), unless this process's environment stops every send.
func (d *Dispatcher) beginWithLease(caps map[string]int) []string {
	if d.envDisabled {
		return nil
	}
	var out []string
	for t := range caps {
		if c := d.connectors[t]; c != nil && c.Idempotent() {
			out = append(out, t)
		}
	}
	return out
}

// begin commits "the send begins" for a leased batch, and returns the ids that may be
// sent. A sender that dies before this commit provably sent nothing. The effects the
// lease already marked (SendStartedAt set: beginWithLease's types) are sent as they are.
//
// First for the whole batch at once (store.BeginSends: one round trip on PostgreSQL):
// the mark, in the transaction that reads the kill switch under its guard, of those the
// kill switch allows whose lease is live and whose run is not failed_terminal. Usually
// that is all of them. The others, if any, go through beginRest.
func (d *Dispatcher) begin(ctx context.Context, owner string, batch []store.Effect) (map[string]bool, error) {
	started := map[string]bool{}
	rest := slices.DeleteFunc(slices.Clone(batch), func(e store.Effect) bool {
		if e.SendStartedAt != nil {
			started[e.ID] = true
		}
		return e.SendStartedAt != nil
	})
	if len(rest) == 0 {
		return started, nil
	}
	if !d.envDisabled {
		var ids []string
		for _, e := range rest {
			if d.connectors[e.ActionType] != nil {
				ids = append(ids, e.ID)
			}
		}
		marked, err := d.Store.BeginSends(ctx, owner, ids, d.At())
		if err != nil {
			return started, fmt.Errorf("mark sends begun: %w", err) // the lease's marks stand
		}
		for _, id := range marked {
			started[id] = true
		}
		if len(marked) == len(ids) {
			return started, nil
		}
		rest = slices.DeleteFunc(rest, func(e store.Effect) bool { return started[e.ID] })
	}
	more, err := d.beginRest(ctx, owner, rest)
	for id := range more {
		started[id] = true
	}
	return started, err // the batch's marks stand even when the rest's transaction failed
}

// beginRest is begin for the effects the batch mark did not take, in one transaction that
// reads the kill switch itself under its guard: a disable that committed first holds the
// effect (back to pending, attempt not counted, a send_blocked event); one whose run ended
// failed_terminal is cancelled; one whose lease is gone is left to whoever has it. If the
// kill switch allows one now (re-enabled meanwhile), it is marked here.
func (d *Dispatcher) beginRest(ctx context.Context, owner string, batch []store.Effect) (map[string]bool, error) {
	started := map[string]bool{}
	err := d.Store.Transact(ctx, func(q store.Queries) error {
		clear(started)
		enabled, err := d.enabledIn(ctx, q)
		if err != nil {
			return err
		}
		var ids []string
		for _, e := range batch {
			if d.connectors[e.ActionType] == nil {
				continue
			}
			if ok, why := enabled(e.ActionType); !ok {
				if err := d.block(ctx, q, e, owner, why); err != nil {
					return err
				}
				continue
			}
			ids = append(ids, e.ID)
		}
		marked, err := q.EffectMarkStarted(ctx, owner, ids, d.At())
		if err != nil {
			return err
		}
		for _, id := range marked {
			started[id] = true
		}
		for _, e := range batch {
			if slices.Contains(ids, e.ID) && !started[e.ID] {
				if err := d.cancelIfRunEnded(ctx, q, e, owner); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("mark sends begun: %w", err)
	}
	return started, nil
}

// block returns a leased effect to pending untouched, and records the blocked attempt.
func (d *Dispatcher) block(ctx context.Context, q store.Queries, e store.Effect, owner, why string) error {
	now, err := d.Read(ctx, q)
	if err != nil {
		return err
	}
	nb, class := now.Add(blockedRetry), "actions_disabled"
	_, err = q.EffectUpdate(ctx, store.EffectUpdateParams{ID: e.ID, From: []store.EffectState{store.EffectSending},
		Owner: owner, To: store.EffectPending, NotBefore: &nb, ErrorClass: &class, ReleaseAttempt: true, Now: d.At()})
	if err != nil {
		return err
	}
	return runs.Event(ctx, q, d.At(), runs.Entry{Key: e.RunKey, Kind: store.EventSendBlocked, Actor: "airlock",
		Detail: map[string]any{"effect_id": e.EffectID, "action_type": e.ActionType, "reason": why}})
}

// cancelIfRunEnded cancels a leased, unbegun effect whose run ended failed_terminal
// (otherwise the mark failed because the lease was lost: someone else decides).
func (d *Dispatcher) cancelIfRunEnded(ctx context.Context, q store.Queries, e store.Effect, owner string) error {
	run, err := q.RunGet(ctx, e.RunKey)
	if err != nil || run.State != store.StateFailedTerminal {
		return err
	}
	class := "run_failed_terminal"
	_, err = q.EffectUpdate(ctx, store.EffectUpdateParams{ID: e.ID, From: []store.EffectState{store.EffectSending},
		Owner: owner, To: store.EffectCancelled, ErrorClass: &class, ReleaseAttempt: true, NotStarted: true, Now: d.At()})
	if errors.Is(err, store.ErrNoMatch) {
		return nil
	}
	if err != nil {
		return err
	}
	return runs.Event(ctx, q, d.At(), runs.Entry{Key: e.RunKey, Kind: store.EventEffectCancelled, Actor: "airlock",
		Detail: map[string]any{"effect_id": e.EffectID, "reason": "run_failed_terminal"}})
}

// send calls the connector within the lease and records the outcome. sendCtx is not
// cancelled by shutdown (only after the drain timeout), and the outcome is recorded with
// a context no one cancels.
func (d *Dispatcher) send(sendCtx context.Context, e store.Effect, owner string, deadline time.Time) {
	c := d.connectors[e.ActionType]
	start := time.Now()
	ctx, cancel := context.WithDeadline(tracing.WithParent(sendCtx, e.TraceParent), deadline)
	ctx, end := d.Tracer.Dispatch(ctx, e.ActionType)
	res := c.Send(ctx, connector.Request{EffectID: ProviderKey(e), RunKey: e.RunKey,
		ActionType: e.ActionType, Target: e.Target, Payload: e.Payload})
	end(res.Outcome.String())
	cancel()
	d.Observer.Attempt(res.Outcome.String(), time.Since(start))
	d.crash("after_send")
	d.hook("sent")
	d.deliver(sendCtx, e, owner, res, deadline.Add(leaseMargin(d.Lease)))
}
