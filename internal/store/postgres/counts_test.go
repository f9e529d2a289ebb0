package postgres_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/postgres"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// TestCountMigrationKeepsTheCitusPin: 0038 replaces the effect counters' trigger functions,
// which a Citus placement pinned to the schema (CREATE OR REPLACE drops a function's
// settings); it must set each function's settings again, and add none where there were
// none (one PostgreSQL).
func TestCountMigrationKeepsTheCitusPin(t *testing.T) {
	ctx := context.Background()
	st := migratedOnePostgres(t)
	functions := []string{"effect_count_inserted()", "effect_count_deleted()", "effect_count_updated()"}
	config := func() string {
		var c string
		if err := st.Pool().QueryRow(ctx, `SELECT coalesce(string_agg(p.oid::regprocedure::text || ':' || array_to_string(p.proconfig, ';'), ' ' ORDER BY p.oid), '')
			FROM pg_proc p WHERE p.oid = ANY($1::regprocedure[]) AND p.proconfig IS NOT NULL`, functions).Scan(&c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	var schema string
	if err := st.Pool().QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	if c := config(); c != "" {
		t.Fatalf("after the migrations on one PostgreSQL the counters' functions have settings %q", c)
	}
	b, err := os.ReadFile("migrations/0038_counts_of_settled.sql")
	if err != nil {
		t.Fatal(err)
	}
	migration := string(b)
	storetest.ExecRaw(t, st, migration)
	if c := config(); c != "" {
		t.Fatalf("0038 without a pin left settings %q", c)
	}
	for _, f := range functions {
		storetest.ExecRaw(t, st, `ALTER FUNCTION `+f+` SET search_path = `+schema)
	}
	storetest.ExecRaw(t, st, migration)
	var want []string
	for _, f := range functions {
		want = append(want, f+":search_path="+schema)
	}
	if c := config(); c != strings.Join(want, " ") {
		t.Fatalf("0038 over pinned functions left settings %q, want %q", c, strings.Join(want, " "))
	}
}

// TestCountsAfterPlacement applies 0038 to a schema migrated (and on Citus, placed)
// without it: the counters' functions are replaced everywhere they run (on Citus, on every
// worker: a multi-command migration string is what Citus refused for 0039's trigger), keep
// their settings, and an open state is no longer counted by them.
func TestCountsAfterPlacement(t *testing.T) {
	ctx := context.Background()
	st, ms := migratedBefore(t, 38)
	config := func() string {
		var c string
		if err := st.Pool().QueryRow(ctx, `SELECT coalesce(string_agg(p.proname || ':' || coalesce(array_to_string(p.proconfig, ';'), ''), ' ' ORDER BY p.proname), '')
			FROM pg_proc p WHERE p.proname LIKE 'effect_count_%' AND p.pronamespace = current_schema()::regnamespace`).Scan(&c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	was := config()
	done, err := st.ApplyMigrationList(ctx, ms, store.MigrateParams{})
	if err != nil {
		t.Fatal(err)
	}
	if len(done) == 0 || done[0] != "0038_counts_of_settled.sql" {
		t.Fatalf("applied %v", done)
	}
	if c := config(); c != was {
		t.Fatalf("the counters' functions' settings after 0038: %q, before: %q", c, was)
	}
	if citus, err := st.IsCitus(ctx); err != nil {
		t.Fatal(err)
	} else if citus {
		var schema string
		if err := st.Pool().QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
			t.Fatal(err)
		}
		var results []string
		if err := st.Pool().QueryRow(ctx, `SELECT array_agg(success::text || ':' || result)
			FROM run_command_on_workers(format($c$SELECT count(*) FROM pg_proc WHERE proname LIKE 'effect_count_%%'
			  AND pronamespace = %L::regnamespace AND prosrc LIKE '%%''completed''%%'$c$, $1::text))`, schema).Scan(&results); err != nil {
			t.Fatal(err)
		}
		for _, r := range results {
			if r != "true:3" {
				t.Fatalf("0038's counter functions on the workers (success:count of 3): %v", results)
			}
		}
		if len(results) == 0 {
			t.Fatal("no worker answered")
		}
	}
	// A pending effect writes no delta row; its count comes from the index.
	if _, err := st.Claim(ctx, store.ClaimParams{RunClaimParams: store.RunClaimParams{Key: "after-0038", PayloadHash: "h",
		Owner: "o", Lease: time.Minute}, Actor: "test"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.EffectInsert(ctx, store.Effect{ID: "e-after-0038", RunKey: "after-0038", EffectID: "n", ActionType: "note",
		Target: "default", Executor: store.ExecutorDispatcher, Payload: []byte(`{}`), PayloadHash: "h", State: store.EffectPending}); err != nil {
		t.Fatal(err)
	}
	var deltas int
	if err := st.Pool().QueryRow(ctx, `SELECT count(*) FROM effect_count_deltas`).Scan(&deltas); err != nil {
		t.Fatal(err)
	}
	counts, err := st.EffectCountByState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if deltas != 0 || fmt.Sprint(counts) != "map[pending:1]" {
		t.Fatalf("after a pending effect: %d delta rows, counts %v", deltas, counts)
	}
}

// migratedBefore opens a store on a new schema and applies the migrations before version
// (on Citus, placing the tables as every migration does); it returns the store and all
// the migrations, for the test to apply the rest.
func migratedBefore(t *testing.T, version int) (*postgres.Store, []store.Migration) {
	t.Helper()
	ctx := context.Background()
	st := openSchema(t)
	ms, err := postgres.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	var before []store.Migration
	for _, m := range ms {
		if m.Version < version {
			before = append(before, m)
		}
	}
	if _, err := st.ApplyMigrationList(ctx, before, store.MigrateParams{}); err != nil {
		t.Fatal(err)
	}
	return st, ms
}

// migratedOnePostgres opens a store on a new, fully migrated schema, and skips the test
// on Citus: the tests that use it replace the trigger functions by hand, which on a Citus
// coordinator drops the search_path the placement pinned (docs/scaling.md).
func migratedOnePostgres(t *testing.T) *postgres.Store {
	t.Helper()
	ctx := context.Background()
	st := openSchema(t)
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if citus, err := st.IsCitus(ctx); err != nil || citus {
		t.Skipf("one PostgreSQL only (Citus: %v, %v)", citus, err)
	}
	return st
}

// openSchema opens a store on a new schema, closed when the test ends.
func openSchema(t *testing.T) *postgres.Store {
	t.Helper()
	st, err := postgres.OpenConfig(context.Background(), storetest.NewPostgresSchema(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}
