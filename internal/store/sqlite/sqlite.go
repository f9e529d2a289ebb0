// Package sqlite is the embedded store (modernc.org/sqlite, pure Go): one file, WAL,
// synchronous=FULL unless the operator opts out. Several processes may share the file;
// SQLite's file lock serialises their writes and busy_timeout makes them wait their turn.
package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	msqlite "modernc.org/sqlite" // also registers the "sqlite" driver
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/airlockhq/airlock/internal/store"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Options tune the file.
type Options struct {
	// Synchronous is FULL (default: a commit survives power loss) or NORMAL (faster; may
	// lose the last commits on power loss, which for airlock means a duplicate effect).
	Synchronous string
	// Now replaces the process clock (tests move time with it).
	Now func() time.Time
	// AuditKey, when set, seals every event written with a MAC (store/mac.go).
	AuditKey *store.AuditKey
}

// Store is one SQLite file.
type Store struct {
	queries
	db   *sql.DB
	path string
	// writeMu serialises this process's write transactions so they queue in Go instead of
	// polling SQLite's busy handler; other processes still wait on the file lock.
	writeMu sync.Mutex
}

// Open opens (creating if needed) the database file at path. It does not migrate.
func Open(ctx context.Context, path string, opt Options) (*Store, error) {
	sync := strings.ToUpper(opt.Synchronous)
	if sync == "" {
		sync = "FULL"
	}
	if sync != "FULL" && sync != "NORMAL" {
		return nil, fmt.Errorf("sqlite synchronous must be FULL or NORMAL, not %q", opt.Synchronous)
	}
	if err := writable(path); err != nil {
		return nil, err
	}
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous("+sync+")")
	q.Add("_pragma", "foreign_keys(1)")
	// Every transaction here reads then writes; a deferred one fails with SQLITE_BUSY at
	// once when another writer got there first, busy_timeout or not.
	q.Set("_txlock", "immediate")
	// Through connector: every error SQLite returns is classified (unavailable.go).
	db := sql.OpenDB(connector{dsn: "file:" + path + "?" + q.Encode(), drv: sqliteDriver})
	db.SetMaxOpenConns(8)
	db.SetMaxIdleConns(8)
	db.SetConnMaxIdleTime(0)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	now := opt.Now
	if now == nil {
		now = time.Now
	}
	st := &Store{db: db, path: path}
	st.queries = queries{db: joined{st}, now: now, key: opt.AuditKey}
	return st, nil
}

// bound is the transaction of a Within, carried in its ctx.
type bound struct {
	tx     *sql.Tx
	depth  *int // savepoints open
	closed *bool
}

type txKey struct{ s *Store }

func (s *Store) bound(ctx context.Context) *bound {
	b, _ := ctx.Value(txKey{s}).(*bound)
	return b
}

// joined runs a statement in the transaction of a Within whose ctx it is given, else on
// the pool (autocommit).
type joined struct{ s *Store }

func (j joined) on(ctx context.Context) dbtx {
	if b := j.s.bound(ctx); b != nil {
		return b.tx
	}
	return j.s.db
}

func (j joined) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return j.on(ctx).ExecContext(ctx, query, args...)
}

func (j joined) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return j.on(ctx).QueryContext(ctx, query, args...)
}

func (j joined) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	return j.on(ctx).QueryRowContext(ctx, query, args...)
}

func (s *Store) Within(ctx context.Context, fn func(ctx context.Context) error) error {
	if s.bound(ctx) != nil {
		return fn(ctx)
	}
	return s.transact(ctx, func(b *bound) error { return fn(context.WithValue(ctx, txKey{s}, b)) })
}

// writable refuses, before SQLite touches anything, a database this process may not
// write: SQLite would open such a file read-only (every write then fails while reads
// work) and create its -wal and -shm files with the file's read-only mode, which break
// the next start even after the file is fixed.
func writable(path string) error {
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		switch {
		case err == nil:
			f.Close()
		case errors.Is(err, fs.ErrNotExist):
		case errors.Is(err, fs.ErrPermission):
			what := "the database file"
			if p != path {
				what = "SQLite's side file (left read-only by an earlier start? remove it while airlock is stopped, or fix its permissions)"
			}
			return fmt.Errorf("open sqlite %s: %s %s is read-only for this user: airlock writes to it; give the user write permission", path, what, p)
		default:
			return fmt.Errorf("open sqlite %s: %w", path, err)
		}
	}
	// SQLite creates and removes the -wal and -shm files beside the database.
	dir := filepath.Dir(path)
	probe, err := os.CreateTemp(dir, ".airlock-write-probe-*")
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("open sqlite %s: the directory %s does not exist", path, dir)
	}
	if err != nil {
		return fmt.Errorf("open sqlite %s: the directory %s is read-only for this user: SQLite creates its -wal and -shm files there; give the user write permission", path, dir)
	}
	probe.Close()
	return os.Remove(probe.Name())
}

