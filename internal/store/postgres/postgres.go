// Package postgres is the PostgreSQL store (pgx/v5): the production backend, shared by
// any number of airlock instances. Times come from the database clock unless a test
// passes Now, so instances whose clocks differ still agree on lease expiry.
package postgres

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/airlockhq/airlock/internal/store"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// migrationLock is the advisory lock key that serialises migrations across instances.
const migrationLock = 0x6169726c6f636b // "airlock"

// Store is a PostgreSQL database.
type Store struct {
	queries
	pool      *pgxpool.Pool
	listenURL string // where LISTEN connects ("": with the pool's settings, on a connection of its own)
	// listening is true while a LISTEN connection is up; notifications counts those it
	// received (ListenState).
	listening     atomic.Bool
	notifications atomic.Uint64
}

// Options are the connection settings beyond the URL.
type Options struct {
	// ListenURL is a connection string for LISTEN that bypasses a transaction pooler
	// ("": LISTEN connects with the pool's settings, on a connection of its own, which
	// needs a session: not through a transaction pooler).
	ListenURL string
	// QueryMode is pgx's query exec mode (QueryModes; "": the URL's
	// default_query_exec_mode, else cache_statement). Behind a pooler in transaction mode
	// that does not track prepared statements use exec: no named prepared statements.
	QueryMode string
	// AuditKey, when set, seals every event written with a MAC (store/mac.go).
	AuditKey *store.AuditKey
}

// QueryModes are the pgx query exec modes Options.QueryMode accepts.
var QueryModes = map[string]pgx.QueryExecMode{
	"cache_statement": pgx.QueryExecModeCacheStatement,
	"cache_describe":  pgx.QueryExecModeCacheDescribe,
	"describe_exec":   pgx.QueryExecModeDescribeExec,
	"exec":            pgx.QueryExecModeExec,
	"simple_protocol": pgx.QueryExecModeSimpleProtocol,
}

// Open connects to url (a postgres:// URL or DSN). It does not migrate.
func Open(ctx context.Context, url string) (*Store, error) {
	return OpenWith(ctx, url, Options{})
}

// OpenWith connects to url with the options. It does not migrate.
func OpenWith(ctx context.Context, url string, opt Options) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", redact(err))
	}
	if opt.QueryMode != "" {
		mode, ok := QueryModes[opt.QueryMode]
		if !ok {
			return nil, fmt.Errorf("unknown query exec mode %q", opt.QueryMode)
		}
		cfg.ConnConfig.DefaultQueryExecMode = mode
	}
	if opt.ListenURL != "" {
		if _, err := pgx.ParseConfig(opt.ListenURL); err != nil {
			return nil, fmt.Errorf("parse listen database url: %w", redact(err))
		}
	}
	return OpenConfigWith(ctx, cfg, opt)
}

// OpenConfig connects with a parsed pool configuration (tests set search_path on it).
func OpenConfig(ctx context.Context, cfg *pgxpool.Config) (*Store, error) {
	return OpenConfigWith(ctx, cfg, Options{})
}

// OpenConfigWith connects with a parsed pool configuration and the options beyond it
// (opt.QueryMode is cfg's to set).
func OpenConfigWith(ctx context.Context, cfg *pgxpool.Config, opt Options) (*Store, error) {
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to postgres: %w", classify(err))
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to postgres: %w", classify(err))
	}
	st := &Store{pool: pool, listenURL: opt.ListenURL}
	// A Citus coordinator gets the forms of the few statements Citus cannot plan (citus.go).
	citus, err := st.IsCitus(ctx)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to postgres: %w", classify(err))
	}
	st.queries = queries{db: joined{st}, citus: citus, key: opt.AuditKey}
	return st, nil
}

// txKey carries, in a Within's ctx, the transaction this store's statements join.
type txKey struct{ s *Store }

func (s *Store) bound(ctx context.Context) pgx.Tx {
	tx, _ := ctx.Value(txKey{s}).(pgx.Tx)
	return tx
}

// joined runs a statement in the transaction of a Within whose ctx it is given, else
// on the pool (autocommit); its errors are classified.
type joined struct{ s *Store }

func (j joined) on(ctx context.Context) dbtx {
	if tx := j.s.bound(ctx); tx != nil {
		return classified{tx}
	}
	return classified{j.s.pool}
}

func (j joined) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return j.on(ctx).Exec(ctx, sql, args...)
}

func (j joined) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return j.on(ctx).Query(ctx, sql, args...)
}

func (j joined) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return j.on(ctx).QueryRow(ctx, sql, args...)
}

func (s *Store) Within(ctx context.Context, fn func(ctx context.Context) error) error {
	if s.bound(ctx) != nil {
		return fn(ctx)
	}
	return s.transact(ctx, func(tx pgx.Tx) error { return fn(context.WithValue(ctx, txKey{s}, tx)) })
}

