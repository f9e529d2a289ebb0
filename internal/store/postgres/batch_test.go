package postgres_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/postgres"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// leased queues n effects on one run and leases them to owner: rows in sending.
func leased(t *testing.T, st *postgres.Store, key, owner string, n int) []store.Effect {
	t.Helper()
	ctx := context.Background()
	if _, err := st.Pool().Exec(ctx, `INSERT INTO workflow_runs (idempotency_key, state, payload_hash, lease_owner,
		lease_expires_at, created_at, updated_at) VALUES ($1, 'processing', 'h', 'client', now() + interval '5 minutes', now(), now())`, key); err != nil {
		t.Fatal(err)
	}
	return leaseEffects(t, st, key, owner, n)
}

// leaseEffects adds n pending effects to the run key and leases them to owner.
func leaseEffects(t *testing.T, st *postgres.Store, key, owner string, n int) []store.Effect {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		_, _, err := st.EffectInsert(ctx, store.Effect{ID: fmt.Sprintf("%s-%d", key, i), RunKey: key, EffectID: fmt.Sprintf("e%d", i),
			ActionType: "t", Target: "x", Executor: store.ExecutorDispatcher, Payload: json.RawMessage(`{}`), PayloadHash: "h",
			State: store.EffectPending})
		if err != nil {
			t.Fatal(err)
		}
	}
	var got []store.Effect
	err := st.Transact(ctx, func(q store.Queries) error {
		var err error
		got, err = q.EffectLease(ctx, store.EffectLeaseParams{Executor: store.ExecutorDispatcher, Caps: map[string]int{"t": n},
			Owner: owner, Lease: time.Minute, Limit: n})
		return err
	})
	if err != nil || len(got) != n {
		t.Fatalf("lease: %d effects, %v", len(got), err)
	}
	return got
}

