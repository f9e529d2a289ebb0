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
	"strings"
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
	pool *pgxpool.Pool
}

// Open connects to url (a postgres:// URL or DSN). It does not migrate.
func Open(ctx context.Context, url string) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", redact(err))
	}
	return OpenConfig(ctx, cfg)
}

// OpenConfig connects with a parsed pool configuration (tests set search_path on it).
func OpenConfig(ctx context.Context, cfg *pgxpool.Config) (*Store, error) {
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to postgres: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to postgres: %w", err)
	}
	st := &Store{pool: pool}
	st.queries = queries{db: joined{st}}
	return st, nil
}

// txKey carries, in a Within's ctx, the transaction this store's statements join.
type txKey struct{ s *Store }

func (s *Store) bound(ctx context.Context) pgx.Tx {
	tx, _ := ctx.Value(txKey{s}).(pgx.Tx)
	return tx
}

// joined runs a statement in the transaction of a Within whose ctx it is given, else
// on the pool (autocommit).
type joined struct{ s *Store }

func (j joined) on(ctx context.Context) dbtx {
	if tx := j.s.bound(ctx); tx != nil {
		return tx
	}
	return j.s.pool
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
	return s.pool.Ping(ctx)
}

// Pool exposes the pool for benchmarks that measure raw statements beside the store.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

func (s *Store) Transact(ctx context.Context, fn func(q store.Queries) error) error {
	return s.transact(ctx, func(tx pgx.Tx) error { return fn(queries{db: tx}) })
}

// transact runs fn in a transaction, or in a savepoint of the one ctx joins.
func (s *Store) transact(ctx context.Context, fn func(tx pgx.Tx) error) (err error) {
	var tx pgx.Tx
	if outer := s.bound(ctx); outer != nil {
		tx, err = outer.Begin(ctx) // a savepoint
	} else {
		tx, err = s.pool.Begin(ctx)
	}
	if err != nil {
		return fmt.Errorf("begin: %w", err)
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
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

func (s *Store) WriteCheck(ctx context.Context) error {
	err := s.Transact(ctx, func(q store.Queries) error {
		if _, err := q.(queries).db.Exec(ctx, store.WriteCheckSQL); err != nil {
			return fmt.Errorf("write check: %w", err)
		}
		return store.ErrRollback
	})
	if errors.Is(err, store.ErrRollback) {
		return nil
	}
	return err
}

func (s *Store) Migrate(ctx context.Context) error {
	ms, err := store.LoadMigrations(migrationFS, "migrations")
	if err != nil {
		return err
	}
	// One transaction for all pending migrations: PostgreSQL DDL is transactional, and
	// the advisory lock makes instances that start together wait for the first.
	return s.Transact(ctx, func(q store.Queries) error {
		db := q.(queries).db
		if _, err := db.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrationLock)); err != nil {
			return fmt.Errorf("lock migrations: %w", err)
		}
		if _, err := db.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
			version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return fmt.Errorf("create schema_migrations: %w", err)
		}
		var current int
		if err := db.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM schema_migrations`).Scan(&current); err != nil {
			return fmt.Errorf("read schema version: %w", err)
		}
		for _, m := range ms[min(current, len(ms)):] {
			if _, err := db.Exec(ctx, m.SQL); err != nil {
				return fmt.Errorf("migration %s: %w", m.Name, err)
			}
			if _, err := db.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
				return fmt.Errorf("record migration %s: %w", m.Name, err)
			}
		}
		return nil
	})
}

func (s *Store) SchemaCurrent(ctx context.Context) error {
	ms, err := store.LoadMigrations(migrationFS, "migrations")
	if err != nil {
		return err
	}
	var current int
	err = s.pool.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM schema_migrations`).Scan(&current)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		current, err = 0, nil
	}
	if err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if current < len(ms) {
		return fmt.Errorf("%w: at version %d, this binary needs %d (run `airlock migrate`)", store.ErrSchemaOutdated, current, len(ms))
	}
	return nil
}

// dbtx is what pgxpool.Pool and pgx.Tx share.
type dbtx interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

type queries struct{ db dbtx }

const runColumns = `idempotency_key, state, payload_hash, lease_owner, lease_started_at,
	lease_expires_at, version, result, duplicates, reclaims, trigger_source, workflow_version,
	created_at, updated_at, action_type, repairs, validations, model_calls, tokens, park_reason,
	replaced_by`

