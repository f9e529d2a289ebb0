package postgres_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/store/postgres"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// TestCountMigrationKeepsTheCitusPin: 0038 replaces the effect counters' trigger functions,
// which a Citus placement pinned to the schema (CREATE OR REPLACE drops a function's
// settings); it must set each function's settings again, and add none where there were
// none (one PostgreSQL).
func TestCountMigrationKeepsTheCitusPin(t *testing.T) {
	ctx := context.Background()
	st, err := postgres.OpenConfig(ctx, storetest.NewPostgresSchema(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if citus, err := st.IsCitus(ctx); err != nil || citus {
		t.Skipf("one PostgreSQL only (Citus: %v, %v)", citus, err)
	}
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
