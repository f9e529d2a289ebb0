package postgres_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/postgres"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

func completions(owner string, es ...store.Effect) ([]store.EffectUpdateParams, [][]store.EventInsertParams) {
	var ps []store.EffectUpdateParams
	var evs [][]store.EventInsertParams
	for i, e := range es {
		pid := fmt.Sprintf("p-%d", i)
		ps = append(ps, store.EffectUpdateParams{ID: e.ID, From: []store.EffectState{store.EffectSending}, Owner: owner,
			To: store.EffectCompleted, ProviderID: &pid})
		evs = append(evs, []store.EventInsertParams{{RunKey: e.RunKey, Kind: "effect_completed", Actor: "airlock"}})
	}
	return ps, evs
}

// skipOnCitus skips a test of EffectUpdateManyLocked's statement, which declines on a
// Citus coordinator (TestEffectUpdateManyLockedDeclinesOnCitus).
func skipOnCitus(t *testing.T) {
	if os.Getenv("AIRLOCK_TEST_CITUS") == "1" {
		t.Skip("on Citus EffectUpdateManyLocked declines: its run locks would be one FOR UPDATE across shards")
	}
}

// lockedResult is what EffectUpdateManyLocked returned.
type lockedResult struct {
	locked  []string
	applied []bool
	err     error
}