// scanRun scans runColumns, then into extra the columns that follow them.
func scanRun(row pgx.Row, extra ...any) (store.Run, error) {
	var r store.Run
	var state string
	var result []byte
	err := row.Scan(append([]any{&r.Key, &state, &r.PayloadHash, &r.LeaseOwner, &r.LeaseStartedAt,
		&r.LeaseExpiresAt, &r.Version, &result, &r.Duplicates, &r.Reclaims, &r.TriggerSource,
		&r.WorkflowVersion, &r.CreatedAt, &r.UpdatedAt, &r.ActionType, &r.Repairs, &r.Validations,
		&r.ModelCalls, &r.Tokens, &r.ParkReason, &r.ReplacedBy}, extra...)...)
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

// The claim statement is seed 000's, with the lease start recorded (to cap total lease
// life), a reclaim counter, and a NULL lease treated as lapsed.
const claimSQL = `
INSERT INTO workflow_runs AS r (idempotency_key, state, payload_hash, lease_owner,
  lease_started_at, lease_expires_at, version, trigger_source, workflow_version,
  created_at, updated_at)
VALUES ($1, 'processing', $2, $3, coalesce($4::timestamptz, now()),
  coalesce($4::timestamptz, now()) + $5::bigint * interval '1 microsecond', 1, $6, $7,
  coalesce($4::timestamptz, now()), coalesce($4::timestamptz, now()))
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

// claimRecordSQL is the whole claim in one statement: the claim statement; when it takes
// nothing, the duplicate count on the existing row; the replacement a new run continues;
// and the events store.ClaimSequence writes, with the same details. Its data-modifying
// CTEs share one snapshot: a row another transaction inserted after it was taken is seen
// by the claim's ON CONFLICT but not by the UPDATE, and then the statement returns no
// row and changes nothing (Claim falls back to the transaction).
//
// $1 key, $2 payload hash, $3 owner, $4 now (NULL: the database clock), $5 lease (µs),
// $6 trigger source, $7 workflow version, $8 actor, $9 meta, $10 alert threshold.
const claimRecordSQL = `
WITH claimed AS (` + claimSQL + `
), refused AS (
  UPDATE workflow_runs
  SET duplicates = duplicates + CASE WHEN payload_hash = $2::text THEN 1 ELSE 0 END
  WHERE idempotency_key = $1 AND NOT EXISTS (SELECT FROM claimed)
  RETURNING ` + runColumns + `
), replaced AS (
  SELECT p.old_key, p.provider_ids
  FROM replacements p JOIN claimed c ON p.new_key = c.idempotency_key
  WHERE c.reclaims = 0
), recorded AS (
  INSERT INTO events (run_key, at, kind, version, actor, meta, detail)
  SELECT $1, coalesce($4::timestamptz, now()), e.kind, e.version, e.actor, e.meta, e.detail
  FROM (
    SELECT 1 AS ord, CASE WHEN c.reclaims > 0 THEN 'lease_reclaimed' ELSE 'claimed' END AS kind,
      c.version, $8::text AS actor, $9::jsonb AS meta,
      jsonb_build_object('payload_hash', c.payload_hash, 'lease_expires_at',
          (to_jsonb(c.lease_expires_at AT TIME ZONE 'UTC') #>> '{}') || 'Z')
        || CASE WHEN c.reclaims > 0 THEN jsonb_build_object('reclaims', c.reclaims) ELSE '{}'::jsonb END
        || coalesce((SELECT jsonb_build_object('replaces', old_key, 'provider_ids', provider_ids) FROM replaced), '{}'::jsonb) AS detail
    FROM claimed c
    UNION ALL
    SELECT 2, 'alert', c.version, 'airlock', NULL,
      jsonb_build_object('alert', 'lease_reclaims', 'reclaims', c.reclaims, 'threshold', $10::bigint)
    FROM claimed c WHERE c.reclaims > 0 AND c.reclaims > $10::bigint
    UNION ALL
    SELECT 1, CASE WHEN f.payload_hash = $2::text THEN 'duplicate' ELSE 'payload_mismatch' END, 0, $8::text, $9::jsonb,
      CASE WHEN f.payload_hash = $2::text
        THEN jsonb_build_object('state', f.state, 'duplicates', f.duplicates)
        ELSE jsonb_build_object('payload_hash', $2::text, 'stored_payload_hash', f.payload_hash) END
    FROM refused f
  ) e
  ORDER BY e.ord
)
SELECT ` + runColumns + `, true FROM claimed
UNION ALL
SELECT ` + runColumns + `, false FROM refused`

// Claim is the whole claim in one statement in autocommit: one round trip.
func (s *Store) Claim(ctx context.Context, p store.ClaimParams) (store.ClaimOutcome, error) {
	var claimed bool
	run, err := scanRun(s.db.QueryRow(ctx, claimRecordSQL, p.Key, p.PayloadHash, p.Owner, p.Now,
		micros(p.Lease), p.TriggerSource, p.WorkflowVersion, p.Actor, jsonArg(p.Meta), p.AlertAfter), &claimed)
	if errors.Is(err, store.ErrNotFound) {
		// The key was inserted by another transaction after this statement's snapshot:
		// the same claim as a transaction of statements, each with a fresh snapshot.
		var out store.ClaimOutcome
		err = s.Transact(ctx, func(q store.Queries) error {
			out, err = store.ClaimSequence(ctx, q, p)
			return err
		})
		return out, err
	}
	if err != nil {
		return store.ClaimOutcome{}, fmt.Errorf("claim: %w", err)
	}
	out := store.ClaimOutcome{Run: run, Claimed: claimed, Mismatch: !claimed && run.PayloadHash != p.PayloadHash}
	out.Alerted = out.Reclaimed() && run.Reclaims > p.AlertAfter
	return out, nil
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
		      coalesce($4::timestamptz, now()) + $5::bigint * interval '1 microsecond',
		      lease_started_at + $6::bigint * interval '1 microsecond')
		WHERE idempotency_key = $1 AND lease_owner = $2 AND version = $3
		  AND state = 'processing'
		  AND lease_expires_at > coalesce($4::timestamptz, now())
		  AND lease_expires_at < lease_started_at + $6::bigint * interval '1 microsecond'
		RETURNING `+runColumns, p.Key, p.Owner, p.Version, p.Now, micros(p.Lease), micros(p.Lifetime))))
}

