package postgres_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

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
	type result struct {
		locked  []string
		applied []bool
		err     error
	}
	done := make(chan result, 1)
	go func() {
		ps, evs := completions("o1", race[0])
		locked, applied, err := st.EffectUpdateManyLocked(ctx, ps, evs)
		done <- result{locked, applied, err}
	}()
	// Wait (no deadline asserted) until the statement waits for the run's lock.
	for {
		var waiting bool
		if err := st.Pool().QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%FOR UPDATE OF r%')`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("the statement did not wait for the run's lock: %+v", r)
		case <-time.After(10 * time.Millisecond):
		}
	}
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