// EffectUpdateMany leaves each row exactly as EffectUpdate leaves its twin, applies only
// under the row's own lease, and refuses what it does not batch.
func TestEffectUpdateManyIsEffectUpdate(t *testing.T) {
	st := storetest.OpenPostgres(t, nil).(*postgres.Store)
	ctx := context.Background()
	one := leased(t, st, "one", "owner-1", 4)
	many := leased(t, st, "many", "owner-2", 5)
	pid, class, nb := "p-1", "http_503", time.Now().Add(time.Hour).UTC().Truncate(time.Microsecond)
	empty := ""
	shapes := []store.EffectUpdateParams{
		{To: store.EffectCompleted, ProviderID: &pid, ErrorClass: &empty},
		{To: store.EffectPending, NotBefore: &nb, ErrorClass: &class},
		{To: store.EffectUnknown, ErrorClass: &class},
		{To: store.EffectFailed, ErrorClass: &class},
	}
	var ps []store.EffectUpdateParams
	for i, sh := range shapes {
		sh.From = []store.EffectState{store.EffectSending}
		sh.ID, sh.Owner = one[i].ID, "owner-1"
		if _, err := st.EffectUpdate(ctx, sh); err != nil {
			t.Fatal(err)
		}
		sh.ID, sh.Owner = many[i].ID, "owner-2"
		ps = append(ps, sh)
	}
	// The fifth is not ours: a lease lost (another owner).
	ps = append(ps, store.EffectUpdateParams{ID: many[4].ID, From: []store.EffectState{store.EffectSending}, Owner: "owner-1",
		To: store.EffectCompleted, ProviderID: &pid})
	// Two events for each update (three for the first), in an order the ids must keep.
	evs := make([][]store.EventInsertParams, len(ps))
	var wantKinds []string
	for i := range ps {
		for j := range 2 + btoi(i == 0) {
			kind := fmt.Sprintf("k%d-%d", i, j)
			evs[i] = append(evs[i], store.EventInsertParams{RunKey: "many", Kind: kind, Actor: "airlock",
				Detail: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))})
			if applies := i < 4; applies {
				wantKinds = append(wantKinds, kind)
			}
		}
	}
	evs[1][0].Detail = nil
	var applied []bool
	err := st.Transact(ctx, func(q store.Queries) error {
		var err error
		applied, err = q.(store.BatchQueries).EffectUpdateMany(ctx, ps, evs)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range shapes {
		want, err := st.EffectGet(ctx, one[i].ID)
		if err != nil {
			t.Fatal(err)
		}
		stored, _ := st.EffectGet(ctx, many[i].ID)
		if !applied[i] {
			t.Errorf("%d (%s): not applied", i, shapes[i].To)
		}
		e := stored
		e.ID, e.RunKey, e.CreatedAt, e.UpdatedAt = want.ID, want.RunKey, want.CreatedAt, want.UpdatedAt
		if shapes[i].NotBefore == nil { // each row's own queueing time, kept
			e.NotBefore = want.NotBefore
		}
		if fmt.Sprint(e) != fmt.Sprint(want) {
			t.Errorf("%d (%s):\n batch  %+v\n single %+v", i, shapes[i].To, e, want)
		}
	}
	if applied[4] {
		t.Error("an update under another owner's lease applied")
	}
	if e, _ := st.EffectGet(ctx, many[4].ID); e.State != store.EffectSending || e.LeaseOwner != "owner-2" {
		t.Errorf("the other owner's effect became %s/%q", e.State, e.LeaseOwner)
	}
	// Only the events of the updates that applied, in the order given.
	rows, err := st.Pool().Query(ctx, `SELECT kind, detail IS NULL FROM events WHERE run_key = 'many' ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for rows.Next() {
		var kind string
		var null bool
		if err := rows.Scan(&kind, &null); err != nil {
			t.Fatal(err)
		}
		if null != (kind == "k1-0") {
			t.Errorf("event %s: detail null %t", kind, null)
		}
		kinds = append(kinds, kind)
	}
	if fmt.Sprint(kinds) != fmt.Sprint(wantKinds) {
		t.Errorf("events %v, want %v", kinds, wantKinds)
	}
	for _, bad := range []store.EffectUpdateParams{
		{ID: many[4].ID, From: []store.EffectState{store.EffectSending}, To: store.EffectPending},                                  // unfenced
		{ID: many[4].ID, From: []store.EffectState{store.EffectUnknown}, Owner: "owner-2", To: store.EffectCompleted},              // not from sending
		{ID: many[4].ID, From: []store.EffectState{store.EffectSending}, Owner: "owner-2", To: store.EffectSending, Started: true}, // a begin-mark
		{ID: many[4].ID, From: []store.EffectState{store.EffectSending}, Owner: "owner-2", To: store.EffectPending, ReleaseAttempt: true},
	} {
		_, err := st.EffectUpdateMany(ctx, []store.EffectUpdateParams{bad}, nil)
		if !errors.Is(err, store.ErrUnbatchable) {
			t.Errorf("%+v: %v, want ErrUnbatchable", bad, err)
		}
	}
	twice := []store.EffectUpdateParams{ps[4], ps[4]}
	twice[0].Owner, twice[1].Owner = "owner-2", "owner-2"
	if _, err := st.EffectUpdateMany(ctx, twice, nil); !errors.Is(err, store.ErrUnbatchable) {
		t.Errorf("one id twice: %v, want ErrUnbatchable", err)
	}
	// The counters saw exactly the moves.
	counts, err := st.EffectCountByState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[store.EffectState]int{store.EffectCompleted: 2, store.EffectPending: 2, store.EffectUnknown: 2,
		store.EffectFailed: 2, store.EffectSending: 1}
	if fmt.Sprint(counts) != fmt.Sprint(want) {
		t.Errorf("counts %v, want %v", counts, want)
	}
}

// A value PostgreSQL cannot store in one of the events refuses the statement whole, as
// store.ErrInvalidValue (the recorder then isolates the outcomes): no update applies.
func TestEffectUpdateManyRefusedEvent(t *testing.T) {
	st := storetest.OpenPostgres(t, nil).(*postgres.Store)
	ctx := context.Background()
	effs := leased(t, st, "run", "o", 2)
	pid := "p"
	var ps []store.EffectUpdateParams
	var evs [][]store.EventInsertParams
	for i, e := range effs {
		ps = append(ps, store.EffectUpdateParams{ID: e.ID, From: []store.EffectState{store.EffectSending}, Owner: "o",
			To: store.EffectCompleted, ProviderID: &pid})
		detail := json.RawMessage(`{"ok":1}`)
		if i == 1 {
			detail = json.RawMessage(`{"x":"\u0000"}`)
		}
		evs = append(evs, []store.EventInsertParams{{RunKey: "run", Kind: "effect_completed", Actor: "airlock", Detail: detail}})
	}
	err := st.Transact(ctx, func(q store.Queries) error {
		_, err := q.(store.BatchQueries).EffectUpdateMany(ctx, ps, evs)
		return err
	})
	if !errors.Is(err, store.ErrInvalidValue) {
		t.Fatalf("a NUL in a detail: %v, want ErrInvalidValue", err)
	}
	for _, e := range effs {
		if got, _ := st.EffectGet(ctx, e.ID); got.State != store.EffectSending {
			t.Errorf("%s: %s after the refused statement", e.ID, got.State)
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
