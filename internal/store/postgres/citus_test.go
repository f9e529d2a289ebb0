package postgres_test

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/postgres"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// TestMigrateCitusFlag: on a plain PostgreSQL, migrate --citus (MigrateParams.Citus)
// fails with ErrNoCitus before applying anything; on a Citus coordinator
// (scripts/with-citus.sh) it places the tables, and migrating again is a no-op.
func TestMigrateCitusFlag(t *testing.T) {
	ctx := context.Background()
	st, err := postgres.OpenConfig(ctx, storetest.NewPostgresSchema(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	applied, err := st.ApplyMigrations(ctx, store.MigrateParams{Citus: true})
	if os.Getenv("AIRLOCK_TEST_CITUS") != "1" {
		if !errors.Is(err, postgres.ErrNoCitus) {
			t.Fatalf("migrate --citus on plain PostgreSQL: %v, want ErrNoCitus", err)
		}
		var tables int
		if err := st.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()`).Scan(&tables); err != nil {
			t.Fatal(err)
		}
		if len(applied) != 0 || tables != 0 {
			t.Fatalf("migrate --citus on plain PostgreSQL applied %v and left %d tables", applied, tables)
		}
		return
	}
	if err != nil {
		t.Fatalf("migrate --citus on Citus: %v", err)
	}
	for range 2 { // the placement is idempotent
		if _, err := st.ApplyMigrations(ctx, store.MigrateParams{Citus: true}); err != nil {
			t.Fatalf("migrate again: %v", err)
		}
	}
	d, r, err := st.CitusPlacement(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d != len(postgres.CitusDistributed) || r != len(postgres.CitusReference) {
		t.Fatalf("placed %d distributed, %d reference tables; want %d, %d", d, r, len(postgres.CitusDistributed), len(postgres.CitusReference))
	}
}