var _ store.Headroom = (*Store)(nil)

func (s *Store) Backend() string                { return "sqlite" }
func (s *Store) Close() error                   { return s.db.Close() }
func (s *Store) Ping(ctx context.Context) error { return s.db.PingContext(ctx) }

// DB exposes the handle for benchmarks that measure raw statements beside the store.
func (s *Store) DB() *sql.DB { return s.db }

func (s *Store) Transact(ctx context.Context, fn func(q store.Queries) error) error {
	return s.transact(ctx, func(b *bound) error { return fn(queries{db: b.tx, now: s.now, key: s.key}) })
}

// invalidValue is a driver error that is also store.ErrInvalidValue.
type invalidValue struct{ error }

func (e invalidValue) Unwrap() []error { return []error{e.error, store.ErrInvalidValue} }

// valueError marks SQLite's refusals of a statement's values (a constraint, a value too
// big, a datatype mismatch) as store.ErrInvalidValue: running it again cannot help.
func valueError(err error) error {
	var se *msqlite.Error
	if err == nil || errors.Is(err, store.ErrInvalidValue) || !errors.As(err, &se) {
		return err
	}
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_CONSTRAINT, sqlite3.SQLITE_TOOBIG, sqlite3.SQLITE_MISMATCH:
		return invalidValue{err}
	}
	return err
}

