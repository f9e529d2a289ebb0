package storetest

// Fault injection: a store that fails chosen calls the way a database does, over a real
// store of either backend.

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

// Op names a store call a fault can hit.
type Op string

const (
	OpTransact               Op = "Transact"
	OpWithin                 Op = "Within"
	OpLeaseEffects           Op = "LeaseEffects"
	OpBeginSends             Op = "BeginSends"
	OpEffectUpdate           Op = "EffectUpdate"
	OpEffectUpdateMany       Op = "EffectUpdateMany"
	OpEffectUpdateManyLocked Op = "EffectUpdateManyLocked"
)

// Call is one store call as an Injector sees it.
type Call struct {
	Op Op
	// InTx: the call is made inside a transaction (a Transact's Queries, a ctx a Within
	// bound, or a Transact nested in one: a savepoint). It commits only with that
	// transaction; outside one a call commits on its own (autocommit, or its own
	// transaction).
	InTx bool
	// Updates are the effect updates of EffectUpdate (one) and EffectUpdateMany(Locked).
	Updates []store.EffectUpdateParams
	// IDs are the effects BeginSends is asked to mark.
	IDs []string
}

// When says whether, and where, an injected fault falls.
type When int

const (
	// Pass: the call is made as usual.
	Pass When = iota
	// Before: the call fails without being made; nothing of it happened.
	Before
	// After: the call is made — outside a transaction it commits — and then fails: its
	// reply was lost (a connection cut after the commit reached the server). Inside a
	// transaction the call's work stays in it, which commits only if its caller commits.
	After
)

// Injector decides a call's fault and the error its caller sees (nil: ErrInjected).
type Injector func(Call) (When, error)

// ErrInjected is an injected fault's error when its Injector names none: the database is
// unreachable.
var ErrInjected = store.Unavailable(errors.New("injected fault: connection reset by peer"))

// Write is an effect write that committed, as the faulty store saw it: by which call (Op),
// and to which state (the state the update asked for; sending for a lease or begin-mark).
type Write struct {
	Op Op
	ID string
	To store.EffectState
}

// Faults wraps stores with fault injection and records the effect writes that commit
// through them. Its zero value injects nothing.
type Faults struct {
	mu       sync.Mutex
	inject   Injector
	injected map[Op]int
	writes   []Write
}

// Set makes inject decide every later call (nil: none fails).
func (f *Faults) Set(inject Injector) {
	f.mu.Lock()
	f.inject = inject
	f.mu.Unlock()
}

// Injected is how many faults have hit op so far.
func (f *Faults) Injected(op Op) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.injected[op]
}

// Writes are the effect writes committed so far through the wrapped store, in commit
// order: each statement outside a transaction, and the statements of a transaction when
// it committed (also when the commit's reply was lost). A transaction rolled back, or run
// again (PostgreSQL's deadlock retry), leaves nothing.
func (f *Faults) Writes() []Write {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.writes)
}

// WritesOf are the committed writes of effect id.
func (f *Faults) WritesOf(id string) []Write {
	var out []Write
	for _, w := range f.Writes() {
		if w.ID == id {
			out = append(out, w)
		}
	}
	return out
}

func (f *Faults) decide(c Call) (When, error) {
	f.mu.Lock()
	inject := f.inject
	f.mu.Unlock()
	if inject == nil {
		return Pass, nil
	}
	when, err := inject(c)
	if when == Pass {
		return Pass, nil
	}
	if err == nil {
		err = ErrInjected
	}
	f.mu.Lock()
	if f.injected == nil {
		f.injected = map[Op]int{}
	}
	f.injected[c.Op]++
	f.mu.Unlock()
	return when, err
}

// frame gathers the writes of one transaction until it commits (into its parent, or into
// the record when it is the outermost one).
type frame struct {
	mu     sync.Mutex
	writes []Write
}

func (f *Faults) keep(fr *frame, ws []Write) {
	if len(ws) == 0 {
		return
	}
	if fr != nil {
		fr.mu.Lock()
		fr.writes = append(fr.writes, ws...)
		fr.mu.Unlock()
		return
	}
	f.mu.Lock()
	f.writes = append(f.writes, ws...)
	f.mu.Unlock()
}

