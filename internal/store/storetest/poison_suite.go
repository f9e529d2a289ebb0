package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/store"
)

// Poison answers (issue 20, 3): an answer the store cannot keep as it is must never cost
// another outcome, nor the outcome itself.
var poisonTests = []struct {
	name string
	fn   func(t *testing.T, e *EffectsEnv)
}{
	{"RefusedValuesAreMarked", testRefusedValuesMarked},
	{"UnstorableProviderIDsDoNotStallTheGroup", testUnstorableProviderIDs},
	{"RefusedOutcomeIsIsolatedAtOnce", testRefusedOutcomeIsolated},
}

var errDown = errors.New("connection refused")

// Each backend marks its refusal of a statement's values as store.ErrInvalidValue (the
// recorder isolates such an outcome at once instead of retrying it), and nothing else.
func testRefusedValuesMarked(t *testing.T, e *EffectsEnv) {
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
	eff := queue(t, e, "k1", "note", "default", `{"n":1}`)
	for _, id := range []string{"a\x00b", "h-\xff\xfe"} {
		err := e.Store.Within(ctx, func(ctx context.Context) error {
			return e.Store.Transact(ctx, func(q store.Queries) error { // a savepoint, as the recorder's
				_, err := q.EffectUpdate(ctx, store.EffectUpdateParams{ID: eff.ID, From: []store.EffectState{store.EffectPending},
					To: store.EffectPending, ProviderID: &id})
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
func answerTogether(e *EffectsEnv, n int32, reply func(w http.ResponseWriter, key string)) {
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
func eventDetail(t *testing.T, e *EffectsEnv, key, kind string) map[string]any {
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
	t.Fatalf("no %s event on %s: %v", kind, key, kinds(t, e.Env, key))
	return nil
}

// A provider answers 2xx with an id PostgreSQL cannot store (bytes that are not UTF-8 in
// X-Provider-Id, a NUL in the body's id) while four other sends finish at the same time.
// Every effect completes at once — the two with their ids kept escaped, and a note — and
// none waits for a lease to end. Before: on PostgreSQL the group's record failed (22021),
// the per-item retries held every outcome of the instance until the lease ended, and the
// two confirmed sends ended unknown.
func testUnstorableProviderIDs(t *testing.T, e *EffectsEnv) {
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
		effs = append(effs, queue(t, e, k, "note", "default", `{"n":1}`))
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
	equal(t, "provider requests", e.Provider.Total(), len(keys))
}

// refusingStore refuses, as PostgreSQL refuses bytes it cannot store, every effect update
// whose provider id holds "poison": the store's refusal of one item's values, whatever the
// backend (SQLite would store anything the connector gave).
type refusingStore struct{ store.Store }

func (r refusingStore) Transact(ctx context.Context, fn func(q store.Queries) error) error {
	return r.Store.Transact(ctx, func(q store.Queries) error { return fn(refusingQueries{q}) })
}

type refusingQueries struct{ store.Queries }

func (q refusingQueries) EffectUpdate(ctx context.Context, p store.EffectUpdateParams) (store.Effect, error) {
	if p.ProviderID != nil && strings.Contains(*p.ProviderID, "poison") {
		return store.Effect{}, fmt.Errorf("update effect: %w", store.ErrInvalidValue)
	}
	return q.Queries.EffectUpdate(ctx, p)
}

// The store refuses one outcome's values (even sanitised: a constraint, say) in a group of
// five: the four others commit in the same round, and the refused one is recorded at
// once without its provider id, with a note — never retried until its lease ends.
func testRefusedOutcomeIsolated(t *testing.T, e *EffectsEnv) {
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
		effs = append(effs, queue(t, e, k, "note", "default", `{"n":1}`))
	}
	const lease = 30 * time.Second
	d := &effects.Dispatcher{Service: e.NewService(refusingStore{e.Store}, e.Clock.Now), BatchSize: 16, Concurrency: 16, Lease: lease}
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