// transact runs fn in a transaction, or in a savepoint of the one ctx joins.
func (s *Store) transact(ctx context.Context, fn func(b *bound) error) (err error) {
	defer func() { err = valueError(err) }()
	if b := s.bound(ctx); b != nil {
		return s.savepoint(ctx, b, fn)
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	b := &bound{tx: tx, depth: new(int), closed: new(bool)}
	defer func() {
		*b.closed = true
		if p := recover(); p != nil {
			_ = tx.Rollback()
			panic(p)
		}
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	if err := fn(b); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// savepoint runs fn in a savepoint of b: released when fn succeeds, rolled back alone
// when it fails.
func (s *Store) savepoint(ctx context.Context, b *bound, fn func(b *bound) error) (err error) {
	if *b.closed {
		return errors.New("savepoint: the transaction has ended")
	}
	*b.depth++
	name := fmt.Sprintf("sp_%d", *b.depth)
	defer func() { *b.depth-- }()
	if _, err := b.tx.ExecContext(ctx, "SAVEPOINT "+name); err != nil {
		return fmt.Errorf("savepoint: %w", err)
	}
	defer func() {
		p := recover()
		if p != nil || err != nil {
			_, _ = b.tx.ExecContext(context.WithoutCancel(ctx), "ROLLBACK TO "+name)
			_, _ = b.tx.ExecContext(context.WithoutCancel(ctx), "RELEASE "+name)
		}
		if p != nil {
			panic(p)
		}
	}()
	if err := fn(b); err != nil {
		return err
	}
	if _, err := b.tx.ExecContext(ctx, "RELEASE "+name); err != nil {
		return fmt.Errorf("release savepoint: %w", err)
	}
	return nil
}

// Claim runs the claim's statements in one transaction: SQLite is local, so the round
// trips cost little, and the write lock makes the sequence atomic.
func (s *Store) Claim(ctx context.Context, p store.ClaimParams) (out store.ClaimOutcome, err error) {
	err = s.Transact(ctx, func(q store.Queries) error {
		out, err = store.ClaimSequence(ctx, q, p)
		return err
	})
	return out, err
}

// ReadinessWrite upserts the instance's row and forgets instances silent for a day, in
// one transaction that commits (synchronous as the file is opened: FULL by default).
func (s *Store) ReadinessWrite(ctx context.Context, instance string) error {
	return s.Transact(ctx, func(q store.Queries) error {
		db, now := q.(queries).db, s.now().UnixMicro()
		if _, err := db.ExecContext(ctx, `INSERT INTO readiness (instance, checked_at) VALUES (?, ?)
			ON CONFLICT (instance) DO UPDATE SET checked_at = excluded.checked_at, checks = checks + 1`, instance, now); err != nil {
			return fmt.Errorf("readiness write: %w", err)
		}
		if _, err := db.ExecContext(ctx, `DELETE FROM readiness WHERE checked_at < ?`, now-(24*time.Hour).Microseconds()); err != nil {
			return fmt.Errorf("readiness write: %w", err)
		}
		return nil
	})
}

// Headroom is the least of the free space of the file system that holds the database
// (to this user) and what the page limit (max_page_count) still allows.
func (s *Store) Headroom(ctx context.Context) (int64, error) {
	free, err := freeBytes(filepath.Dir(s.path))
	if err != nil {
		return 0, store.Unavailable(fmt.Errorf("headroom: %w", err))
	}
	// The page limit holds per connection: the four values are read on one.
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return 0, fmt.Errorf("headroom: %w", err)
	}
	defer conn.Close()
	var maxPages, pages, freePages, pageSize int64
	for _, p := range []struct {
		pragma string
		v      *int64
	}{{"max_page_count", &maxPages}, {"page_count", &pages}, {"freelist_count", &freePages}, {"page_size", &pageSize}} {
		if err := conn.QueryRowContext(ctx, "PRAGMA "+p.pragma).Scan(p.v); err != nil {
			return 0, fmt.Errorf("headroom: %w", err)
		}
	}
	return min(free, (maxPages-pages+freePages)*pageSize), nil
}

func (s *Store) Migrate(ctx context.Context) error {
	_, err := s.ApplyMigrations(ctx, store.MigrateParams{})
	return err
}

func (s *Store) ApplyMigrations(ctx context.Context, p store.MigrateParams) ([]string, error) {
	ms, err := Migrations()
	if err != nil {
		return nil, err
	}
	return s.ApplyMigrationList(ctx, ms, p)
}

// Migrations are the migrations embedded in this backend.
func Migrations() ([]store.Migration, error) { return store.LoadMigrations(migrationFS, "migrations") }

// ApplyMigrationList is ApplyMigrations over ms instead of the embedded migrations: tests
// play a later release's migrations (one that raises the writer level) with it.
func (s *Store) ApplyMigrationList(ctx context.Context, ms []store.Migration, p store.MigrateParams) ([]string, error) {
	if p.Citus {
		return nil, errors.New("--citus needs a PostgreSQL database with the citus extension (a Citus coordinator), not SQLite")
	}
	var done []string
	// BEGIN IMMEDIATE holds the write lock for the whole sequence, so processes that
	// start together apply it once; SQLite DDL is transactional.
	err := s.Transact(ctx, func(q store.Queries) error {
		done = nil // a retried transaction starts over
		db := q.(queries).db
		if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
			version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)`); err != nil {
			return fmt.Errorf("create schema_migrations: %w", err)
		}
		applied, err := appliedVersions(ctx, db)
		if err != nil {
			return err
		}
		pending := store.Pending(ms, applied)
		if err := s.guardLevel(ctx, db, pending, p); err != nil {
			return err
		}
		for _, m := range pending {
			if _, err := db.ExecContext(ctx, m.SQL); err != nil {
				return fmt.Errorf("migration %s: %w", m.Name, err)
			}
			if _, err := db.ExecContext(ctx, `INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)`,
				m.Version, m.Name, s.now().UnixMicro()); err != nil {
				return fmt.Errorf("record migration %s: %w", m.Name, err)
			}
			if m.WriterLevel > 0 {
				if _, err := db.ExecContext(ctx, `UPDATE writer_level SET level = ? WHERE level < ?`, m.WriterLevel, m.WriterLevel); err != nil {
					return fmt.Errorf("migration %s: raise the writer level: %w", m.Name, err)
				}
			}
			done = append(done, m.Name)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return done, nil
}

func (s *Store) SchemaCurrent(ctx context.Context) error {
	ms, err := store.LoadMigrations(migrationFS, "migrations")
	if err != nil {
		return err
	}
	applied, err := appliedVersions(ctx, s.db)
	if err != nil {
		return err
	}
	return store.Outdated(ms, applied)
}

// appliedVersions reads the versions schema_migrations records (none before the first
// migration made the table).
func appliedVersions(ctx context.Context, db dbtx) (map[int]bool, error) {
	versions, err := selectAll(ctx, db, func(row scanner) (int, error) {
		var v int
		err := row.Scan(&v)
		return v, err
	}, `SELECT version FROM schema_migrations`)
	if err != nil && strings.Contains(err.Error(), "no such table") {
		return map[int]bool{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read schema versions: %w", err)
	}
	applied := make(map[int]bool, len(versions))
	for _, v := range versions {
		applied[v] = true
	}
	return applied, nil
}

// dbtx is what *sql.DB and *sql.Tx share.
type dbtx interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

type queries struct {
	db  dbtx
	now func() time.Time
	key *store.AuditKey // seals events (nil: written unkeyed)
}

// at resolves a param's Now against the process clock, as microseconds.
func (q queries) at(now *time.Time) int64 {
	if now != nil {
		return now.UnixMicro()
	}
	return q.now().UnixMicro()
}

func fromMicros(us int64) time.Time { return time.UnixMicro(us).UTC() }

func optTime(us sql.NullInt64) *time.Time {
	if !us.Valid {
		return nil
	}
	t := fromMicros(us.Int64)
	return &t
}

func optJSON(s sql.NullString) json.RawMessage {
	if !s.Valid {
		return nil
	}
	return json.RawMessage(s.String)
}

func jsonArg(b json.RawMessage) any {
	if b == nil {
		return nil
	}
	return string(b)
}

type scanner interface{ Scan(dest ...any) error }

// selectAll runs query and scans every row with scan.
func selectAll[T any](ctx context.Context, db dbtx, scan func(scanner) (T, error), query string, args ...any) ([]T, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

const eventColumns = `id, run_key, at, kind, version, actor, meta, detail`

func scanEvent(row scanner) (store.Event, error) {
	var e store.Event
	var at int64
	var meta, detail sql.NullString
	if err := row.Scan(&e.ID, &e.RunKey, &at, &e.Kind, &e.Version, &e.Actor, &meta, &detail); err != nil {
		return store.Event{}, err
	}
	e.At, e.Meta, e.Detail = fromMicros(at), optJSON(meta), optJSON(detail)
	return e, nil
}

const runColumns = `idempotency_key, state, payload_hash, lease_owner, lease_started_at,
	lease_expires_at, version, result, duplicates, reclaims, trigger_source, workflow_version,
	created_at, updated_at, action_type, repairs, validations, model_calls, tokens, park_reason,
	replaced_by`

func scanRun(row scanner) (store.Run, error) {
	var r store.Run
	var state string
	var started, expires sql.NullInt64
	var result sql.NullString
	var created, updated int64
	err := row.Scan(&r.Key, &state, &r.PayloadHash, &r.LeaseOwner, &started, &expires,
		&r.Version, &result, &r.Duplicates, &r.Reclaims, &r.TriggerSource, &r.WorkflowVersion,
		&created, &updated, &r.ActionType, &r.Repairs, &r.Validations, &r.ModelCalls, &r.Tokens,
		&r.ParkReason, &r.ReplacedBy)
	if err != nil {
		return store.Run{}, interpret(err)
	}
	r.State = store.State(state)
	r.LeaseStartedAt, r.LeaseExpiresAt = optTime(started), optTime(expires)
	r.Result = optJSON(result)
	r.CreatedAt, r.UpdatedAt = fromMicros(created), fromMicros(updated)
	return r, nil
}

func interpret(err error) error {
	if errors.Is(err, sql.ErrNoRows) {
		return store.ErrNotFound
	}
	return err
}

func noMatch(r store.Run, err error) (store.Run, error) {
	if errors.Is(err, store.ErrNotFound) {
		return store.Run{}, store.ErrNoMatch
	}
	return r, err
}

func (q queries) Clock(context.Context) (time.Time, error) { return q.now().UTC(), nil }

// claimSQL is the same statement as PostgreSQL's; ?3 is now in microseconds.
const claimSQL = `
INSERT INTO workflow_runs AS r (idempotency_key, state, payload_hash, lease_owner,
  lease_started_at, lease_expires_at, version, trigger_source, workflow_version,
  created_at, updated_at)
VALUES (?1, 'processing', ?2, ?3, ?4, ?4 + ?5, 1, ?6, ?7, ?4, ?4)
ON CONFLICT (idempotency_key) DO UPDATE
SET lease_owner = excluded.lease_owner,
    lease_started_at = excluded.lease_started_at,
    lease_expires_at = excluded.lease_expires_at,
    state = 'processing',
    version = r.version + 1,
    reclaims = r.reclaims + 1,
    updated_at = excluded.updated_at
WHERE r.payload_hash = excluded.payload_hash
  AND (r.state = 'failed_retryable'
       OR (r.state = 'processing'
           AND (r.lease_expires_at IS NULL OR r.lease_expires_at <= excluded.updated_at)))
RETURNING ` + runColumns

func (q queries) RunClaim(ctx context.Context, p store.RunClaimParams) (store.Run, error) {
	return noMatch(scanRun(q.db.QueryRowContext(ctx, claimSQL, p.Key, p.PayloadHash, p.Owner,
		q.at(p.Now), p.Lease.Microseconds(), p.TriggerSource, p.WorkflowVersion)))
}

func (q queries) RunRefuse(ctx context.Context, key, payloadHash string) (store.Run, error) {
	return scanRun(q.db.QueryRowContext(ctx, `
		UPDATE workflow_runs
		SET duplicates = duplicates + CASE WHEN payload_hash = ?2 THEN 1 ELSE 0 END
		WHERE idempotency_key = ?1
		RETURNING `+runColumns, key, payloadHash))
}

func (q queries) RunGet(ctx context.Context, key string) (store.Run, error) {
	return scanRun(q.db.QueryRowContext(ctx, `SELECT `+runColumns+` FROM workflow_runs WHERE idempotency_key = ?`, key))
}

func (q queries) RunHeartbeat(ctx context.Context, p store.RunHeartbeatParams) (store.Run, error) {
	return noMatch(scanRun(q.db.QueryRowContext(ctx, `
		UPDATE workflow_runs
		SET lease_expires_at = min(?4 + ?5, lease_started_at + ?6)
		WHERE idempotency_key = ?1 AND lease_owner = ?2 AND version = ?3
		  AND state = 'processing' AND lease_expires_at > ?4
		  AND lease_expires_at < lease_started_at + ?6
		RETURNING `+runColumns, p.Key, p.Owner, p.Version, q.at(p.Now), p.Lease.Microseconds(), p.Lifetime.Microseconds())))
}

func (q queries) RunTransition(ctx context.Context, p store.RunTransitionParams) (store.Run, error) {
	return noMatch(scanRun(q.db.QueryRowContext(ctx, `
		UPDATE workflow_runs
		SET state = ?5, version = version + 1, result = coalesce(?6, result),
		    lease_expires_at = NULL, updated_at = ?7, park_reason = ?8
		WHERE idempotency_key = ?1 AND lease_owner = ?2 AND version = ?3 AND state = ?4
		  AND lease_expires_at > ?7
		RETURNING `+runColumns, p.Key, p.Owner, p.Version, string(p.From), string(p.To), jsonArg(p.Result), q.at(p.Now), p.ParkReason)))
}

func (q queries) RunOpenEffects(ctx context.Context, key string) (int, error) {
	var n int
	err := q.db.QueryRowContext(ctx, `SELECT count(*) FROM effects WHERE idempotency_key = ?
		AND state IN ('pending', 'sending', 'planned', 'unknown', 'failed')`, key).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count open effects: %w", err)
	}
	return n, nil
}

func (q queries) EventInsert(ctx context.Context, p store.EventInsertParams) (store.Event, error) {
	e := store.Event{RunKey: p.RunKey, Kind: p.Kind, Version: p.Version, Actor: p.Actor, Meta: p.Meta, Detail: p.Detail}
	at := q.at(p.Now)
	macKey, mac, err := q.key.Seal(p)
	if err != nil {
		return store.Event{}, fmt.Errorf("insert event: %w", err)
	}
	err = q.db.QueryRowContext(ctx, `
		INSERT INTO events (run_key, at, kind, version, actor, meta, detail, mac_key, mac)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id`,
		p.RunKey, at, p.Kind, p.Version, p.Actor, jsonArg(p.Meta), jsonArg(p.Detail), macKey, mac).Scan(&e.ID)
	if err != nil {
		return store.Event{}, fmt.Errorf("insert event: %w", err)
	}
	e.At = fromMicros(at)
	return e, nil
}

func (q queries) EventExistsExcept(ctx context.Context, key string, kinds []string) (bool, error) {
	query := `SELECT EXISTS (SELECT 1 FROM events WHERE run_key = ?`
	args := []any{key}
	if len(kinds) > 0 {
		query += ` AND kind NOT IN (` + placeholders(len(kinds)) + `)`
		for _, k := range kinds {
			args = append(args, k)
		}
	}
	var found bool
	if err := q.db.QueryRowContext(ctx, query+`)`, args...).Scan(&found); err != nil {
		return false, fmt.Errorf("look up events: %w", err)
	}
	return found, nil
}

func (q queries) EventList(ctx context.Context, key string, afterID int64, limit int) ([]store.Event, error) {
	evs, err := selectAll(ctx, q.db, scanEvent, `SELECT `+eventColumns+` FROM events
		WHERE run_key = ? AND id > ? ORDER BY id LIMIT ?`, key, afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	return evs, nil
}

func (q queries) APIKeyInsert(ctx context.Context, k store.APIKey) error {
	_, err := q.db.ExecContext(ctx, `INSERT INTO api_keys (id, name, key_hash, scopes, created_at, on_behalf_of, types) VALUES (?, ?, ?, ?, ?, ?, ?)`,
		k.ID, k.Name, k.Hash, strings.Join(k.Scopes, ","), k.CreatedAt.UnixMicro(), k.OnBehalfOf, strings.Join(k.Types, ","))
	if err != nil {
		return fmt.Errorf("insert api key: %w", err)
	}
	return nil
}

const apiKeyColumns = `id, name, key_hash, scopes, created_at, revoked_at, on_behalf_of, types`

func scanAPIKey(row scanner) (store.APIKey, error) {
	var k store.APIKey
	var scopes, types string
	var created int64
	var revoked sql.NullInt64
	if err := row.Scan(&k.ID, &k.Name, &k.Hash, &scopes, &created, &revoked, &k.OnBehalfOf, &types); err != nil {
		return store.APIKey{}, interpret(err)
	}
	k.Scopes, k.Types = strings.Split(scopes, ","), splitList(types)
	k.CreatedAt, k.RevokedAt = fromMicros(created), optTime(revoked)
	return k, nil
}

func (q queries) APIKeyByHash(ctx context.Context, hash string) (store.APIKey, error) {
	return scanAPIKey(q.db.QueryRowContext(ctx, `SELECT `+apiKeyColumns+` FROM api_keys WHERE key_hash = ?`, hash))
}

func (q queries) APIKeyList(ctx context.Context) ([]store.APIKey, error) {
	keys, err := selectAll(ctx, q.db, scanAPIKey, `SELECT `+apiKeyColumns+` FROM api_keys ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("list api keys: %w", err)
	}
	return keys, nil
}

func (q queries) APIKeyRevoke(ctx context.Context, id string, at time.Time) error {
	res, err := q.db.ExecContext(ctx, `UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL`, at.UnixMicro(), id)
	if err != nil {
		return fmt.Errorf("revoke api key: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.ErrNotFound
	}
	return nil
}

func (q queries) EvidenceInsert(ctx context.Context, e store.Evidence) (store.Evidence, error) {
	created := q.orNow(e.CreatedAt)
	err := q.db.QueryRowContext(ctx, `INSERT INTO evidence (idempotency_key, source, name, value, recorded_by, created_at)
		VALUES (?, ?, ?, ?, ?, ?) RETURNING id`, e.RunKey, e.Source, e.Name, string(e.Value), e.RecordedBy, created).Scan(&e.ID)
	if err != nil {
		return store.Evidence{}, fmt.Errorf("insert evidence: %w", err)
	}
	e.CreatedAt = fromMicros(created)
	return e, nil
}

func (q queries) EvidenceByRun(ctx context.Context, key string) ([]store.Evidence, error) {
	return selectAll(ctx, q.db, func(row scanner) (store.Evidence, error) {
		var e store.Evidence
		var value string
		var created int64
		if err := row.Scan(&e.ID, &e.RunKey, &e.Source, &e.Name, &value, &e.RecordedBy, &created); err != nil {
			return store.Evidence{}, err
		}
		e.Value, e.CreatedAt = json.RawMessage(value), fromMicros(created)
		return e, nil
	}, `SELECT id, idempotency_key, source, name, value, recorded_by, created_at FROM evidence WHERE idempotency_key = ? ORDER BY id`, key)
}
