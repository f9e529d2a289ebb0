package effects

// How a send's outcome reaches the store. One answer never blocks another, not even one
// the store refuses to keep:
//
//   - Outcomes that finish together are recorded in one transaction (group commit).
//   - When that transaction fails, each outcome of the group is recorded again in its own
//     savepoint of one transaction. An outcome whose values the store refuses
//     (store.ErrInvalidValue: bytes it cannot keep, a constraint) is recorded at once in
//     a safe form instead — sanitised, then without its provider id — and the others
//     commit beside it. Such a refusal is never retried as it was.
//   - A transient failure (the store unreachable) is retried with backoff by the
//     outcome's own send goroutine, never by the group's leader, until the lease ends.
//   - A Sent outcome still unrecorded when the lease ends is kept in memory (bounded) and
//     applied when the store accepts writes again: by compare-and-set on the effect as
//     the lease left it, a reconciliation of the unknown effect the sweeper made of it
//     (effect_reconciled, source "dispatcher's late outcome"). Other outcomes are only
//     logged: the effect stays unknown for reconciliation or a person.

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/airlockhq/airlock/internal/connector"
	"github.com/airlockhq/airlock/internal/periodic"
	"github.com/airlockhq/airlock/internal/store"
)

// recorder groups outcomes that finish together into one transaction: the first caller
// records everything queued meanwhile, the others wait for it (group commit).
type recorder struct {
	d       *Dispatcher
	mu      sync.Mutex
	pending []*record
	leading bool
}

type record struct {
	e     store.Effect
	owner string
	res   connector.Result
	out   outcome
	err   error
	done  chan struct{}
}

// record records one outcome, in a group with those queued meanwhile, once: it returns
// the store's answer for this outcome alone.
func (r *recorder) record(ctx context.Context, e store.Effect, owner string, res connector.Result) (outcome, error) {
	it := &record{e: e, owner: owner, res: res, done: make(chan struct{})}
	r.mu.Lock()
	r.pending = append(r.pending, it)
	if r.leading {
		r.mu.Unlock()
		r.d.hook("record_queued")
		<-it.done
		return it.out, it.err
	}
	r.leading = true
	r.mu.Unlock()
	r.d.hook("record_queued")
	r.d.hook("record_lead") // tests hold the leader here until a whole group has queued
	r.mu.Lock()
	for len(r.pending) > 0 {
		group := r.pending
		r.pending = nil
		r.mu.Unlock()
		r.flush(ctx, group)
		r.mu.Lock()
	}
	r.leading = false
	r.mu.Unlock()
	<-it.done
	return it.out, it.err
}

// flush records a group in one transaction, runs locked in key order (so two groups never
// deadlock). If that fails, the outcomes are isolated from each other (isolate); a lone
// outcome that failed for a reason other than its values just reports the failure.
//
// On a store whose runs are spread over nodes (store.RunSharded: Citus), the group is
// recorded run by run, each run's outcomes in a transaction of their own: one transaction
// over several runs' nodes would commit with two-phase commit, whose window between the
// coordinator's commit and the workers' is one EventList's horizon cannot see.
func (r *recorder) flush(ctx context.Context, group []*record) {
	defer func() {
		for _, it := range group {
			close(it.done)
		}
	}()
	if s, ok := r.d.Store.(store.RunSharded); ok && s.ShardedByRun() {
		byRun := map[string][]*record{}
		var keys []string
		for _, it := range group {
			if _, ok := byRun[it.e.RunKey]; !ok {
				keys = append(keys, it.e.RunKey)
			}
			byRun[it.e.RunKey] = append(byRun[it.e.RunKey], it)
		}
		slices.Sort(keys)
		for _, k := range keys {
			r.flushGroup(ctx, byRun[k])
		}
		return
	}
	r.flushGroup(ctx, group)
}