func (q queries) RunTransition(ctx context.Context, p store.RunTransitionParams) (store.Run, error) {
	return noMatch(scanRun(q.db.QueryRow(ctx, `
		UPDATE workflow_runs
		SET state = $5, version = version + 1, result = coalesce($6::jsonb, result),
		    lease_expires_at = NULL, updated_at = coalesce($7::timestamptz, now()), park_reason = $8
		WHERE idempotency_key = $1 AND lease_owner = $2 AND version = $3 AND state = $4
		  AND lease_expires_at > coalesce($7::timestamptz, now())
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
	err := q.db.QueryRow(ctx, `
		INSERT INTO events (run_key, at, kind, version, actor, meta, detail)
		VALUES ($1, coalesce($2::timestamptz, now()), $3, $4, $5, $6::jsonb, $7::jsonb)
		RETURNING id, at`, p.RunKey, p.Now, p.Kind, p.Version, p.Actor, jsonArg(p.Meta), jsonArg(p.Detail)).Scan(&e.ID, &e.At)
	if err != nil {
		return store.Event{}, fmt.Errorf("insert event: %w", err)
	}
	return e, nil
}

func (q queries) EventList(ctx context.Context, key string, afterID int64, limit int) ([]store.Event, error) {
	rows, err := q.db.Query(ctx, `
		SELECT `+eventColumns+` FROM events
		WHERE run_key = $1 AND id > $2 ORDER BY id LIMIT $3`, key, afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	return pgx.CollectRows(rows, scanEvent)
}

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
	_, err := q.db.Exec(ctx, `INSERT INTO api_keys (id, name, key_hash, scopes, created_at) VALUES ($1, $2, $3, $4, $5)`,
		k.ID, k.Name, k.Hash, strings.Join(k.Scopes, ","), k.CreatedAt)
	if err != nil {
		return fmt.Errorf("insert api key: %w", err)
	}
	return nil
}

const apiKeyColumns = `id, name, key_hash, scopes, created_at, revoked_at`

func scanAPIKey(row pgx.Row) (store.APIKey, error) {
	var k store.APIKey
	var scopes string
	if err := row.Scan(&k.ID, &k.Name, &k.Hash, &scopes, &k.CreatedAt, &k.RevokedAt); err != nil {
		return store.APIKey{}, interpret(err)
	}
	k.Scopes = strings.Split(scopes, ",")
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