// statement runs one call: decide its fault, make it (unless Before), keep its writes in
// fr (nil: committed now) and fail it After if so decided.
func (f *Faults) statement(fr *frame, c Call, run func() ([]Write, error)) error {
	when, ferr := f.decide(c)
	if when == Before {
		return ferr
	}
	ws, err := run()
	if err != nil {
		return err
	}
	f.keep(fr, ws)
	if when == After {
		return ferr
	}
	return nil
}

type frameKey struct{ f *Faults }

func (f *Faults) frameOf(ctx context.Context) *frame {
	fr, _ := ctx.Value(frameKey{f}).(*frame)
	return fr
}

// Wrap returns st with the faults: Transact, Within, LeaseEffects, BeginSends and
// EffectUpdate ask the Injector first, and so do EffectUpdate and the batch statements on
// the Queries its transactions hand out. It offers store.BatchQueries exactly when st
// does — on itself and on those Queries — so a caller takes the same paths as on st.
// (It does not offer st's other optional interfaces, such as store.EffectListener.)
func (f *Faults) Wrap(st store.Store) store.Store {
	s := &faultyStore{Store: st, f: f}
	if bq, ok := st.(store.BatchQueries); ok {
		return &faultyBatchStore{faultyStore: s, bq: bq}
	}
	return s
}

type faultyStore struct {
	store.Store
	f *Faults
}

// transaction runs one Transact or Within of the wrapped store: run makes the call, each
// run of its fn through body, which gets a fresh frame for the writes of that run.
func (s *faultyStore) transaction(ctx context.Context, op Op, run func(body func(fr *frame, fn func() error) error) error) error {
	parent := s.f.frameOf(ctx)
	when, ferr := s.f.decide(Call{Op: op, InTx: parent != nil})
	if when == Before {
		return ferr
	}
	var last *frame // the frame of fn's last run, if it succeeded
	err := run(func(fr *frame, fn func() error) error {
		err := fn()
		last = nil
		if err == nil {
			last = fr
		}
		return err
	})
	if err != nil {
		return err
	}
	if last != nil {
		last.mu.Lock()
		ws := last.writes
		last.mu.Unlock()
		s.f.keep(parent, ws)
	}
	if when == After {
		return ferr
	}
	return nil
}

func (s *faultyStore) Transact(ctx context.Context, fn func(q store.Queries) error) error {
	return s.transaction(ctx, OpTransact, func(body func(fr *frame, fn func() error) error) error {
		return s.Store.Transact(ctx, func(q store.Queries) error {
			fr := &frame{}
			return body(fr, func() error { return fn(s.f.queries(q, fr)) })
		})
	})
}

func (s *faultyStore) Within(ctx context.Context, fn func(ctx context.Context) error) error {
	return s.transaction(ctx, OpWithin, func(body func(fr *frame, fn func() error) error) error {
		return s.Store.Within(ctx, func(ctx context.Context) error {
			fr := &frame{}
			return body(fr, func() error { return fn(context.WithValue(ctx, frameKey{s.f}, fr)) })
		})
	})
}