// lockedWaiting starts EffectUpdateManyLocked in a goroutine and returns once the
// statement waits for a run's lock (no deadline asserted), with the channel its result
// comes on; it fails the test if the statement ends without waiting.
func lockedWaiting(t *testing.T, st *postgres.Store, ps []store.EffectUpdateParams, evs [][]store.EventInsertParams) <-chan lockedResult {
	t.Helper()
	ctx := context.Background()
	done := make(chan lockedResult, 1)
	go func() {
		locked, applied, err := st.EffectUpdateManyLocked(ctx, ps, evs)
		done <- lockedResult{locked, applied, err}
	}()
	for {
		var waiting bool
		if err := st.Pool().QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%FOR UPDATE OF r%')`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			return done
		}
		select {
		case r := <-done:
			t.Fatalf("the statement did not wait for the run's lock: %+v", r)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// On Citus EffectUpdateManyLocked locks nothing, applies nothing and changes no row: the
// dispatcher then records the group in its transaction.
func TestEffectUpdateManyLockedDeclinesOnCitus(t *testing.T) {
	if os.Getenv("AIRLOCK_TEST_CITUS") != "1" {
		t.Skip("needs a Citus cluster: run under scripts/with-citus.sh")
	}
	st := storetest.OpenPostgres(t, nil).(*postgres.Store)
	ctx := context.Background()
	es := leased(t, st, "decl", "o1", 2)
	ps, evs := completions("o1", es...)
	locked, applied, err := st.EffectUpdateManyLocked(ctx, ps, evs)
	if err != nil || len(locked) != 0 || len(applied) != 2 || applied[0] || applied[1] {
		t.Fatalf("locked %v, applied %v, err %v: want nothing locked or applied", locked, applied, err)
	}
	for _, e := range es {
		got, err := st.EffectGet(ctx, e.ID)
		if err != nil || got.State != store.EffectSending {
			t.Errorf("effect %s: %s, %v; want still sending", e.ID, got.State, err)
		}
	}
}

// EffectUpdateManyLocked applies, in autocommit, only the updates of runs it locked —
// those not approved — with their events, and says which runs it locked.
func TestEffectUpdateManyLockedSkipsApprovedRuns(t *testing.T) {
	skipOnCitus(t)
	st := storetest.OpenPostgres(t, nil).(*postgres.Store)
	ctx := context.Background()
	proc := leased(t, st, "proc", "o1", 2)
	appr := leased(t, st, "appr", "o1", 1)
	if _, err := st.Pool().Exec(ctx, `UPDATE workflow_runs SET state = 'approved' WHERE idempotency_key = 'appr'`); err != nil {
		t.Fatal(err)
	}
	ps, evs := completions("o1", proc[0], appr[0], proc[1])
	locked, applied, err := st.EffectUpdateManyLocked(ctx, ps, evs)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(locked) != "[proc]" || fmt.Sprint(applied) != "[true false true]" {
		t.Fatalf("locked %v, applied %v; want [proc], [true false true]", locked, applied)
	}
	for i, want := range map[int]string{0: "p-0", 2: "p-2"} {
		if e, _ := st.EffectGet(ctx, ps[i].ID); e.State != store.EffectCompleted || e.ProviderID != want {
			t.Fatalf("update %d left %s/%q, want completed/%q", i, e.State, e.ProviderID, want)
		}
	}
	for key, want := range map[string]int{"proc": 2, "appr": 0} {
		var n int
		if err := st.Pool().QueryRow(ctx, `SELECT count(*) FROM events WHERE run_key = $1 AND kind = 'effect_completed'`, key).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != want {
			t.Errorf("%s: %d events, want %d", key, n, want)
		}
	}
	if e, _ := st.EffectGet(ctx, appr[0].ID); e.State != store.EffectSending {
		t.Errorf("the approved run's effect became %s", e.State)
	}
}

// The run lock comes first and is real: while another transaction holds the run, the
// statement waits for it; if that transaction makes the run approved, the statement sees
// the run as committed then and applies nothing of it (a settle it would have skipped).
func TestEffectUpdateManyLockedWaitsForTheRun(t *testing.T) {
	skipOnCitus(t)
	st := storetest.OpenPostgres(t, nil).(*postgres.Store)
	ctx := context.Background()
	race := leased(t, st, "race", "o1", 1)
	tx, err := st.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT 1 FROM workflow_runs WHERE idempotency_key = 'race' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	ps, evs := completions("o1", race[0])
	done := lockedWaiting(t, st, ps, evs)
	if _, err := tx.Exec(ctx, `UPDATE workflow_runs SET state = 'approved' WHERE idempotency_key = 'race'`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || len(r.locked) != 0 || r.applied[0] {
		t.Fatalf("after the run became approved: locked %v, applied %v, %v; want nothing", r.locked, r.applied, r.err)
	}
	if e, _ := st.EffectGet(ctx, race[0].ID); e.State != store.EffectSending {
		t.Errorf("the effect became %s", e.State)
	}
}

// The locked outcome statement links the events it writes itself (0039): for a run whose
// head is in its row, each event's link continues the run's chain from the head the
// statement locked, events of one run in one statement chain in id order (several
// effects of the run in the group, several events per effect), and the run's head moves
// to the last. A run whose head is in event_chains (chained before 0035), or that has no
// head yet, is linked by the trigger as before. An update that does not apply writes no
// event and leaves its run's head; an approved run is not touched. A writer that commits
// an event of a run while the statement waits for the run's lock is continued from: the
// statement links from the head FOR UPDATE returned, not from its snapshot's. Every link
// is store.ChainHash's.
func TestOutcomeLinksItsOwnEvents(t *testing.T) {
	skipOnCitus(t)
	st := storetest.OpenPostgres(t, nil).(*postgres.Store)
	ctx := context.Background()
	claim := func(key string) {
		if _, err := st.Claim(ctx, store.ClaimParams{RunClaimParams: store.RunClaimParams{Key: key, PayloadHash: "h",
			Owner: "client", Lease: time.Minute}, Actor: "api", AlertAfter: 100}); err != nil {
			t.Fatal(err)
		}
	}
	// Heads in the runs' rows (a claim links its run's first event).
	for _, key := range []string{"fold-a", "fold-b", "fold-wrong", "fold-appr"} {
		claim(key)
	}
	leaseEffects(t, st, "fold-a", "o1", 3)
	leaseEffects(t, st, "fold-b", "o1", 1)
	leaseEffects(t, st, "fold-wrong", "o1", 1)
	leaseEffects(t, st, "fold-appr", "o1", 1)
	if _, err := st.Pool().Exec(ctx, `UPDATE workflow_runs SET state = 'approved' WHERE idempotency_key = 'fold-appr'`); err != nil {
		t.Fatal(err)
	}
	// A head in event_chains: the key's events before its run existed, as a run chained
	// before 0035 keeps it.
	for i := range 2 {
		if _, err := st.EventInsert(ctx, store.EventInsertParams{RunKey: "fold-old", Kind: fmt.Sprintf("before-%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	leased(t, st, "fold-old", "o1", 2)
	// No head anywhere yet (a run inserted without the claim statement).
	leased(t, st, "fold-none", "o1", 1)

	at := time.Date(2026, 3, 4, 5, 6, 7, 891011000, time.UTC)
	metas := []json.RawMessage{nil, json.RawMessage(`{"trace_id": "t",  "n": 1.50, "a": [true, null]}`), json.RawMessage(`[]`)}
	details := []json.RawMessage{json.RawMessage(`{"b": "ü – 12", "a": {"y": 1, "x": [true, null, 1e3]}}`), nil,
		json.RawMessage(`"a\"b\\c\n"`), json.RawMessage(`{"": ""}`)}
	var ps []store.EffectUpdateParams
	var evs [][]store.EventInsertParams
	var order []string // the applied updates' events, in the group's order
	n := 0
	add := func(id, owner string, events int, applies bool) {
		key := id[:strings.LastIndex(id, "-")]
		pid := "p-" + id
		ps = append(ps, store.EffectUpdateParams{ID: id, From: []store.EffectState{store.EffectSending}, Owner: owner,
			To: store.EffectCompleted, ProviderID: &pid})
		var es []store.EventInsertParams
		for j := range events {
			kind := fmt.Sprintf("out-%s-%d", id, j)
			e := store.EventInsertParams{RunKey: key, Kind: kind, Version: int64(n), Actor: "airlock ☃",
				Meta: metas[n%len(metas)], Detail: details[n%len(details)]}
			if n%2 == 1 {
				e.Now = &at
			}
			n++
			es = append(es, e)
			if applies {
				order = append(order, kind)
			}
		}
		evs = append(evs, es)
	}
	add("fold-a-0", "o1", 1, true)
	add("fold-b-0", "o1", 3, true)
	add("fold-old-0", "o1", 2, true)
	add("fold-a-1", "o1", 1, true)
	add("fold-wrong-0", "o2", 1, false) // not its lease: does not apply
	add("fold-none-0", "o1", 2, true)
	add("fold-appr-0", "o1", 1, false) // approved: not locked
	add("fold-old-1", "o1", 1, true)
	add("fold-a-2", "o1", 2, true)

	// Another writer holds fold-a and writes an event of it through the trigger; it
	// commits while the statement waits for the run.
	tx, err := st.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT 1 FROM workflow_runs WHERE idempotency_key = 'fold-a' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO events (run_key, at, kind, detail) VALUES ('fold-a', now(), 'racer', '{"r": 1}')`); err != nil {
		t.Fatal(err)
	}
	done := lockedWaiting(t, st, ps, evs)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if got, want := fmt.Sprint(r.locked), "[fold-a fold-b fold-none fold-old fold-wrong]"; got != want {
		t.Fatalf("locked %s, want %s", got, want)
	}
	if got, want := fmt.Sprint(r.applied), "[true true true true false true false true true]"; got != want {
		t.Fatalf("applied %s, want %s", got, want)
	}

	// The statement's events, by id: the group's order.
	rows, err := st.Pool().Query(ctx, `SELECT kind FROM events WHERE kind LIKE 'out-%' ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	kinds, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(kinds) != fmt.Sprint(order) {
		t.Fatalf("the statement's events by id %v, want the group's order %v", kinds, order)
	}
	// Every chain verifies, with the links each run should have: fold-a its claim, the
	// racer, then its four outcome events after the racer's link.
	want := map[string][]string{
		"fold-a":     {"claimed", "racer", "out-fold-a-0-0", "out-fold-a-1-0", "out-fold-a-2-0", "out-fold-a-2-1"},
		"fold-b":     {"claimed", "out-fold-b-0-0", "out-fold-b-0-1", "out-fold-b-0-2"},
		"fold-old":   {"before-0", "before-1", "out-fold-old-0-0", "out-fold-old-0-1", "out-fold-old-1-0"},
		"fold-none":  {"out-fold-none-0-0", "out-fold-none-0-1"},
		"fold-wrong": {"claimed"},
		"fold-appr":  {"claimed"},
	}
	for key, kinds := range want {
		var got []string
		for _, e := range verifyChain(t, st, key) {
			got = append(got, e.Kind)
		}
		if fmt.Sprint(got) != fmt.Sprint(kinds) {
			t.Errorf("%s: chain %v, want %v", key, got, kinds)
		}
	}
	// Where each head is: fold-old's still in event_chains only, the others' in the row.
	var inRuns, inChains string
	if err := st.Pool().QueryRow(ctx, `SELECT
		  (SELECT string_agg(idempotency_key || ':' || chain_seq, ' ' ORDER BY 1) FROM workflow_runs WHERE idempotency_key LIKE 'fold-%' AND chain_seq IS NOT NULL),
		  (SELECT string_agg(run_key || ':' || seq, ' ' ORDER BY 1) FROM event_chains WHERE run_key LIKE 'fold-%')`).Scan(&inRuns, &inChains); err != nil {
		t.Fatal(err)
	}
	if inRuns != "fold-a:6 fold-appr:1 fold-b:4 fold-none:2 fold-wrong:1" || inChains != "fold-old:5" {
		t.Fatalf("heads in runs' rows %q, in event_chains %q", inRuns, inChains)
	}
	// A second group continues the chains it linked (the heads it wrote are the next
	// statement's start), through the trigger too.
	ps2, evs2 := completions("o1", store.Effect{ID: "fold-wrong-0", RunKey: "fold-wrong"})
	if _, applied, err := st.EffectUpdateManyLocked(ctx, ps2, evs2); err != nil || !applied[0] {
		t.Fatalf("second group: %v, %v", applied, err)
	}
	for _, key := range []string{"fold-a", "fold-b"} {
		if _, err := st.EventInsert(ctx, store.EventInsertParams{RunKey: key, Kind: "after"}); err != nil {
			t.Fatal(err)
		}
	}
	for key, n := range map[string]int{"fold-a": 7, "fold-b": 5, "fold-wrong": 2} {
		if got := len(verifyChain(t, st, key)); got != n {
			t.Errorf("%s: %d links after the second group, want %d", key, got, n)
		}
	}
}
