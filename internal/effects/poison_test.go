package effects_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// Poison answers: an answer the store cannot keep as it is, or a store
// that refuses every write for longer than the lease, must never cost another outcome, nor
// the outcome itself when it is known.
func TestRefusedValuesAreMarked(t *testing.T) { apptest.EachEffects(t, testRefusedValuesMarked) }
func TestUnstorableProviderIDsDoNotStallTheGroup(t *testing.T) {
	apptest.EachEffects(t, testUnstorableProviderIDs)
}
func TestRefusedOutcomeIsIsolatedAtOnce(t *testing.T) {
	apptest.EachEffects(t, testRefusedOutcomeIsolated)
}
func TestKnownOutcomeOutlivesAnUnwritableStore(t *testing.T) {
	apptest.EachEffects(t, testLateOutcomeApplied)
}
func TestLateOutcomeNeverOverwritesALaterSend(t *testing.T) {
	apptest.EachEffects(t, testLateOutcomeStale)
}
func TestLateOutcomesAreLoggedAtShutdown(t *testing.T) {
	apptest.EachEffects(t, testLateOutcomeShutdown)
}

// Each backend marks its refusal of a statement's values as store.ErrInvalidValue (the
// recorder isolates such an outcome at once instead of retrying it), and nothing else.
func testRefusedValuesMarked(t *testing.T, e *apptest.EffectsEnv) {
	k := store.APIKey{ID: "dup", Name: "dup", Hash: "h-dup", Scopes: []string{"read"}, CreatedAt: e.Clock.Now()}
	err := e.Store.Transact(ctx, func(q store.Queries) error {
		if err := q.APIKeyInsert(ctx, k); err != nil {
			return err
		}
		return q.APIKeyInsert(ctx, k)
	})
	if !errors.Is(err, store.ErrInvalidValue) {
		t.Errorf("a unique constraint violation: %v, want ErrInvalidValue", err)
	}
	if err := e.Store.Transact(ctx, func(q store.Queries) error { return errDown }); errors.Is(err, store.ErrInvalidValue) || !errors.Is(err, errDown) {
		t.Errorf("a failure of the caller's: %v", err)
	}
	if e.Store.Backend() != "postgres" {
		return // SQLite stores any bytes in text
	}
	eff := e.Queue(t, "k1", "note", "default", `{"n":1}`)
	for _, id := range []string{"a\x00b", "h-\xff\xfe"} {
		err := e.Store.Within(ctx, func(ctx context.Context) error {
			return e.Store.Transact(ctx, func(q store.Queries) error { // a savepoint, as the recorder's
				_, err := q.EffectUpdate(ctx, store.EffectUpdateParams{ID: eff.ID, From: []store.EffectState{store.EffectPending},
					Version: eff.Version, To: store.EffectPending, ProviderID: &id})
				return err
			})
		})
		if !errors.Is(err, store.ErrInvalidValue) {
			t.Errorf("provider id %q: %v, want ErrInvalidValue", id, err)
		}
	}
}

// answerTogether makes the provider hold each of the first n requests until all n have
// arrived (or 2 s passed), so their outcomes reach the recorder together and share a
// group commit; reply then answers each.
func answerTogether(e *apptest.EffectsEnv, n int32, reply func(w http.ResponseWriter, key string)) {
	var arrived atomic.Int32
	all := make(chan struct{})
	e.Provider.Reply = func(w http.ResponseWriter, r *http.Request, _ int) {
		if arrived.Add(1) == n {
			close(all)
		}
		select {
		case <-all:
		case <-time.After(2 * time.Second):
		}
		reply(w, r.Header.Get("Idempotency-Key"))
	}
}

// eventDetail returns the detail of the run's last event of kind.
func eventDetail(t *testing.T, e *apptest.EffectsEnv, key, kind string) map[string]any {
	t.Helper()
	evs, err := e.Store.EventList(ctx, key, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Kind == kind {
			var d map[string]any
			if err := json.Unmarshal(evs[i].Detail, &d); err != nil {
				t.Fatal(err)
			}
			return d
		}
	}
	t.Fatalf("no %s event on %s: %v", kind, key, e.Kinds(t, key))
	return nil
}