// flushGroup records a group (flush) and answers each of its records.
func (r *recorder) flushGroup(ctx context.Context, group []*record) {
	d := r.d
	rest := group
	if bq, ok := d.Store.(store.BatchQueries); ok {
		if rest = d.recordLocked(ctx, bq, group); len(rest) == 0 {
			return
		}
	}
	keys := make([]string, 0, len(rest))
	for _, it := range rest {
		keys = append(keys, it.e.RunKey)
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	err := d.Store.Transact(ctx, func(q store.Queries) error {
		locked, err := q.RunLockKeys(ctx, keys)
		if err != nil {
			return err
		}
		return d.finishGroup(ctx, q, locked, rest)
	})
	if err == nil {
		return
	}
	if len(rest) == 1 && !errors.Is(err, store.ErrInvalidValue) {
		rest[0].out, rest[0].err = outcome{}, err
		return
	}
	r.isolate(ctx, keys, rest)
}

// recordLocked records the Sent outcomes of a group in one autocommit statement, where
// the store offers it on itself (store.BatchQueries.EffectUpdateManyLocked, PostgreSQL):
// the statement locks the runs that are not approved, in key order, then applies those
// runs' compare-and-sets and inserts their events, and commits — one round trip instead
// of BEGIN, the run locks, the group's statement and COMMIT. It is the transaction of
// finishBatch in one statement: a run not approved under the lock needs no settling. It
// returns the records left for that transaction: the other outcomes, those whose run is
// approved or gone, those that did not apply (finishIn tries the reconciliation of a
// lapsed lease, or finds the lease lost), and all of them if the statement failed or
// applied nothing (then it cannot tell which runs it locked).
func (d *Dispatcher) recordLocked(ctx context.Context, bq store.BatchQueries, group []*record) []*record {
	at := d.At()
	var rest, batch []*record
	var ps []store.EffectUpdateParams
	var evs [][]store.EventInsertParams
	var alerts []string
	seen := make(map[string]bool, len(group))
	for _, it := range group {
		if it.res.Outcome != connector.Sent || seen[it.e.ID] {
			rest = append(rest, it)
			continue
		}
		// A Sent outcome's plan does not read the transaction's now (only a retry's
		// not_before does).
		pl := d.planOutcome(sent{e: it.e, owner: it.owner, res: it.res, actor: "airlock"}, time.Time{}, at)
		ev, err := outcomeEvents(it, pl)
		if err != nil || !pl.update.Batchable() {
			rest = append(rest, it)
			continue
		}
		seen[it.e.ID] = true
		batch, ps, evs, alerts = append(batch, it), append(ps, pl.update), append(evs, ev), append(alerts, pl.alert)
	}
	if len(batch) == 0 {
		return group
	}
	locked, applied, err := bq.EffectUpdateManyLocked(ctx, ps, evs)
	if err != nil || len(locked) == 0 {
		return group
	}
	for i, it := range batch {
		if applied[i] {
			it.out, it.err = outcome{state: ps[i].To, alert: alerts[i]}, nil
			continue
		}
		rest = append(rest, it)
	}
	return rest
}

// outcomeEvents are a planned outcome's events as the store inserts them.
func outcomeEvents(it *record, pl outcomePlan) ([]store.EventInsertParams, error) {
	var out []store.EventInsertParams
	for _, ev := range pl.events() {
		detail, err := json.Marshal(ev.detail)
		if err != nil {
			return nil, err
		}
		out = append(out, store.EventInsertParams{RunKey: it.e.RunKey, Kind: string(ev.kind), Actor: ev.actor,
			Detail: detail, Now: ev.at})
	}
	return out, nil
}

// finishGroup records a group's outcomes inside q's transaction, which holds their runs'
// locks (locked: the runs as locked). Where the store offers it (store.BatchQueries), the
// outcomes whose run needs no settling are written with one statement for all (their
// compare-and-sets and their events, in the order finishIn writes them); the others, and
// a Sent outcome whose lease lapsed (the reconciliation path), go through finishIn one by
// one — which does not read a run again that its lock showed is not approved. Every
// record of the group gets its answer.
func (d *Dispatcher) finishGroup(ctx context.Context, q store.Queries, locked map[string]store.Run, group []*record) error {
	rest := group
	if bq, ok := q.(store.BatchQueries); ok {
		var err error
		if rest, err = d.finishBatch(ctx, q, bq, locked, group); err != nil {
			return err
		}
	}
	for _, it := range rest {
		run, found := locked[it.e.RunKey]
		settle := !found || run.State == store.StateApproved // see finishBatch
		it.out, it.err = d.finishInRun(ctx, q, sent{e: it.e, owner: it.owner, res: it.res, actor: "airlock"}, settle)
		if it.err != nil && !errors.Is(it.err, ErrEffectLeaseLost) {
			return it.err
		}
	}
	return nil
}

// finishBatch is finishGroup's batch: it records what it can and returns the records
// left for finishIn.
func (d *Dispatcher) finishBatch(ctx context.Context, q store.Queries, bq store.BatchQueries, locked map[string]store.Run, group []*record) ([]*record, error) {
	// The transaction's now is read only if an outcome needs it (a retry's not_before):
	// a group of completions costs no clock read.
	var now time.Time
	for _, it := range group {
		if it.res.Outcome != connector.Sent {
			var err error
			if now, err = d.Read(ctx, q); err != nil {
				return nil, err
			}
			break
		}
	}
	at := d.At()
	var rest, batch []*record
	var plans []outcomePlan
	seen := make(map[string]bool, len(group))
	for _, it := range group {
		// A run that is not approved under our lock stays so in this transaction (settling
		// only moves a run out of approved): its outcomes settle nothing, and finishIn's
		// settleApproved would only read it to find that out.
		run, found := locked[it.e.RunKey]
		if !found || run.State == store.StateApproved || seen[it.e.ID] {
			rest = append(rest, it)
			continue
		}
		pl := d.planOutcome(sent{e: it.e, owner: it.owner, res: it.res, actor: "airlock"}, now, at)
		if !pl.update.Batchable() {
			rest = append(rest, it)
			continue
		}
		seen[it.e.ID] = true
		batch, plans = append(batch, it), append(plans, pl)
	}
	if len(batch) == 0 {
		return rest, nil
	}
	ps := make([]store.EffectUpdateParams, len(plans))
	evs := make([][]store.EventInsertParams, len(plans))
	for i := range plans {
		ps[i] = plans[i].update
		var err error
		if evs[i], err = outcomeEvents(batch[i], plans[i]); err != nil {
			return nil, err
		}
	}
	// One statement: the compare-and-sets, and the events of those that applied.
	applied, err := bq.EffectUpdateMany(ctx, ps, evs)
	if err != nil {
		return nil, err
	}
	for i, it := range batch {
		switch {
		case applied[i]:
			it.out, it.err = outcome{state: ps[i].To, alert: plans[i].alert}, nil
		case plans[i].reconcilable:
			rest = append(rest, it) // finishIn tries the reconciliation of our lapsed lease
		default:
			it.out, it.err = outcome{}, ErrEffectLeaseLost
		}
	}
	return rest, nil
}

// isolate records each outcome of a group that failed together in its own savepoint of
// one transaction: the store's refusal of one outcome's values costs that outcome alone
// (it is recorded in a safe form), and the rest commit. If the transaction itself fails,
// the store is what failed: every outcome reports that, to be retried.
func (r *recorder) isolate(ctx context.Context, keys []string, group []*record) {
	d := r.d
	err := d.Store.Within(ctx, func(ctx context.Context) error {
		for _, it := range group {
			it.out, it.err = outcome{}, nil // Within may not run this again, but be plain
		}
		if _, err := d.Store.RunLockKeys(ctx, keys); err != nil {
			return err
		}
		for _, it := range group {
			it.out, it.err = d.recordSafely(ctx, it)
		}
		return nil
	})
	if err != nil {
		for _, it := range group {
			it.out, it.err = outcome{}, err
		}
	}
}

// recordSafely records one outcome in a savepoint of ctx's transaction, and if the store
// refuses its values, in the next safe form (storable), each in a savepoint of its own.
func (d *Dispatcher) recordSafely(ctx context.Context, it *record) (outcome, error) {
	var out outcome
	var err error
	for _, res := range storable(it.res) {
		err = d.Store.Transact(ctx, func(q store.Queries) error {
			var err error
			out, err = d.finishIn(ctx, q, sent{e: it.e, owner: it.owner, res: res, actor: "airlock"})
			return err
		})
		if !errors.Is(err, store.ErrInvalidValue) {
			return out, err
		}
		d.Log.WarnContext(ctx, "the store refused a dispatch outcome's values: recording it in a safe form",
			"key", it.e.RunKey, "effect_id", it.e.EffectID, "outcome", res.Outcome.String(),
			"provider_id", safeID(res.ProviderID), "err", err)
	}
	return out, err
}

// storable is a Sent or other outcome as it should be recorded, then the safer forms to
// fall back on when the store refuses one: every text sanitised, then nothing but the
// outcome itself (a Sent one without its provider id, with a note saying so).
func storable(res connector.Result) []connector.Result {
	forms := []connector.Result{res}
	safe := res
	safe.ProviderID, safe.Note = connector.SafeProviderID(res.ProviderID)
	if safe.Note == "" {
		safe.Note = res.Note
	}
	safe.Class, _ = connector.SafeProviderID(res.Class)
	if safe != res {
		forms = append(forms, safe)
	}
	bare := connector.Result{Outcome: res.Outcome, RetryAfter: res.RetryAfter}
	if res.ProviderID != "" {
		bare.Note = connector.NoteProviderIDUnstorable
	}
	if res.Class != "" {
		bare.Class = "unstorable_class"
	}
	if bare != safe {
		forms = append(forms, bare)
	}
	return forms
}

// safeID is a provider id as logs show it: the safe form.
func safeID(id string) string {
	s, _ := connector.SafeProviderID(id)
	return s
}

// deliver records a send's outcome. A transient failure is retried here, on the send's
// own goroutine, with backoff while the lease lasts and the drain allows; a Sent outcome
// still unrecorded then is kept for a late apply. Store calls use a context no one
// cancels: sendCtx only says when to stop retrying.
func (d *Dispatcher) deliver(sendCtx context.Context, e store.Effect, owner string, res connector.Result, until time.Time) {
	ctx := context.WithoutCancel(sendCtx)
	wait := 50 * time.Millisecond
	for {
		out, err := d.rec.record(ctx, e, owner, res)
		if err == nil {
			d.alerted(out.alert)
			return
		}
		if errors.Is(err, ErrEffectLeaseLost) || errors.Is(err, store.ErrInvalidValue) {
			// Someone else decided (or even the bare outcome was refused: the sweeper makes
			// the effect unknown, for a person).
			d.Log.WarnContext(ctx, "dispatch outcome not recorded", "key", e.RunKey, "effect_id", e.EffectID,
				"outcome", res.Outcome.String(), "provider_id", safeID(res.ProviderID), "err", err)
			return
		}
		if sendCtx.Err() != nil || time.Now().Add(wait).After(until) {
			d.keepLate(ctx, e, owner, res, err)
			return
		}
		d.Log.WarnContext(ctx, "recording a dispatch outcome failed: retrying", "key", e.RunKey,
			"effect_id", e.EffectID, "outcome", res.Outcome.String(), "provider_id", safeID(res.ProviderID),
			"retry_in", wait, "err", err)
		select {
		case <-time.After(wait):
		case <-sendCtx.Done():
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// maxLate bounds the outcomes kept past their lease in one instance; past it the oldest is
// given up (logged with its provider id: a person can still resolve the effect).
const maxLate = 10_000

// lateRetryMax is the longest wait between two tries of one late outcome.
const lateRetryMax = 30 * time.Second

// lateOutcomes are Sent outcomes whose lease ended before the store accepted them.
type lateOutcomes struct {
	mu    sync.Mutex
	items []*lateOutcome // oldest first
}

type lateOutcome struct {
	e     store.Effect
	owner string
	res   connector.Result
	next  time.Time     // the next try
	wait  time.Duration // the last backoff
}

// keepLate keeps a Sent outcome the store did not accept within the lease; any other is
// only logged (the effect becomes unknown: reconciliation or a person settles it).
func (d *Dispatcher) keepLate(ctx context.Context, e store.Effect, owner string, res connector.Result, err error) {
	if res.Outcome != connector.Sent {
		d.Log.WarnContext(ctx, "dispatch outcome not recorded before the lease ended: the effect becomes unknown",
			"key", e.RunKey, "effect_id", e.EffectID, "outcome", res.Outcome.String(), "class", res.Class, "err", err)
		return
	}
	d.Log.WarnContext(ctx, "dispatch outcome kept past its lease: it is applied once the store accepts writes",
		"key", e.RunKey, "effect_id", e.EffectID, "outcome", res.Outcome.String(), "provider_id", safeID(res.ProviderID), "err", err)
	e.Payload = nil // not needed to record the outcome: kept, it would bound nothing
	d.late.mu.Lock()
	d.late.items = append(d.late.items, &lateOutcome{e: e, owner: owner, res: res, next: time.Now()})
	var dropped *lateOutcome
	if len(d.late.items) > maxLate {
		dropped = d.late.items[0]
		d.late.items = slices.Delete(d.late.items, 0, 1)
	}
	d.late.mu.Unlock()
	if dropped != nil {
		d.Log.ErrorContext(ctx, "dispatch outcome given up: too many wait for the store; resolve the effect as sent",
			"key", dropped.e.RunKey, "effect_id", dropped.e.EffectID, "provider_id", safeID(dropped.res.ProviderID), "kept", maxLate)
	}
}

// takeLate removes and returns the late outcomes due at now (all of them with all).
func (d *Dispatcher) takeLate(now time.Time, all bool) []*lateOutcome {
	d.late.mu.Lock()
	defer d.late.mu.Unlock()
	var due []*lateOutcome
	d.late.items = slices.DeleteFunc(d.late.items, func(l *lateOutcome) bool {
		if all || !l.next.After(now) {
			due = append(due, l)
			return true
		}
		return false
	})
	return due
}

// LateOutcomes is how many Sent outcomes wait, past their lease, for the store.
func (d *Dispatcher) LateOutcomes() int {
	d.late.mu.Lock()
	defer d.late.mu.Unlock()
	return len(d.late.items)
}

// applyLate tries the late outcomes that are due (all with all), together so that they
// group-commit. One the store still refuses waits twice as long as last time (1 s to
// lateRetryMax); one the effect has moved past (resolved, reconciled, leased again) is
// dropped with a log line.
func (d *Dispatcher) applyLate(ctx context.Context, all bool) {
	due := d.takeLate(time.Now(), all)
	if len(due) == 0 {
		return
	}
	sem := make(chan struct{}, max(d.Concurrency, 1))
	var wg sync.WaitGroup
	for _, l := range due {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			d.applyOneLate(ctx, l)
		}()
	}
	wg.Wait()
}

func (d *Dispatcher) applyOneLate(ctx context.Context, l *lateOutcome) {
	e, id := l.e, safeID(l.res.ProviderID)
	out, err := d.rec.record(ctx, e, l.owner, l.res)
	switch {
	case err == nil:
		d.Log.InfoContext(ctx, "late dispatch outcome applied", "key", e.RunKey, "effect_id", e.EffectID,
			"provider_id", id, "state", out.state)
		d.alerted(out.alert)
	case errors.Is(err, ErrEffectLeaseLost):
		d.Log.WarnContext(ctx, "late dispatch outcome not applied: the effect moved on (resolved, reconciled or leased again)",
			"key", e.RunKey, "effect_id", e.EffectID, "provider_id", id)
	case errors.Is(err, store.ErrInvalidValue):
		d.Log.ErrorContext(ctx, "late dispatch outcome refused by the store: resolve the effect as sent",
			"key", e.RunKey, "effect_id", e.EffectID, "provider_id", id, "err", err)
	default:
		l.wait = min(max(2*l.wait, time.Second), lateRetryMax)
		l.next = time.Now().Add(l.wait)
		d.late.mu.Lock()
		d.late.items = append(d.late.items, l)
		d.late.mu.Unlock()
	}
}

// lateLoop applies late outcomes as they fall due until ctx ends. The applies themselves
// are not cancelled by ctx: they may share a group commit with sends still draining.
func (d *Dispatcher) lateLoop(ctx context.Context) {
	periodic.Every(ctx, min(d.Interval, time.Second), func(ctx context.Context) error {
		d.applyLate(context.WithoutCancel(ctx), false)
		return nil
	}, nil)
}

// lateShutdownTry bounds the last try of the late outcomes when the dispatcher stops.
const lateShutdownTry = 5 * time.Second

// flushLate tries every late outcome once more as the dispatcher stops (after its sends
// have drained: nothing else shares the group), and logs each one still unapplied with
// its provider id: the evidence a person needs to resolve it.
func (d *Dispatcher) flushLate(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lateShutdownTry)
	defer cancel()
	d.applyLate(ctx, true)
	for _, l := range d.takeLate(time.Now(), true) {
		d.Log.ErrorContext(ctx, "dispatch outcome lost at shutdown: the provider accepted it; resolve the effect as sent",
			"key", l.e.RunKey, "effect_id", l.e.EffectID, "id", l.e.ID, "provider_id", safeID(l.res.ProviderID))
	}
}
