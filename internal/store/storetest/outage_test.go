package storetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/postgres"
	"github.com/airlockhq/airlock/internal/store/sqlite"
)

// The suite of a store that cannot serve (down, read-only, disk full): its
// failures are classified as store.ErrUnavailable, and readiness is proven by a committed write.
func TestReadinessWriteCommits(t *testing.T)         { each(t, testReadinessWriteCommits) }
func TestMigrationsByVersionNotByCount(t *testing.T) { each(t, testMigrationsByVersion) }
func TestRefusedWritesAreUnavailable(t *testing.T)   { each(t, testRefusedWritesUnavailable) }
func TestLostConnectionsAreUnavailable(t *testing.T) { each(t, testLostConnectionsUnavailable) }

// exec runs one statement of the backend's dialect on the store's database.
func exec(t *testing.T, st store.Store, sql string) {
	t.Helper()
	var err error
	switch s := st.(type) {
	case *postgres.Store:
		_, err = s.Pool().Exec(ctx, sql)
	case *sqlite.Store:
		_, err = s.DB().ExecContext(ctx, sql)
	}
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func queryInt(t *testing.T, st store.Store, sql string) int64 {
	t.Helper()
	var n int64
	var err error
	switch s := st.(type) {
	case *postgres.Store:
		err = s.Pool().QueryRow(ctx, sql).Scan(&n)
	case *sqlite.Store:
		err = s.DB().QueryRowContext(ctx, sql).Scan(&n)
	}
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// The readiness write commits: another instance sees it, and each check changes the row
// (a write of the same bytes would be skipped by SQLite and prove nothing).
func testReadinessWriteCommits(t *testing.T, e *env) {
	for range 3 {
		if err := e.Store.ReadinessWrite(ctx, "host-a"); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Store.ReadinessWrite(ctx, "host-b"); err != nil {
		t.Fatal(err)
	}
	other := Reopen(t, e.Store, e.Clock)
	equal(t, "host-a checks", queryInt(t, other, `SELECT checks FROM readiness WHERE instance = 'host-a'`), 3)
	equal(t, "instances", queryInt(t, other, `SELECT count(*) FROM readiness`), 2)
}

// Migrations apply by version: one missing from the record is applied even when later
// ones are (branches merge their migrations in any order), and the schema is outdated
// until it is.
func testMigrationsByVersion(t *testing.T, e *env) {
	exec(t, e.Store, `DROP TABLE readiness`)
	exec(t, e.Store, `DELETE FROM schema_migrations WHERE version = 14`)
	err := e.Store.SchemaCurrent(ctx)
	if !errors.Is(err, store.ErrSchemaOutdated) || !strings.Contains(err.Error(), "0014_readiness.sql") {
		t.Fatalf("schema with 0014 missing: %v", err)
	}
	before := queryInt(t, e.Store, `SELECT count(*) FROM schema_migrations`)
	if err := e.Store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	equal(t, "migrations recorded", queryInt(t, e.Store, `SELECT count(*) FROM schema_migrations`), before+1)
	if err := e.Store.SchemaCurrent(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.Store.ReadinessWrite(ctx, "host-a"); err != nil {
		t.Fatalf("after 0014 ran again: %v", err)
	}
}

// A database that refuses writes — a read-only session or standby (PostgreSQL 25006), a
// read-only file (SQLITE_READONLY) — is unavailable; a write refused on its merits (a
// constraint) is not, nor a row that is not there.
func testRefusedWritesUnavailable(t *testing.T, e *env) {
	key := store.APIKey{ID: "k1", Name: "one", Hash: "h1", Scopes: []string{"runs"}, CreatedAt: e.Clock.Now()}
	if err := e.Store.APIKeyInsert(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := e.Store.APIKeyInsert(ctx, key); err == nil || errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("a duplicate key: %v; want a constraint error, not an outage", err)
	}
	if _, err := e.Store.RunGet(ctx, "none"); !errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("a missing run: %v", err)
	}
	ro := e.Store
	switch s := e.Store.(type) {
	case *postgres.Store:
		cfg := s.Pool().Config()
		cfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
		st, err := postgres.OpenConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		ro = st
	case *sqlite.Store:
		s.DB().SetMaxOpenConns(1) // query_only holds per connection
		exec(t, s, `PRAGMA query_only = ON`)
	}
	if _, err := ro.RunGet(ctx, "none"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a read of the read-only database: %v", err)
	}
	writes := map[string]func() error{
		"autocommit": func() error { return ro.APIKeyRevoke(ctx, "k1", e.Clock.Now()) },
		"transaction": func() error {
			return ro.Transact(ctx, func(q store.Queries) error { return q.APIKeyRevoke(ctx, "k1", e.Clock.Now()) })
		},
		"claim": func() error {
			_, err := ro.Claim(ctx, store.ClaimParams{RunClaimParams: store.RunClaimParams{Key: "r1", PayloadHash: "h", Owner: "o", Lease: time.Minute}})
			return err
		},
		"readiness": func() error { return ro.ReadinessWrite(ctx, "host-a") },
	}
	for name, w := range writes {
		if err := w(); !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("%s write on the read-only database: %v; want store.ErrUnavailable", name, err)
		}
	}
}

// Connections that break under the store are unavailable. PostgreSQL: a session ended by
// the server mid-statement (57P01, what a fast shutdown sends), and a server that is not
// there (connection refused). SQLite: a write that waited past its deadline for the lock
// another process holds.
func testLostConnectionsUnavailable(t *testing.T, e *env) {
	if _, err := e.Store.Claim(ctx, store.ClaimParams{RunClaimParams: store.RunClaimParams{Key: "r1", PayloadHash: "h", Owner: "o", Lease: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	switch s := e.Store.(type) {
	case *postgres.Store:
		// The statement that will be ended runs on a pool of its own, named, so that only
		// its session is ended (other tests share the server).
		cfg := s.Pool().Config()
		app := fmt.Sprintf("airlock-outage-%d", time.Now().UnixNano()) // under 64 bytes: PostgreSQL cuts longer names
		cfg.ConnConfig.RuntimeParams["application_name"] = app
		st, err := postgres.OpenConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		// Hold the run's row so that the statement waits on it.
		holder, err := s.Pool().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Rollback(ctx)
		if _, err := holder.Exec(ctx, `SELECT 1 FROM workflow_runs WHERE idempotency_key = 'r1' FOR UPDATE`); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := st.RunCount(ctx, store.RunCountParams{Key: "r1", ModelCalls: 1})
			done <- err
		}()
		// On Citus the statement waits for the row on the worker, and the coordinator's
		// backend, still active, waits for the worker's answer (seen as ClientRead).
		waits := `wait_event_type = 'Lock'`
		if os.Getenv("AIRLOCK_TEST_CITUS") == "1" {
			waits = `(wait_event_type = 'Lock' OR (state = 'active' AND wait_event = 'ClientRead'))`
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			var n int64
			if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND `+waits, app).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n > 0 {
				break
			}
			select {
			case err := <-done:
				t.Fatalf("the statement did not wait for the row: %v", err)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatal("the statement did not wait for the row")
			}
		}
		if _, err := s.Pool().Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, app); err != nil {
			t.Fatal(err)
		}
		if err := <-done; !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("a session the server ended mid-statement: %v; want store.ErrUnavailable", err)
		}
		cfg = s.Pool().Config()
		cfg.ConnConfig.Port = closedPort(t)
		if _, err := postgres.OpenConfig(ctx, cfg); !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("connect to a port nothing listens on: %v; want store.ErrUnavailable", err)
		}
	case *sqlite.Store:
		other := Reopen(t, s, e.Clock).(*sqlite.Store)
		hold, err := other.DB().BeginTx(ctx, nil) // BEGIN IMMEDIATE: the write lock
		if err != nil {
			t.Fatal(err)
		}
		defer hold.Rollback()
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err = s.RunCount(short, store.RunCountParams{Key: "r1", ModelCalls: 1})
		if !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("a write that waited past its deadline for the lock: %v; want store.ErrUnavailable", err)
		}
		t.Logf("locked out for %s: %v", time.Since(start).Round(time.Millisecond), err)
	}
}

// closedPort is a local TCP port nothing listens on.
func closedPort(t *testing.T) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return uint16(port)
}