// redact drops a DSN (which may carry a password) from a parse error.
func redact(err error) error {
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		return errors.New(strings.TrimPrefix(pe.Error(), "cannot parse `"+pe.ConnString+"`: "))
	}
	return err
}

func (s *Store) Backend() string { return "postgres" }
func (s *Store) Close() error    { s.pool.Close(); return nil }
func (s *Store) Ping(ctx context.Context) error {
	return classify(s.pool.Ping(ctx))
}

// Pool exposes the pool for benchmarks that measure raw statements beside the store.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// transactTries bounds how often Transact runs fn when PostgreSQL aborts it for a deadlock
// or a serialization failure.
const transactTries = 4

// Transact runs fn in a READ COMMITTED transaction: the code takes the row locks it
// relies on (FOR UPDATE, RunLockKeys in key order, the claim's upsert) instead of
// counting on a stricter isolation level. When PostgreSQL aborts the transaction with a
// deadlock (40P01) or a serialization failure (40001), nothing of it was committed, and
// fn runs again from the start in a new transaction, up to transactTries times with a
// short jittered pause; fn must therefore keep no state across runs (store.Store says so).
// Inside a Within, fn runs in a savepoint of that transaction instead, once: the whole
// request is what may be retried (by its client, with its Idempotency-Key).
func (s *Store) Transact(ctx context.Context, fn func(q store.Queries) error) error {
	run := func(tx pgx.Tx) error { return fn(queries{db: classified{tx}, citus: s.citus, key: s.key}) }
	if s.bound(ctx) != nil {
		return s.transact(ctx, run)
	}
	for try := 1; ; try++ {
		err := s.transact(ctx, run)
		if err == nil || try == transactTries || !retryable(err) {
			return err
		}
		pause := time.Duration(rand.Int64N(int64(5*time.Millisecond) << try))
		select {
		case <-ctx.Done():
			return err
		case <-time.After(pause):
		}
	}
}

// retryable reports whether err is PostgreSQL aborting a transaction that may simply be
// run again: a deadlock or a serialization failure.
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// invalidValue is a driver error that is also store.ErrInvalidValue.
type invalidValue struct{ error }

func (e invalidValue) Unwrap() []error { return []error{e.error, store.ErrInvalidValue} }

// valueError marks a data exception (class 22: bytes the encoding cannot hold, a NUL in
// text or jsonb) or an integrity constraint violation (class 23) as store.ErrInvalidValue:
// the values, not the database, are at fault, and running the statement again cannot help.
func valueError(err error) error {
	var pgErr *pgconn.PgError
	if err == nil || errors.Is(err, store.ErrInvalidValue) || !errors.As(err, &pgErr) {
		return err
	}
	if strings.HasPrefix(pgErr.Code, "22") || strings.HasPrefix(pgErr.Code, "23") {
		return invalidValue{err}
	}
	return err
}

// transact runs fn in a READ COMMITTED transaction, or in a savepoint of the one ctx joins.
func (s *Store) transact(ctx context.Context, fn func(tx pgx.Tx) error) (err error) {
	defer func() { err = valueError(err) }()
	var tx pgx.Tx
	if outer := s.bound(ctx); outer != nil {
		tx, err = outer.Begin(ctx) // a savepoint
	} else {
		tx, err = s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	}
	if err != nil {
		return fmt.Errorf("begin: %w", classify(err))
	}
	defer func() {
		if p := recover(); p != nil {
			_ = tx.Rollback(ctx)
			panic(p)
		}
		if err != nil {
			_ = tx.Rollback(ctx)
		}
	}()
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", classify(err))
	}
	return nil
}

