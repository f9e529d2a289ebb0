package storetest

import (
	"context"
	"testing"

	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/postgres"
	"github.com/airlockhq/airlock/internal/store/sqlite"
)

// LaterRelease returns st's backend's embedded migrations plus one that raises the writer
// level to level (version 9000+level, no statement): a release the binary under test
// does not know yet.
func LaterRelease(t testing.TB, st store.Store, level int) []store.Migration {
	t.Helper()
	var ms []store.Migration
	var err error
	if st.Backend() == "postgres" {
		ms, err = postgres.Migrations()
	} else {
		ms, err = sqlite.Migrations()
	}
	if err != nil {
		t.Fatal(err)
	}
	return append(ms, store.Migration{Version: 9000 + level, Name: "later_release_level", SQL: "SELECT 1", WriterLevel: level})
}

// ApplyLater applies LaterRelease(st, level) to st with p.
func ApplyLater(t testing.TB, st store.Store, level int, p store.MigrateParams) ([]string, error) {
	t.Helper()
	switch s := st.(type) {
	case *postgres.Store:
		return s.ApplyMigrationList(context.Background(), LaterRelease(t, st, level), p)
	case *sqlite.Store:
		return s.ApplyMigrationList(context.Background(), LaterRelease(t, st, level), p)
	}
	t.Fatalf("%T cannot apply a migration list", st)
	return nil, nil
}