func (s *faultyStore) LeaseEffects(ctx context.Context, p store.EffectLeaseParams) ([]store.Effect, error) {
	var out []store.Effect
	err := s.f.statement(s.f.frameOf(ctx), Call{Op: OpLeaseEffects, InTx: s.f.frameOf(ctx) != nil}, func() ([]Write, error) {
		var err error
		out, err = s.Store.LeaseEffects(ctx, p)
		return effectWrites(OpLeaseEffects, out), err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (s *faultyStore) BeginSends(ctx context.Context, owner string, ids []string, now *time.Time) ([]string, error) {
	var marked []string
	err := s.f.statement(s.f.frameOf(ctx), Call{Op: OpBeginSends, InTx: s.f.frameOf(ctx) != nil, IDs: ids}, func() ([]Write, error) {
		var err error
		marked, err = s.Store.BeginSends(ctx, owner, ids, now)
		ws := make([]Write, len(marked))
		for i, id := range marked {
			ws[i] = Write{Op: OpBeginSends, ID: id, To: store.EffectSending}
		}
		return ws, err
	})
	if err != nil {
		return nil, err
	}
	return marked, nil
}

func (s *faultyStore) EffectUpdate(ctx context.Context, p store.EffectUpdateParams) (store.Effect, error) {
	return updateOne(s.f, s.f.frameOf(ctx), s.f.frameOf(ctx) != nil, s.Store, ctx, p)
}

func effectWrites(op Op, es []store.Effect) []Write {
	ws := make([]Write, len(es))
	for i, e := range es {
		ws[i] = Write{Op: op, ID: e.ID, To: e.State}
	}
	return ws
}

func updateOne(f *Faults, fr *frame, inTx bool, q store.Queries, ctx context.Context, p store.EffectUpdateParams) (store.Effect, error) {
	var out store.Effect
	err := f.statement(fr, Call{Op: OpEffectUpdate, InTx: inTx, Updates: []store.EffectUpdateParams{p}}, func() ([]Write, error) {
		var err error
		out, err = q.EffectUpdate(ctx, p)
		return []Write{{Op: OpEffectUpdate, ID: p.ID, To: p.To}}, err
	})
	if err != nil {
		return store.Effect{}, err
	}
	return out, nil
}

func updateMany(f *Faults, fr *frame, inTx bool, op Op, ps []store.EffectUpdateParams,
	run func() ([]string, []bool, error)) ([]string, []bool, error) {
	var locked []string
	var applied []bool
	err := f.statement(fr, Call{Op: op, InTx: inTx, Updates: ps}, func() ([]Write, error) {
		var err error
		locked, applied, err = run()
		var ws []Write
		for i, ok := range applied {
			if ok {
				ws = append(ws, Write{Op: op, ID: ps[i].ID, To: ps[i].To})
			}
		}
		return ws, err
	})
	if err != nil {
		return nil, nil, err
	}
	return locked, applied, nil
}

// faultyBatchStore is a faultyStore over a store that offers store.BatchQueries.
type faultyBatchStore struct {
	*faultyStore
	bq store.BatchQueries
}

func (s *faultyBatchStore) EffectUpdateMany(ctx context.Context, ps []store.EffectUpdateParams, events [][]store.EventInsertParams) ([]bool, error) {
	fr := s.f.frameOf(ctx)
	_, applied, err := updateMany(s.f, fr, fr != nil, OpEffectUpdateMany, ps, func() ([]string, []bool, error) {
		applied, err := s.bq.EffectUpdateMany(ctx, ps, events)
		return nil, applied, err
	})
	return applied, err
}

func (s *faultyBatchStore) EffectUpdateManyLocked(ctx context.Context, ps []store.EffectUpdateParams, events [][]store.EventInsertParams) ([]string, []bool, error) {
	fr := s.f.frameOf(ctx)
	return updateMany(s.f, fr, fr != nil, OpEffectUpdateManyLocked, ps, func() ([]string, []bool, error) {
		return s.bq.EffectUpdateManyLocked(ctx, ps, events)
	})
}

// faultyQueries are a transaction's Queries with the faults; their writes go to fr.
type faultyQueries struct {
	store.Queries
	f  *Faults
	fr *frame
}

func (q faultyQueries) EffectUpdate(ctx context.Context, p store.EffectUpdateParams) (store.Effect, error) {
	return updateOne(q.f, q.fr, true, q.Queries, ctx, p)
}

type faultyBatchQueries struct {
	faultyQueries
	bq store.BatchQueries
}

func (q faultyBatchQueries) EffectUpdateMany(ctx context.Context, ps []store.EffectUpdateParams, events [][]store.EventInsertParams) ([]bool, error) {
	_, applied, err := updateMany(q.f, q.fr, true, OpEffectUpdateMany, ps, func() ([]string, []bool, error) {
		applied, err := q.bq.EffectUpdateMany(ctx, ps, events)
		return nil, applied, err
	})
	return applied, err
}

func (q faultyBatchQueries) EffectUpdateManyLocked(ctx context.Context, ps []store.EffectUpdateParams, events [][]store.EventInsertParams) ([]string, []bool, error) {
	return updateMany(q.f, q.fr, true, OpEffectUpdateManyLocked, ps, func() ([]string, []bool, error) {
		return q.bq.EffectUpdateManyLocked(ctx, ps, events)
	})
}

// queries wraps a transaction's Queries, keeping store.BatchQueries when q has it.
func (f *Faults) queries(q store.Queries, fr *frame) store.Queries {
	fq := faultyQueries{Queries: q, f: f, fr: fr}
	if bq, ok := q.(store.BatchQueries); ok {
		return faultyBatchQueries{faultyQueries: fq, bq: bq}
	}
	return fq
}