// ReadinessWrite upserts the instance's row and forgets instances silent for a day, in
// one transaction committed with synchronous_commit on: the commit waits for its WAL to
// reach the disk, as every other commit does unless an operator turned that off.
func (s *Store) ReadinessWrite(ctx context.Context, instance string) error {
	return s.Transact(ctx, func(q store.Queries) error {
		db := q.(queries).db
		if _, err := db.Exec(ctx, `SET LOCAL synchronous_commit = on`); err != nil {
			return fmt.Errorf("readiness write: %w", err)
		}
		if _, err := db.Exec(ctx, `INSERT INTO readiness (instance, checked_at) VALUES ($1, now())
			ON CONFLICT (instance) DO UPDATE SET checked_at = EXCLUDED.checked_at, checks = readiness.checks + 1`, instance); err != nil {
			return fmt.Errorf("readiness write: %w", err)
		}
		if _, err := db.Exec(ctx, `DELETE FROM readiness WHERE checked_at < now() - interval '1 day'`); err != nil {
			return fmt.Errorf("readiness write: %w", err)
		}
		return nil
	})
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
	citus, err := s.IsCitus(ctx)
	if err != nil {
		return nil, fmt.Errorf("detect citus: %w", err)
	}
	if p.Citus && !citus {
		return nil, ErrNoCitus // before any migration: --citus never leaves a single-node schema
	}
	var done []string
	// One transaction for all pending migrations: PostgreSQL DDL is transactional, and
	// the advisory lock makes instances that start together wait for the first.
	err = s.Transact(ctx, func(q store.Queries) error {
		done = nil // a retried transaction starts over
		db := q.(queries).db
		if _, err := db.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrationLock)); err != nil {
			return fmt.Errorf("lock migrations: %w", err)
		}
		if _, err := db.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
			version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return fmt.Errorf("create schema_migrations: %w", err)
		}
		applied, err := appliedVersions(ctx, db)
		if err != nil {
			return err
		}
		pending := store.Pending(ms, applied)
		if err := guardLevel(ctx, db, pending, p); err != nil {
			return err
		}
		for _, m := range pending {
			if _, err := db.Exec(ctx, m.SQL); err != nil {
				return fmt.Errorf("migration %s: %w", m.Name, err)
			}
			if _, err := db.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
				return fmt.Errorf("record migration %s: %w", m.Name, err)
			}
			if m.WriterLevel > 0 {
				if _, err := db.Exec(ctx, `UPDATE writer_level SET level = $1 WHERE level < $1`, m.WriterLevel); err != nil {
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
	// On a Citus coordinator the tables are then placed per the plan (citus.go). Detected,
	// not configured: every path that migrates (serve, the tests' stores) must place them,
	// and a table left local on a coordinator would work but take every write itself.
	if citus {
		if _, err := s.distributeCitus(ctx); err != nil {
			return nil, err
		}
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
	rows, err := db.Query(ctx, `SELECT version FROM schema_migrations`)
	var versions []int
	if err == nil {
		versions, err = pgx.CollectRows(rows, pgx.RowTo[int])
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
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

// dbtx is what pgxpool.Pool and pgx.Tx share.
type dbtx interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

type queries struct {
	db    dbtx
	citus bool            // the database is a Citus coordinator
	key   *store.AuditKey // seals events (nil: written unkeyed)
}

const runColumns = `idempotency_key, state, payload_hash, lease_owner, lease_started_at,
	lease_expires_at, version, result, duplicates, reclaims, trigger_source, workflow_version,
	created_at, updated_at, action_type, repairs, validations, model_calls, tokens, park_reason,
	replaced_by`

func scanRun(row pgx.Row) (store.Run, error) {
	var r store.Run
	var state string
	var result []byte
	err := row.Scan(&r.Key, &state, &r.PayloadHash, &r.LeaseOwner, &r.LeaseStartedAt,
		&r.LeaseExpiresAt, &r.Version, &result, &r.Duplicates, &r.Reclaims, &r.TriggerSource,
		&r.WorkflowVersion, &r.CreatedAt, &r.UpdatedAt, &r.ActionType, &r.Repairs, &r.Validations,
		&r.ModelCalls, &r.Tokens, &r.ParkReason, &r.ReplacedBy)
	if err != nil {
		return store.Run{}, interpret(err)
	}
	r.State = store.State(state)
	if result != nil {
		r.Result = json.RawMessage(result)
	}
	return r, nil
}

// interpret translates driver errors into the store's sentinels at the boundary.
func interpret(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return store.ErrNotFound
	}
	return err
}

// noMatch turns "no row" from a compare-and-set into ErrNoMatch.
func noMatch(r store.Run, err error) (store.Run, error) {
	if errors.Is(err, store.ErrNotFound) {
		return store.Run{}, store.ErrNoMatch
	}
	return r, err
}

func micros(d time.Duration) int64 { return d.Microseconds() }

// jsonArg passes nil for an absent document so the column stays NULL.
func jsonArg(b json.RawMessage) any {
	if b == nil {
		return nil
	}
	return string(b)
}

func (q queries) Clock(ctx context.Context) (time.Time, error) {
	var t time.Time
	if err := q.db.QueryRow(ctx, `SELECT now()`).Scan(&t); err != nil {
		return time.Time{}, fmt.Errorf("read clock: %w", err)
	}
	return t, nil
}

// The claim is one INSERT … ON CONFLICT DO UPDATE … WHERE … RETURNING, with the lease
// start recorded (to cap total lease life), a reclaim counter, and a NULL lease treated
// as lapsed.
const claimSQL = `
INSERT INTO workflow_runs AS r (idempotency_key, state, payload_hash, lease_owner,
  lease_started_at, lease_expires_at, version, trigger_source, workflow_version,
  created_at, updated_at)
VALUES ($1, 'processing', $2, $3, airlock_now($4::timestamptz),
  airlock_now($4::timestamptz) + $5::bigint * interval '1 microsecond', 1, $6, $7,
  airlock_now($4::timestamptz), airlock_now($4::timestamptz))
` + claimConflictSQL

// claimConflictSQL is the claim's answer to a run that exists: it takes it again only
// with the same payload, while it may be retried or its lease has lapsed (both claim
// statements end with it; the run's table is aliased r).
const claimConflictSQL = `
ON CONFLICT (idempotency_key) DO UPDATE
SET lease_owner = EXCLUDED.lease_owner,
    lease_started_at = EXCLUDED.lease_started_at,
    lease_expires_at = EXCLUDED.lease_expires_at,
    state = 'processing',
    version = r.version + 1,
    reclaims = r.reclaims + 1,
    updated_at = EXCLUDED.updated_at
WHERE r.payload_hash = EXCLUDED.payload_hash
  AND (r.state = 'failed_retryable'
       OR (r.state = 'processing'
           AND (r.lease_expires_at IS NULL OR r.lease_expires_at <= EXCLUDED.updated_at)))
RETURNING ` + runColumns

func (q queries) RunClaim(ctx context.Context, p store.RunClaimParams) (store.Run, error) {
	return noMatch(scanRun(q.db.QueryRow(ctx, claimSQL, p.Key, p.PayloadHash, p.Owner, p.Now,
		micros(p.Lease), p.TriggerSource, p.WorkflowVersion)))
}

// claimRecordSQL is a claim that takes the run, with its events, in one statement: the
// claim statement; the replacement a new run continues (the rerun protocol's link); and
// the events store.ClaimSequence writes, with the same details — the claim's, and an
// alert when the reclaims pass $10 (the VALUES list keeps that order). When the claim
// takes nothing it returns no row and writes nothing: refuseRecordSQL follows.
//
// A new run's `claimed` event is its chain's first link, and the statement writes it
// itself (0035): it takes the event's id from the id column's sequence (by the column,
// not by a name: a table re-created keeps the column, not the name), hashes the event's content
// as the events_chain trigger would (the same SQL functions over the same values), and
// inserts the run with its chain head and the event with its link; the trigger leaves a
// linked event alone. A reclaim's events, and a new run whose key already has a head in
// event_chains (events written before its run existed), are linked by the trigger.
//
// $1 key, $2 payload hash, $3 owner, $4 now (NULL: the database clock), $5 lease (µs),
// $6 trigger source, $7 workflow version, $8 actor, $9 meta, $10 alert threshold.
const claimRecordSQL = `
WITH pre AS (
  SELECT nextval(pg_get_serial_sequence('events', 'id')) AS id, airlock_now($4::timestamptz) AS at,
    airlock_now($4::timestamptz) + $5::bigint * interval '1 microsecond' AS lease_end
), first AS MATERIALIZED (
  SELECT pre.*, b.base, d.detail, d.detail::text AS detail_text, pre.id::text AS id_text,
    (extract(epoch FROM pre.at) * 1000000)::bigint::text AS at_text, $9::jsonb::text AS meta_text
  FROM pre
  CROSS JOIN LATERAL (SELECT jsonb_build_object('payload_hash', $2::text,
      'lease_expires_at', (to_jsonb(pre.lease_end AT TIME ZONE 'UTC') #>> '{}') || 'Z') AS base) b
  CROSS JOIN LATERAL (SELECT b.base || coalesce((SELECT jsonb_build_object('replaces', p.old_key, 'provider_ids', p.provider_ids)
      FROM replacements p WHERE p.new_key = $1), '{}'::jsonb) AS detail) d
), linked AS (
  -- The link as events_chain computes it: airlock_chain_field of each value, each a
  -- column of the materialized CTE above or a parameter, so that PostgreSQL inlines the
  -- function (it calls, not inlines, one whose repeated argument is an expression).
  SELECT f.*, CASE WHEN EXISTS (SELECT FROM event_chains c WHERE c.run_key = $1) THEN NULL
    ELSE encode(sha256(convert_to('0:' || airlock_chain_field(f.id_text) || airlock_chain_field($1::text)
      || airlock_chain_field(f.at_text) || airlock_chain_field('claimed') || airlock_chain_field('1')
      || airlock_chain_field($8::text) || airlock_chain_field(f.meta_text)
      || airlock_chain_field(f.detail_text), 'UTF8')), 'hex') END AS head
  FROM first f
), claimed AS (
  INSERT INTO workflow_runs AS r (idempotency_key, state, payload_hash, lease_owner,
    lease_started_at, lease_expires_at, version, trigger_source, workflow_version,
    created_at, updated_at, chain_seq, chain_head, chain_started_at)
  SELECT $1, 'processing', $2, $3, l.at, l.lease_end, 1, $6, $7, l.at, l.at,
    CASE WHEN l.head IS NULL THEN NULL ELSE 1 END, l.head, CASE WHEN l.head IS NULL THEN NULL ELSE l.at END
  FROM linked l` + claimConflictSQL + `
), recorded AS (
  INSERT INTO events (id, run_key, at, kind, version, actor, meta, detail, chain_seq, chain_hash)
  OVERRIDING SYSTEM VALUE
  SELECT CASE WHEN e.kind = 'alert' THEN nextval(pg_get_serial_sequence('events', 'id')) ELSE l.id END,
    c.idempotency_key, l.at, e.kind, c.version, e.actor, e.meta, e.detail,
    CASE WHEN e.kind = 'claimed' AND l.head IS NOT NULL THEN 1 END,
    CASE WHEN e.kind = 'claimed' THEN l.head END
  FROM claimed c CROSS JOIN linked l
  CROSS JOIN LATERAL (VALUES
    (CASE WHEN c.reclaims > 0 THEN 'lease_reclaimed' ELSE 'claimed' END, $8::text, $9::jsonb,
     CASE WHEN c.reclaims > 0 THEN l.base || jsonb_build_object('reclaims', c.reclaims) ELSE l.detail END),
    ('alert', 'airlock', NULL,
     jsonb_build_object('alert', 'lease_reclaims', 'reclaims', c.reclaims, 'threshold', $10::bigint))
  ) AS e (kind, actor, meta, detail)
  WHERE e.kind <> 'alert' OR (c.reclaims > 0 AND c.reclaims > $10::bigint)
)
SELECT ` + runColumns + ` FROM claimed`

// refuseRecordSQL records a refused claim in one statement: the duplicate count (when
// the payload hash matches) and its duplicate or payload_mismatch event. Its snapshot is
// taken after the claim statement that took nothing, so it sees the row that refused it.
//
// $1 key, $2 payload hash, $3 now (NULL: the database clock), $4 actor, $5 meta.
const refuseRecordSQL = `
WITH refused AS (
  UPDATE workflow_runs
  SET duplicates = duplicates + CASE WHEN payload_hash = $2::text THEN 1 ELSE 0 END
  WHERE idempotency_key = $1
    -- Still refusable: a run that became claimable since the claim statement (moved to
    -- failed_retryable, or its lease lapsed) is not refused; the claim is tried again.
    AND (payload_hash <> $2::text
         OR NOT (state = 'failed_retryable'
                 OR (state = 'processing'
                     AND (lease_expires_at IS NULL OR lease_expires_at <= airlock_now($3::timestamptz)))))
  RETURNING ` + runColumns + `
), recorded AS (
  INSERT INTO events (run_key, at, kind, version, actor, meta, detail)
  SELECT f.idempotency_key, airlock_now($3::timestamptz),
    CASE WHEN f.payload_hash = $2::text THEN 'duplicate' ELSE 'payload_mismatch' END, 0, $4::text, $5::jsonb,
    CASE WHEN f.payload_hash = $2::text
      THEN jsonb_build_object('state', f.state, 'duplicates', f.duplicates)
      ELSE jsonb_build_object('payload_hash', $2::text, 'stored_payload_hash', f.payload_hash) END
  FROM refused f
)
SELECT ` + runColumns + ` FROM refused`

// Claim is the whole claim in autocommit: one statement (one round trip) when it takes
// the run, a second one when it is refused. Each statement is atomic; between them the
// refusing row only moves on, and the refusal is recorded against it as it then is.
//
// A refusal is recorded only while the run is still refusable: if it became claimable
// between the two statements (another delivery moved it to failed_retryable, or its
// lease lapsed), the claim is tried again, so a refusal never reports a state in which the
// claim should have been granted (the fault-injecting harness found that history).
//
// With an audit key, the claim's events must carry MACs over details only the claim
// statement knows (the run's version, reclaims, lease, replacement): the claim then runs
// as store.ClaimSequence in one transaction, which writes the same events with Go
// computing each one's content, and so its MAC, before inserting it.
//
// On Citus the claim always runs so (claimCitus): Citus 13.2 executes the one statement's
// data-modifying CTEs over a connection to every worker, although its EXPLAIN shows one
// task, so one stopped worker failed the claims of every run (TestStoppedWorkerClaims).
func (s *Store) Claim(ctx context.Context, p store.ClaimParams) (store.ClaimOutcome, error) {
	if s.citus {
		return s.claimCitus(ctx, p)
	}
	if s.key != nil {
		var out store.ClaimOutcome
		err := s.Transact(ctx, func(q store.Queries) (err error) {
			out, err = store.ClaimSequence(ctx, q, p)
			return err
		})
		if err != nil {
			return store.ClaimOutcome{}, fmt.Errorf("claim: %w", err)
		}
		return out, nil
	}
	meta := jsonArg(p.Meta)
	for range 16 {
		run, err := scanRun(s.db.QueryRow(ctx, claimRecordSQL, p.Key, p.PayloadHash, p.Owner, p.Now,
			micros(p.Lease), p.TriggerSource, p.WorkflowVersion, p.Actor, meta, p.AlertAfter))
		if err == nil {
			out := store.ClaimOutcome{Run: run, Claimed: true}
			out.Alerted = out.Reclaimed() && run.Reclaims > p.AlertAfter
			return out, nil
		}
		if !errors.Is(err, store.ErrNotFound) {
			return store.ClaimOutcome{}, fmt.Errorf("claim: %w", err)
		}
		if p.Refusing != nil {
			p.Refusing()
		}
		run, err = scanRun(s.db.QueryRow(ctx, refuseRecordSQL, p.Key, p.PayloadHash, p.Now, p.Actor, meta))
		if errors.Is(err, store.ErrNotFound) {
			continue // claimable now: claim again
		}
		if err != nil {
			return store.ClaimOutcome{}, fmt.Errorf("record refused claim: %w", err)
		}
		return store.ClaimOutcome{Run: run, Mismatch: run.PayloadHash != p.PayloadHash}, nil
	}
	return store.ClaimOutcome{}, fmt.Errorf("claim %q: the run kept changing between claim and refusal", p.Key)
}

// errClaimableAgain rolls back claimCitus's transaction when the run it refused has
// become claimable since its claim statement.
var errClaimableAgain = errors.New("the refused run became claimable")

// claimCitus is the claim on Citus: store.ClaimSequence in one transaction, each of its
// statements routed by the run's key to the one worker holding the run (its events,
// replacement and effects are co-located), so a stopped worker fails only the claims of
// its own runs (store.ErrUnavailable). Like the one statement, it records a refusal only
// while the run is still refusable: when the run became claimable between the claim
// statement and the refusal (failed_retryable, or its lease lapsed), the transaction is
// rolled back and the claim tried again.
func (s *Store) claimCitus(ctx context.Context, p store.ClaimParams) (store.ClaimOutcome, error) {
	for range 16 {
		var out store.ClaimOutcome
		err := s.Transact(ctx, func(q store.Queries) (err error) {
			out, err = store.ClaimSequence(ctx, q, p)
			if err != nil || out.Claimed || out.Mismatch {
				return err
			}
			var claimable bool
			err = q.(queries).db.QueryRow(ctx, `SELECT state = 'failed_retryable'
				  OR (state = 'processing' AND (lease_expires_at IS NULL OR lease_expires_at <= airlock_now($2::timestamptz)))
				FROM workflow_runs WHERE idempotency_key = $1`, p.Key, p.Now).Scan(&claimable)
			if err != nil {
				return fmt.Errorf("recheck refused run: %w", err)
			}
			if claimable {
				return errClaimableAgain
			}
			return nil
		})
		if errors.Is(err, errClaimableAgain) {
			continue
		}
		if err != nil {
			return store.ClaimOutcome{}, fmt.Errorf("claim: %w", err)
		}
		return out, nil
	}
	return store.ClaimOutcome{}, fmt.Errorf("claim %q: the run kept changing between claim and refusal", p.Key)
}

func (q queries) RunRefuse(ctx context.Context, key, payloadHash string) (store.Run, error) {
	return scanRun(q.db.QueryRow(ctx, `
		UPDATE workflow_runs
		SET duplicates = duplicates + CASE WHEN payload_hash = $2 THEN 1 ELSE 0 END
		WHERE idempotency_key = $1
		RETURNING `+runColumns, key, payloadHash))
}

func (q queries) RunGet(ctx context.Context, key string) (store.Run, error) {
	return scanRun(q.db.QueryRow(ctx, `SELECT `+runColumns+` FROM workflow_runs WHERE idempotency_key = $1`, key))
}

func (q queries) RunHeartbeat(ctx context.Context, p store.RunHeartbeatParams) (store.Run, error) {
	return noMatch(scanRun(q.db.QueryRow(ctx, `
		UPDATE workflow_runs
		SET lease_expires_at = least(
		      airlock_now($4::timestamptz) + $5::bigint * interval '1 microsecond',
		      airlock_add_us(lease_started_at, $6::bigint))
		WHERE idempotency_key = $1 AND lease_owner = $2 AND version = $3
		  AND state = 'processing'
		  AND lease_expires_at > airlock_now($4::timestamptz)
		  AND lease_expires_at < airlock_add_us(lease_started_at, $6::bigint)
		RETURNING `+runColumns, p.Key, p.Owner, p.Version, p.Now, micros(p.Lease), micros(p.Lifetime))))
}

func (q queries) RunTransition(ctx context.Context, p store.RunTransitionParams) (store.Run, error) {
	return noMatch(scanRun(q.db.QueryRow(ctx, `
		UPDATE workflow_runs
		SET state = $5, version = version + 1, result = coalesce($6::jsonb, result),
		    lease_expires_at = NULL, updated_at = airlock_now($7::timestamptz), park_reason = $8
		WHERE idempotency_key = $1 AND lease_owner = $2 AND version = $3 AND state = $4
		  AND lease_expires_at > airlock_now($7::timestamptz)
		RETURNING `+runColumns, p.Key, p.Owner, p.Version, string(p.From), string(p.To), jsonArg(p.Result), p.Now, p.ParkReason)))
}

func (q queries) RunOpenEffects(ctx context.Context, key string) (int, error) {
	var n int
	err := q.db.QueryRow(ctx, `SELECT count(*) FROM effects WHERE idempotency_key = $1
		AND state IN ('pending', 'sending', 'planned', 'unknown', 'failed')`, key).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count open effects: %w", err)
	}
	return n, nil
}

func (q queries) EventInsert(ctx context.Context, p store.EventInsertParams) (store.Event, error) {
	e := store.Event{RunKey: p.RunKey, Kind: p.Kind, Version: p.Version, Actor: p.Actor, Meta: p.Meta, Detail: p.Detail}
	macKey, mac, err := q.key.Seal(p)
	if err != nil {
		return store.Event{}, fmt.Errorf("insert event: %w", err)
	}
	err = q.db.QueryRow(ctx, `
		INSERT INTO events (run_key, at, kind, version, actor, meta, detail, mac_key, mac)
		VALUES ($1, airlock_now($2::timestamptz), $3, $4, $5, $6::jsonb, $7::jsonb, $8, $9)
		RETURNING id, at`, p.RunKey, p.Now, p.Kind, p.Version, p.Actor, jsonArg(p.Meta), jsonArg(p.Detail), macKey, mac).Scan(&e.ID, &e.At)
	if err != nil {
		return store.Event{}, fmt.Errorf("insert event: %w", err)
	}
	return e, nil
}

func (q queries) EventExistsExcept(ctx context.Context, key string, kinds []string) (bool, error) {
	var found bool
	err := q.db.QueryRow(ctx, `SELECT EXISTS (SELECT FROM events WHERE run_key = $1 AND kind <> ALL($2::text[]))`,
		key, kinds).Scan(&found)
	if err != nil {
		return false, fmt.Errorf("look up events: %w", err)
	}
	return found, nil
}

// EventList pages in (writing transaction, id) order and returns only events whose
// transaction is older than the oldest one in flight (the snapshot's xmin): every such
// transaction has ended, and any later one gets a larger xid, so no event can still
// appear before the page's last. The cursor is the last event's id; its transaction is
// looked up (an event purged meanwhile falls back to id order).
//
// A short page while committed events of the run wait behind an older transaction still
// in flight (usually for milliseconds) is read again, for up to about two seconds, so a
// client sees its own committed change; past that the safe page is returned as it is.
func (q queries) EventList(ctx context.Context, key string, afterID int64, limit int) ([]store.Event, error) {
	_, pooled := q.db.(*pgxpool.Pool) // inside a transaction, waiting could wait on itself
	for wait := 4 * time.Millisecond; ; wait *= 2 {
		var rows pgx.Rows
		var err error
		if q.citus {
			rows, err = q.eventListCitus(ctx, key, afterID, limit)
		} else {
			rows, err = q.db.Query(ctx, eventListSQL, key, afterID, limit)
		}
		if err != nil {
			return nil, fmt.Errorf("list events: %w", err)
		}
		var evs []store.Event
		held := false
		for rows.Next() {
			var e store.Event
			var meta, detail []byte
			var flag bool
			var ord int64
			if err := rows.Scan(&e.ID, &e.RunKey, &e.At, &e.Kind, &e.Version, &e.Actor, &meta, &detail, &flag, &ord); err != nil {
				rows.Close()
				return nil, fmt.Errorf("list events: %w", err)
			}
			if flag {
				held = true
				continue
			}
			e.Meta, e.Detail = rawOrNil(meta), rawOrNil(detail)
			evs = append(evs, e)
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("list events: %w", err)
		}
		if len(evs) == limit || !held || !pooled || wait > 2*time.Second { // slept 4 ms + 8 ms + … + 1,024 ms ≈ 2 s
			return evs, nil
		}
		select {
		case <-ctx.Done():
			return evs, nil
		case <-time.After(wait):
		}
	}
}

// eventsAfter is the cursor condition of EventList ($1 run key, $2 the last event's id).
// Written as one row comparison so the (run_key, xid, id) index serves it as a range;
// without the cursor's row it reduces to id > $2.
const eventsAfter = `run_key = $1
	AND (xid, id) > ((SELECT coalesce(max(xid), '0') FROM cursor), $2)
	AND (id > $2 OR EXISTS (SELECT FROM cursor))`

// eventListSQL returns the page, then — judged on the same snapshot — one flag row when
// committed events past the cursor wait behind an older transaction still in flight.
const eventListSQL = `
	WITH cursor AS (SELECT xid FROM events WHERE run_key = $1 AND id = $2),
	horizon AS (` + eventHorizonSQL + `),` + eventPageSQL

// eventHorizonSQL is the oldest transaction in flight that has written to this schema
// (xmin), on the node that runs it.
const eventHorizonSQL = `
	  -- The oldest transaction still in flight that has written to airlock's tables (it
	  -- holds a lock on one of this schema's relations): it may still add an event below
	  -- any later one. Transactions of other schemas or databases on the server (other
	  -- tenants, other tests) do not hold readers back; one that has not written yet has no
	  -- id, and gets a higher one when it does.
	  SELECT coalesce(min(x), pg_snapshot_xmax(pg_current_snapshot())) AS xmin
	  FROM pg_snapshot_xip(pg_current_snapshot()) AS x
	  WHERE (x::text::bigint % 4294967296)::text IN (
	    SELECT t.transactionid::text FROM pg_locks t
	    JOIN pg_locks r ON r.virtualtransaction = t.virtualtransaction AND r.locktype = 'relation'
	    JOIN pg_class c ON c.oid = r.relation
	    WHERE t.locktype = 'transactionid'
	      AND r.database = (SELECT oid FROM pg_database WHERE datname = current_database())
	      AND c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = 'events'::regclass))`

// eventPageSQL is EventList's page and flag below the horizon (a CTE named horizon).
const eventPageSQL = `
	page AS (
	  SELECT ` + eventColumns + `, xid FROM events
	  WHERE ` + eventsAfter + ` AND xid < (SELECT xmin FROM horizon)
	  ORDER BY xid, id LIMIT $3)
	SELECT ` + eventColumns + `, false AS held, row_number() OVER (ORDER BY xid, id) AS ord FROM page
	UNION ALL
	SELECT 0, '', now(), '', 0, '', NULL, NULL, true, 0
	WHERE EXISTS (SELECT FROM events WHERE ` + eventsAfter + ` AND xid >= (SELECT xmin FROM horizon))
	ORDER BY held, ord`

const eventColumns = `id, run_key, at, kind, version, actor, meta, detail`

func scanEvent(row pgx.CollectableRow) (store.Event, error) {
	var e store.Event
	var meta, detail []byte
	err := row.Scan(&e.ID, &e.RunKey, &e.At, &e.Kind, &e.Version, &e.Actor, &meta, &detail)
	e.Meta, e.Detail = rawOrNil(meta), rawOrNil(detail)
	return e, err
}

func rawOrNil(b []byte) json.RawMessage {
	if b == nil {
		return nil
	}
	return json.RawMessage(b)
}

func (q queries) APIKeyInsert(ctx context.Context, k store.APIKey) error {
	_, err := q.db.Exec(ctx, `INSERT INTO api_keys (id, name, key_hash, scopes, created_at, on_behalf_of, types) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
		k.ID, k.Name, k.Hash, strings.Join(k.Scopes, ","), k.CreatedAt, k.OnBehalfOf, strings.Join(k.Types, ","))
	if err != nil {
		return fmt.Errorf("insert api key: %w", err)
	}
	return nil
}

const apiKeyColumns = `id, name, key_hash, scopes, created_at, revoked_at, on_behalf_of, types`

func scanAPIKey(row pgx.Row) (store.APIKey, error) {
	var k store.APIKey
	var scopes, types string
	if err := row.Scan(&k.ID, &k.Name, &k.Hash, &scopes, &k.CreatedAt, &k.RevokedAt, &k.OnBehalfOf, &types); err != nil {
		return store.APIKey{}, interpret(err)
	}
	k.Scopes, k.Types = strings.Split(scopes, ","), splitList(types)
	return k, nil
}

func (q queries) APIKeyByHash(ctx context.Context, hash string) (store.APIKey, error) {
	return scanAPIKey(q.db.QueryRow(ctx, `SELECT `+apiKeyColumns+` FROM api_keys WHERE key_hash = $1`, hash))
}

func (q queries) APIKeyList(ctx context.Context) ([]store.APIKey, error) {
	rows, err := q.db.Query(ctx, `SELECT `+apiKeyColumns+` FROM api_keys ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("list api keys: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.APIKey, error) { return scanAPIKey(row) })
}

func (q queries) APIKeyRevoke(ctx context.Context, id string, at time.Time) error {
	tag, err := q.db.Exec(ctx, `UPDATE api_keys SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL`, id, at)
	if err != nil {
		return fmt.Errorf("revoke api key: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return store.ErrNotFound
	}
	return nil
}

func (q queries) EvidenceInsert(ctx context.Context, e store.Evidence) (store.Evidence, error) {
	err := q.db.QueryRow(ctx, `INSERT INTO evidence (idempotency_key, source, name, value, recorded_by, created_at)
		VALUES ($1, $2, $3, $4::jsonb, $5, coalesce($6, now())) RETURNING id, created_at`,
		e.RunKey, e.Source, e.Name, string(e.Value), e.RecordedBy, timeArg(e.CreatedAt)).Scan(&e.ID, &e.CreatedAt)
	if err != nil {
		return store.Evidence{}, fmt.Errorf("insert evidence: %w", err)
	}
	return e, nil
}

func (q queries) EvidenceByRun(ctx context.Context, key string) ([]store.Evidence, error) {
	rows, err := q.db.Query(ctx, `SELECT id, idempotency_key, source, name, value, recorded_by, created_at
		FROM evidence WHERE idempotency_key = $1 ORDER BY id`, key)
	if err != nil {
		return nil, fmt.Errorf("list evidence: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Evidence, error) {
		var e store.Evidence
		var value []byte
		err := row.Scan(&e.ID, &e.RunKey, &e.Source, &e.Name, &value, &e.RecordedBy, &e.CreatedAt)
		e.Value = value
		return e, err
	})
}