// A provider answers 2xx with an id PostgreSQL cannot store (bytes that are not UTF-8 in
// X-Provider-Id, a NUL in the body's id) while four other sends finish at the same time.
// Every effect completes at once — the two with their ids kept escaped, and a note — and
// none waits for a lease to end. Before: on PostgreSQL the group's record failed (22021),
// the per-item retries held every outcome of the instance until the lease ended, and the
// two confirmed sends ended unknown.
func testUnstorableProviderIDs(t *testing.T, e *apptest.EffectsEnv) {
	answerTogether(e, 6, func(w http.ResponseWriter, key string) {
		switch {
		case strings.HasPrefix(key, "bad-header/"):
			w.Header().Set("X-Provider-Id", "h-\xff\xfe")
			w.WriteHeader(http.StatusCreated)
		case strings.HasPrefix(key, "bad-body/"):
			w.WriteHeader(http.StatusCreated)
			fmt.Fprint(w, `{"id":"b-\u0000-1"}`)
		default:
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"id":"p-%s"}`, key)
		}
	})
	keys := []string{"bad-header", "bad-body", "ok-1", "ok-2", "ok-3", "ok-4"}
	var effs []store.Effect
	for _, k := range keys {
		effs = append(effs, e.Queue(t, k, "note", "default", `{"n":1}`))
	}
	const lease = 30 * time.Second
	d := &effects.Dispatcher{Service: e.Effects, BatchSize: 16, Concurrency: 16, Lease: lease}
	start := time.Now()
	n, err := d.Tick(ctx)
	took := time.Since(start)
	if err != nil || n != len(keys) {
		t.Fatalf("tick: leased %d, %v", n, err)
	}
	want := map[string]string{"bad-header": strconv.Quote("h-\xff\xfe"), "bad-body": strconv.Quote("b-\x00-1")}
	for i, eff := range effs {
		got, err := e.Effects.Get(ctx, eff.ID)
		if err != nil {
			t.Fatal(err)
		}
		id, ok := want[keys[i]]
		if !ok {
			id = "p-" + effects.ProviderKey(eff)
		}
		if got.State != store.EffectCompleted || got.ProviderID != id {
			t.Errorf("%s: %s with provider id %q, want completed with %q", keys[i], got.State, got.ProviderID, id)
		}
	}
	if took > lease/3 {
		t.Errorf("recording took %v (lease %v): one outcome held up the others", took, lease)
	}
	for _, k := range []string{"bad-header", "bad-body"} {
		if d := eventDetail(t, e, k, "effect_completed"); d["provider_id_note"] != "provider_id_escaped" {
			t.Errorf("%s: effect_completed %v, want provider_id_note provider_id_escaped", k, d)
		}
	}
	apptest.Equal(t, "provider requests", e.Provider.Total(), len(keys))
}

// refusing refuses, as PostgreSQL refuses bytes it cannot store, every effect update
// whose provider id holds "poison" — a batch statement holding one whole, as PostgreSQL
// refuses a statement: the store's refusal of one item's values, whatever the backend
// (SQLite would store anything the connector gave). Over storetest.Faults, the recorder
// takes the same paths as over st, the batch statements included.
func refusing(st store.Store) store.Store {
	var f storetest.Faults
	f.Set(func(c storetest.Call) (storetest.When, error) {
		for _, p := range c.Updates {
			if p.ProviderID != nil && strings.Contains(*p.ProviderID, "poison") {
				return storetest.Before, fmt.Errorf("update effect: %w", store.ErrInvalidValue)
			}
		}
		return storetest.Pass, nil
	})
	return f.Wrap(st)
}

// The store refuses one outcome's values (even sanitised: a constraint, say) in a group of
// five: the four others commit in the same round, and the refused one is recorded at
// once without its provider id, with a note — never retried until its lease ends.
func testRefusedOutcomeIsolated(t *testing.T, e *apptest.EffectsEnv) {
	answerTogether(e, 5, func(w http.ResponseWriter, key string) {
		w.WriteHeader(http.StatusCreated)
		if strings.HasPrefix(key, "refused/") {
			fmt.Fprint(w, `{"id":"poison-1"}`)
			return
		}
		fmt.Fprintf(w, `{"id":"p-%s"}`, key)
	})
	keys := []string{"refused", "ok-1", "ok-2", "ok-3", "ok-4"}
	var effs []store.Effect
	for _, k := range keys {
		effs = append(effs, e.Queue(t, k, "note", "default", `{"n":1}`))
	}
	const lease = 30 * time.Second
	d := &effects.Dispatcher{Service: e.NewService(refusing(e.Store), e.Clock.Now), BatchSize: 16, Concurrency: 16, Lease: lease}
	start := time.Now()
	if _, err := d.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > lease/3 {
		t.Errorf("recording took %v (lease %v): the refused outcome was retried", took, lease)
	}
	for i, eff := range effs {
		got, _ := e.Effects.Get(ctx, eff.ID)
		id := "p-" + effects.ProviderKey(eff)
		if keys[i] == "refused" {
			id = ""
		}
		if got.State != store.EffectCompleted || got.ProviderID != id {
			t.Errorf("%s: %s with provider id %q, want completed with %q", keys[i], got.State, got.ProviderID, id)
		}
	}
	if d := eventDetail(t, e, "refused", "effect_completed"); d["provider_id_note"] != "provider_id_unstorable" {
		t.Errorf("effect_completed %v, want provider_id_note provider_id_unstorable", d)
	}
}

// downStore refuses, while down is set, every transaction and every statement that
// commits on its own (the lease, the begin-mark, the batch outcome statement), as an
// unreachable (or full) database does.
type downStore struct {
	down   atomic.Bool
	faults storetest.Faults
}

var errDown = errors.New("connection refused")

// newDownStore returns the switch and st behind it.
func newDownStore(st store.Store) (*downStore, store.Store) {
	s := &downStore{}
	s.faults.Set(func(c storetest.Call) (storetest.When, error) {
		if s.down.Load() && !c.InTx {
			return storetest.Before, errDown
		}
		return storetest.Pass, nil
	})
	return s, s.faults.Wrap(st)
}

// sendThenGoDown runs one round of a dispatcher whose store stops accepting writes right
// after the provider answered, and stays down past the lease (300 ms): the outcome is
// known, and unrecorded when the lease ends.
func sendThenGoDown(t *testing.T, e *apptest.EffectsEnv, d *effects.Dispatcher, down *downStore, eff store.Effect) {
	t.Helper()
	d.Hook = apptest.HookOn("sent", func() { down.down.Store(true) })
	if _, err := d.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	d.Hook = nil
	apptest.Equal(t, "state while the store refused writes", e.EffectState(t, eff.ID), store.EffectSending)
	apptest.Equal(t, "requests", e.Provider.Total(), 1)
}

// The store refuses writes from the provider's 2xx until after the lease ended: the
// sweeper marks the effect unknown (lease_expired) once the store is back, and the
// dispatcher, which kept the outcome, applies it then — completed with its provider id,
// and an effect_reconciled event that says where the proof came from. Before: the outcome
// was dropped at the lease's end and the effect stayed unknown.
func testLateOutcomeApplied(t *testing.T, e *apptest.EffectsEnv) {
	eff := e.Queue(t, "k1", "note", "default", `{"n":1}`)
	down, st := newDownStore(e.Store)
	d := &effects.Dispatcher{Service: e.NewService(st, e.Clock.Now), Lease: 300 * time.Millisecond}
	sendThenGoDown(t, e, d, down, eff)
	e.Clock.Advance(time.Minute) // the lease has lapsed on the database's clock too
	down.down.Store(false)
	if _, err := d.Tick(ctx); err != nil { // sweeps (unknown), then applies the kept outcome
		t.Fatal(err)
	}
	got, _ := e.Effects.Get(ctx, eff.ID)
	if want := "p-" + effects.ProviderKey(eff); got.State != store.EffectCompleted || got.ProviderID != want {
		t.Fatalf("effect %s with provider id %q, want completed with %q", got.State, got.ProviderID, want)
	}
	apptest.Equal(t, "events", e.Kinds(t, "k1")[2:], []string{"effect_unknown", "alert", "effect_reconciled"})
	detail := eventDetail(t, e, "k1", "effect_reconciled")
	if detail["source"] != "dispatcher's late outcome" || detail["provider_id"] != got.ProviderID {
		t.Errorf("effect_reconciled %v: want source \"dispatcher's late outcome\" and the provider id", detail)
	}
	evs, _ := e.Store.EventList(ctx, "k1", 0, 100)
	if s, want := audit.Summary(evs[len(evs)-1]), "reconciled: 1 found by the dispatcher's late outcome; provider id "+got.ProviderID; !strings.HasSuffix(s, want) {
		t.Errorf("timeline: %q, want it to end %q", s, want)
	}
	apptest.Equal(t, "requests", e.Provider.Total(), 1)
}

// A kept outcome is applied only to the effect as its lease left it. Here, meanwhile, a
// person resolved the unknown effect not_sent, another sender took it (a new attempt) and
// its lease lapsed too: unknown for lease_expired again. The late outcome must not apply.
func testLateOutcomeStale(t *testing.T, e *apptest.EffectsEnv) {
	eff := e.Queue(t, "k1", "note", "default", `{"n":1}`)
	down, st := newDownStore(e.Store)
	d := &effects.Dispatcher{Service: e.NewService(st, e.Clock.Now), Lease: 300 * time.Millisecond}
	sendThenGoDown(t, e, d, down, eff)
	e.Clock.Advance(time.Minute)
	if err := e.Effects.SweepExpired(ctx); err != nil { // another instance, on a working store
		t.Fatal(err)
	}
	if _, err := e.Effects.Resolve(ctx, eff.ID, effects.Resolution{Outcome: effects.OutcomeNotSent, ProviderID: "", Note: "checked: not there"}, "ops"); err != nil {
		t.Fatal(err)
	}
	err := e.Store.Transact(ctx, func(q store.Queries) error {
		now := e.Clock.Now()
		leased, err := q.EffectLease(ctx, store.EffectLeaseParams{Executor: store.ExecutorDispatcher, Caps: apptest.AllTypes(e.Policy),
			Owner: "second", Lease: time.Minute, Limit: 10, Now: &now})
		if err != nil || len(leased) != 1 {
			return fmt.Errorf("lease again: %d %v", len(leased), err)
		}
		_, err = q.EffectUpdate(ctx, store.EffectUpdateParams{ID: eff.ID, From: []store.EffectState{store.EffectSending},
			Owner: "second", To: store.EffectSending, Started: true, Now: &now})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	e.Clock.Advance(2 * time.Minute)
	if err := e.Effects.SweepExpired(ctx); err != nil {
		t.Fatal(err)
	}
	before, _ := e.Effects.Get(ctx, eff.ID)
	apptest.Equal(t, "after the second sender's lease lapsed", before.State, store.EffectUnknown)
	apptest.Equal(t, "attempts", before.Attempts, 2)
	down.down.Store(false)
	if _, err := d.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	after, _ := e.Effects.Get(ctx, eff.ID)
	if after.State != store.EffectUnknown || after.ProviderID != "" || after.LastErrorClass != "lease_expired" {
		t.Fatalf("the stale outcome applied: %s, provider id %q, class %q", after.State, after.ProviderID, after.LastErrorClass)
	}
	if d.LateOutcomes() != 0 {
		t.Errorf("%d late outcomes still kept: one that cannot apply is dropped", d.LateOutcomes())
	}
}

// A dispatcher stopping while the store still refuses writes logs every kept outcome with
// its provider id: what a person needs to resolve the effect as sent.
func testLateOutcomeShutdown(t *testing.T, e *apptest.EffectsEnv) {
	eff := e.Queue(t, "k1", "note", "default", `{"n":1}`)
	down, st := newDownStore(e.Store)
	logs := &apptest.LockedBuffer{}
	b := e.Base(st, e.Clock.Now)
	b.Log = slog.New(slog.NewJSONHandler(logs, nil))
	svc := e.NewServiceOn(b)
	svc.Hook = apptest.HookOn("sent", func() { down.down.Store(true) })
	d := &effects.Dispatcher{Service: svc, Lease: 300 * time.Millisecond, Interval: 10 * time.Millisecond, Drain: time.Second}
	runCtx, stop := context.WithCancel(ctx)
	stopped := make(chan struct{})
	go func() { d.Run(runCtx); close(stopped) }()
	apptest.WaitFor(t, "the outcome to be kept past its lease", func() bool { return d.LateOutcomes() == 1 })
	stop()
	<-stopped
	want := "p-" + effects.ProviderKey(eff)
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "lost at shutdown") && strings.Contains(line, `"provider_id":"`+want+`"`) {
			return
		}
	}
	t.Fatalf("no shutdown line with provider id %s in:\n%s", want, logs.String())
}
