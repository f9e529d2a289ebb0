package postgres_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/store/postgres"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// The begin-mark is a HOT update (0022_effects_hot.sql): it changes no column an index
// names, so PostgreSQL writes its row version beside the old one, with no index entry.
// (Before, it also set updated_at, which two indexes name: every mark went into every index.)
func TestBeginMarkIsHOT(t *testing.T) {
	if os.Getenv("AIRLOCK_TEST_CITUS") == "1" {
		// The updates happen on the workers' shards: the coordinator's effects table
		// counts none, and settled would wait for ever.
		t.Skip("effects' row statistics are the workers' on Citus")
	}
	cfg := storetest.NewPostgresSchema(t)
	cfg.MaxConns = 1 // one backend: its statistics are flushed on request (pg_stat_force_next_flush)
	st, err := postgres.OpenConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if err := st.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	got := leased(t, st, "hot", "owner-1", 8)
	ids := make([]string, len(got))
	for i, e := range got {
		ids[i] = e.ID
	}
	before := settled(t, st, int64(len(ids))) // the lease's updates
	marked, err := st.BeginSends(ctx, "owner-1", ids, nil)
	if err != nil || len(marked) != len(ids) {
		t.Fatalf("marked %d of %d: %v", len(marked), len(ids), err)
	}
	after := settled(t, st, before[0]+int64(len(ids)))
	if upd, hot := after[0]-before[0], after[1]-before[1]; upd != int64(len(ids)) || hot != upd {
		t.Fatalf("the marks: %d updates of effects, %d of them HOT; want %d and all", upd, hot, len(ids))
	}
}

// settled waits until effects' statistics count at least n updates (they are flushed
// once the backend is idle) and returns them.
func settled(t *testing.T, st *postgres.Store, n int64) [2]int64 {
	t.Helper()
	for {
		if u := updates(t, st); u[0] >= n {
			return u
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// updates reads effects' counts of updated and HOT-updated rows, after asking the one
// backend to flush its pending statistics.
func updates(t *testing.T, st *postgres.Store) [2]int64 {
	t.Helper()
	ctx := context.Background()
	if _, err := st.Pool().Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		t.Fatal(err)
	}
	var n [2]int64
	if err := st.Pool().QueryRow(ctx, `SELECT pg_stat_get_tuples_updated('effects'::regclass),
		pg_stat_get_tuples_hot_updated('effects'::regclass)`).Scan(&n[0], &n[1]); err != nil {
		t.Fatal(err)
	}
	return n
}
