// Package storetest opens a fresh, migrated store of each backend for tests (Each runs a
// test on every backend), and its own tests are the part of the store contract no
// service above the store takes part in. The behaviours of the services over the store
// are tested beside those packages, on every backend, through Each; nothing here imports
// them (internal/store's TestStoreImportsNothingAbove).
//
// PostgreSQL tests need AIRLOCK_TEST_DATABASE_URL (scripts/test.sh starts a throwaway
// server and sets it). Without it they skip — except under CI=true, where they fail.
package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/postgres"
	"github.com/airlockhq/airlock/internal/store/sqlite"
)

// Opener returns a fresh, migrated store that is closed and removed when t ends.
type Opener func(t testing.TB, clock *Clock) store.Store

// Backend is one store implementation under test.
type Backend struct {
	Name string
	Open Opener
}

// Backends lists every backend; each test runs against all of them.
var Backends = []Backend{{"sqlite", OpenSQLite}, {"postgres", OpenPostgres}}

// Each runs fn once per backend, as parallel subtests named after it (sqlite, postgres).
func Each(t *testing.T, fn func(t *testing.T, b Backend)) {
	t.Helper()
	for _, b := range Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			fn(t, b)
		})
	}
}

// EachB runs fn once per backend as a sub-benchmark; PostgreSQL skips without
// AIRLOCK_TEST_DATABASE_URL (fails under CI).
func EachB(b *testing.B, fn func(b *testing.B, be Backend)) {
	b.Helper()
	for _, be := range Backends {
		b.Run(be.Name, func(b *testing.B) {
			if be.Name == "postgres" {
				PostgresURL(b)
			}
			fn(b, be)
		})
	}
}

// KeyedBackends are the backends opening stores that seal every event with key (the
// audit key, store/mac.go), as serve does with AIRLOCK_AUDIT_KEY_FILE.
func KeyedBackends(key *store.AuditKey) []Backend {
	return []Backend{
		{"sqlite", func(t testing.TB, c *Clock) store.Store { return openSQLite(t, c, key) }},
		{"postgres", func(t testing.TB, c *Clock) store.Store { return openPostgres(t, c, key) }},
	}
}

// EachKeyed is Each over KeyedBackends(key).
func EachKeyed(t *testing.T, key *store.AuditKey, fn func(t *testing.T, b Backend)) {
	t.Helper()
	for _, b := range KeyedBackends(key) {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			fn(t, b)
		})
	}
}

// OpenSQLite opens a new SQLite file in t's temp dir.
func OpenSQLite(t testing.TB, clock *Clock) store.Store { return openSQLite(t, clock, nil) }

func openSQLite(t testing.TB, clock *Clock, key *store.AuditKey) store.Store {
	t.Helper()
	opt := sqlite.Options{AuditKey: key}
	if clock != nil {
		opt.Now = clock.Now
	}
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "airlock.db"), opt)
	if err != nil {
		t.Fatalf("open sqlite: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.Migrate(context.Background()); err != nil {
		t.Fatalf("migrate sqlite: %v", err)
	}
	return st
}

// PostgresURL returns the test server's URL, skipping t (failing it under CI) if unset.
func PostgresURL(t testing.TB) string {
	t.Helper()
	url := os.Getenv("AIRLOCK_TEST_DATABASE_URL")
	if url == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("AIRLOCK_TEST_DATABASE_URL is not set: under CI the PostgreSQL tests must run (use scripts/test.sh)")
		}
		t.Skip("AIRLOCK_TEST_DATABASE_URL not set; run scripts/test.sh to start a throwaway PostgreSQL")
	}
	return url
}

// NewPostgresSchema creates an empty schema for one test and returns a pool config whose
// connections use it, so tests share a server without sharing tables.
func NewPostgresSchema(t testing.TB) *pgxpool.Config {
	t.Helper()
	url := PostgresURL(t)
	ctx := context.Background()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "t_" + hex.EncodeToString(b)
	admin, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatalf("connect to postgres: %v", err)
	}
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		admin.Close()
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
		admin.Close()
	})
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("parse AIRLOCK_TEST_DATABASE_URL: %v", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = 16
	return cfg
}

// OpenPostgres opens a store on a fresh schema of the test server.
func OpenPostgres(t testing.TB, clock *Clock) store.Store { return openPostgres(t, clock, nil) }

func openPostgres(t testing.TB, _ *Clock, key *store.AuditKey) store.Store {
	t.Helper()
	cfg := NewPostgresSchema(t)
	st, err := postgres.OpenConfigWith(context.Background(), cfg, postgres.Options{AuditKey: key})
	if err != nil {
		t.Fatalf("open postgres: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.Migrate(context.Background()); err != nil {
		t.Fatalf("migrate postgres: %v", err)
	}
	return st
}

// Clock is a test clock that moves only when told.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

func NewClock() *Clock {
	return &Clock{t: time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)}
}

func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// Reopen opens a second store on st's database — another airlock instance sharing it —
// closed when t ends. clock is the SQLite process clock (nil: the real one).
func Reopen(t testing.TB, st store.Store, clock *Clock) store.Store {
	t.Helper()
	return ReopenKeyed(t, st, clock, nil)
}

// ReopenKeyed is Reopen for an instance that seals events with key (nil: none).
func ReopenKeyed(t testing.TB, st store.Store, clock *Clock, key *store.AuditKey) store.Store {
	t.Helper()
	ctx := context.Background()
	switch s := st.(type) {
	case *postgres.Store:
		other, err := postgres.OpenConfigWith(ctx, s.Pool().Config(), postgres.Options{AuditKey: key})
		if err != nil {
			t.Fatalf("reopen postgres: %v", err)
		}
		t.Cleanup(func() { other.Close() })
		return other
	case *sqlite.Store:
		var seq int
		var name, file string
		if err := s.DB().QueryRowContext(ctx, `PRAGMA database_list`).Scan(&seq, &name, &file); err != nil || file == "" {
			t.Fatalf("sqlite file of the store: %q %v", file, err)
		}
		opt := sqlite.Options{AuditKey: key}
		if clock != nil {
			opt.Now = clock.Now
		}
		other, err := sqlite.Open(ctx, file, opt)
		if err != nil {
			t.Fatalf("reopen sqlite: %v", err)
		}
		t.Cleanup(func() { other.Close() })
		return other
	}
	t.Fatalf("cannot reopen a %T", st)
	return nil
}
