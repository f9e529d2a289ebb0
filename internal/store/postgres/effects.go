package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/airlockhq/airlock/internal/store"
)

func (q queries) RunLock(ctx context.Context, p store.RunLockParams) (store.Run, error) {
	return noMatch(scanRun(q.db.QueryRow(ctx, `
		SELECT `+runColumns+` FROM workflow_runs
		WHERE idempotency_key = $1 AND lease_owner = $2 AND version = $3 AND state = 'processing'
		  AND lease_expires_at > airlock_now($4::timestamptz)
		FOR UPDATE`, p.Key, p.Owner, p.Version, p.Now)))
}

const effectColumns = `id, idempotency_key, effect_id, action_type, target, executor, payload,
	payload_hash, state, lease_owner, lease_expires_at, send_started_at, provider_id, attempts, not_before,
	last_error_class, created_at, updated_at, next_check_at, checks, version, ambiguous_at, none_confirmed_at, trace_parent`

func scanEffect(row pgx.Row) (store.Effect, error) {
	var e store.Effect
	var state string
	var payload []byte
	err := row.Scan(&e.ID, &e.RunKey, &e.EffectID, &e.ActionType, &e.Target, &e.Executor, &payload,
		&e.PayloadHash, &state, &e.LeaseOwner, &e.LeaseExpiresAt, &e.SendStartedAt, &e.ProviderID, &e.Attempts,
		&e.NotBefore, &e.LastErrorClass, &e.CreatedAt, &e.UpdatedAt, &e.NextCheckAt, &e.Checks, &e.Version, &e.AmbiguousAt, &e.NoneConfirmedAt, &e.TraceParent)
	if err != nil {
		return store.Effect{}, interpret(err)
	}
	e.State, e.Payload = store.EffectState(state), rawOrNil(payload)
	return e, nil
}

func collectEffects(rows pgx.Rows, err error) ([]store.Effect, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Effect, error) { return scanEffect(row) })
}

func (q queries) EffectInsert(ctx context.Context, e store.Effect) (store.Effect, bool, error) {
	got, err := scanEffect(q.db.QueryRow(ctx, `
		INSERT INTO effects (id, idempotency_key, effect_id, action_type, target, executor, payload,
		  payload_hash, state, not_before, created_at, updated_at, trace_parent)
		VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9, airlock_now($10::timestamptz),
		  airlock_now($11::timestamptz), airlock_now($11::timestamptz), $12)
		ON CONFLICT (idempotency_key, effect_id) DO NOTHING
		RETURNING `+effectColumns, e.ID, e.RunKey, e.EffectID, e.ActionType, e.Target, e.Executor,
		jsonArg(e.Payload), e.PayloadHash, string(e.State), timeArg(e.NotBefore), timeArg(e.CreatedAt), e.TraceParent))
	if err == nil {
		return got, true, nil
	}
	if !errors.Is(err, store.ErrNotFound) {
		return store.Effect{}, false, fmt.Errorf("insert effect: %w", err)
	}
	got, err = scanEffect(q.db.QueryRow(ctx, `SELECT `+effectColumns+` FROM effects
		WHERE idempotency_key = $1 AND effect_id = $2`, e.RunKey, e.EffectID))
	if err != nil {
		return store.Effect{}, false, fmt.Errorf("read existing effect: %w", err)
	}
	return got, false, nil
}

// timeArg passes the zero time as NULL so the database clock fills it in.
func timeArg(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func (q queries) EffectGet(ctx context.Context, id string) (store.Effect, error) {
	return scanEffect(q.db.QueryRow(ctx, `SELECT `+effectColumns+` FROM effects WHERE id = $1`, id))
}

// limitArg is LIMIT's argument: NULL (no limit) for 0.
func limitArg(n int) any {
	if n <= 0 {
		return nil
	}
	return n
}

func (q queries) EffectList(ctx context.Context, p store.EffectListParams) ([]store.Effect, error) {
	states := make([]string, len(p.States))
	for i, s := range p.States {
		states[i] = string(s)
	}
	return collectEffects(q.db.Query(ctx, `SELECT `+effectColumns+` FROM effects
		WHERE ($1 = '' OR idempotency_key = $1) AND (cardinality($2::text[]) = 0 OR state = ANY($2))
		ORDER BY created_at, id LIMIT $3`, p.RunKey, states, limitArg(p.Limit)))
}

func (q queries) EffectLease(ctx context.Context, p store.EffectLeaseParams) ([]store.Effect, error) {
	sql, args, ok := q.leaseStatement(p, nil)
	if !ok {
		return nil, nil
	}
	if q.citus {
		return q.effectLeaseCitus(ctx, p, args[1].([]string), args[6].([]int32))
	}
	return collectEffects(q.db.Query(ctx, sql, args...))
}

// leaseStatement is the lease's statement and its arguments; ok is false when there is
// nothing to lease. The effects of the types of begin that the kill switch allows and
// whose run is not failed_terminal are marked begun by the same statement (the
// begin-mark's conditions, markStartedSQL's and killSwitchAllowsSQL's): only under the
// kill switch's shared guard (LeaseEffects).
func (q queries) leaseStatement(p store.EffectLeaseParams, begin []string) (string, []any, bool) {
	types, caps := make([]string, 0, len(p.Caps)), make([]int32, 0, len(p.Caps))
	for t, n := range p.Caps {
		if n > 0 {
			types, caps = append(types, t), append(caps, int32(n))
		}
	}
	if len(types) == 0 || p.Limit < 1 {
		return "", nil, false
	}
	// Each type up to its own cap (one LATERAL probe of the due index per type), then the
	// oldest of those up to the limit. Rows locked but not taken stay pending.
	sql := effectLeaseSQL.get(func() string {
		return `
			WITH due AS (
			  SELECT d.id FROM unnest($2::text[], $7::int[]) AS t(action_type, cap)
			  CROSS JOIN LATERAL (
			    SELECT id, not_before FROM effects
			    WHERE state = 'pending' AND executor = $1 AND action_type = t.action_type
			      AND not_before <= airlock_now($6::timestamptz)
			    ORDER BY not_before
			    LIMIT t.cap
			    FOR UPDATE SKIP LOCKED
			  ) d
			  ORDER BY d.not_before
			  LIMIT $5
			)
			UPDATE effects e
			SET state = 'sending', lease_owner = $3, attempts = e.attempts + 1, version = e.version + 1,
			    lease_expires_at = airlock_now($6::timestamptz) + $4::bigint * interval '1 microsecond',
			    updated_at = airlock_now($6::timestamptz),
			    send_started_at = CASE WHEN e.action_type = ANY($8::text[])` + killSwitchAllowsSQL + `
			      AND NOT EXISTS (SELECT 1 FROM workflow_runs r
			                      WHERE r.idempotency_key = e.idempotency_key AND r.state = 'failed_terminal')
			      THEN airlock_now($6::timestamptz) END
			FROM due WHERE e.id = due.id
			RETURNING ` + prefixed("e.", effectColumns)
	})
	if begin == nil {
		begin = []string{}
	}
	return sql, []any{p.Executor, types, p.Owner, micros(p.Lease), p.Limit, p.Now, caps, begin}, true
}

// effectLeaseSQL is the lease statement, built once: its column list is prefixed at the
// first lease, not at each.
var effectLeaseSQL onceString

// LeaseEffects runs the lease's one statement in autocommit (or in the transaction ctx
// joins): a BEGIN and a COMMIT fewer per batch. When p.Begin names types, the kill
// switch's shared guard is taken first, pipelined with the statement in one implicit
// transaction (as BeginSends), so the statement's snapshot, taken after the guard is
// held, sees a kill switch change that committed first. Citus marks none (its lease is
// two steps; the dispatcher begins those effects with BeginSends).
func (s *Store) LeaseEffects(ctx context.Context, p store.EffectLeaseParams) ([]store.Effect, error) {
	if len(p.Begin) == 0 || s.citus {
		return s.EffectLease(ctx, p)
	}
	sql, args, ok := s.leaseStatement(p, p.Begin)
	if !ok {
		return nil, nil
	}
	b := &pgx.Batch{}
	b.Queue(`SELECT pg_advisory_xact_lock_shared($1)`, int64(killSwitchLock))
	b.Queue(sql, args...)
	var br pgx.BatchResults
	if tx := s.bound(ctx); tx != nil {
		br = tx.SendBatch(ctx, b)
	} else {
		br = s.pool.SendBatch(ctx, b)
	}
	leased, err := func() ([]store.Effect, error) {
		if _, err := br.Exec(); err != nil {
			return nil, err
		}
		return collectEffects(br.Query())
	}()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("lease effects: %w", valueError(classify(err)))
	}
	return leased, nil
}

// EffectMarkStarted leaves updated_at as the lease set it: no index names the columns it
// changes, so the update is HOT (0022_effects_hot.sql) — one row version on the same
// page, no index entry.
func (q queries) EffectMarkStarted(ctx context.Context, owner string, ids []string, now *time.Time) ([]string, error) {
	rows, err := q.db.Query(ctx, markStartedSQL+` RETURNING e.id`, ids, owner, now)
	if err != nil {
		return nil, fmt.Errorf("mark sends begun: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// markStartedSQL is the begin-mark's compare-and-set ($1 ids, $2 owner, $3 now).
const markStartedSQL = `
		UPDATE effects e SET send_started_at = airlock_now($3::timestamptz), version = e.version + 1
		WHERE e.id = ANY($1) AND e.state = 'sending' AND e.lease_owner = $2 AND e.send_started_at IS NULL
		  AND e.lease_expires_at > airlock_now($3::timestamptz)
		  AND NOT EXISTS (SELECT 1 FROM workflow_runs r
		                  WHERE r.idempotency_key = e.idempotency_key AND r.state = 'failed_terminal')`

// killSwitchAllowsSQL is the kill switch's default-deny read as a condition on effects e:
// an enabled global row and no disabled row for e's action type (effects.Service.enabled
// spells the same rule for the transactions that read the rows themselves).
const killSwitchAllowsSQL = `
		  AND EXISTS (SELECT 1 FROM kill_switch k WHERE k.scope = 'global' AND k.enabled)
		  AND NOT EXISTS (SELECT 1 FROM kill_switch k WHERE k.scope = 'action:' || e.action_type AND NOT k.enabled)`

// BeginSends pipelines the kill switch's shared guard and the mark in one round trip:
// statements sent together before one Sync run in one implicit transaction (committed at
// the Sync), and under READ COMMITTED the mark's snapshot is taken after the guard is held,
// so a kill switch change that committed first is seen and one that commits later waits.
func (s *Store) BeginSends(ctx context.Context, owner string, ids []string, now *time.Time) ([]string, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	b := &pgx.Batch{}
	b.Queue(`SELECT pg_advisory_xact_lock_shared($1)`, int64(killSwitchLock))
	b.Queue(markStartedSQL+killSwitchAllowsSQL+` RETURNING e.id`, ids, owner, now)
	var br pgx.BatchResults
	if tx := s.bound(ctx); tx != nil {
		br = tx.SendBatch(ctx, b)
	} else {
		br = s.pool.SendBatch(ctx, b)
	}
	marked, err := func() ([]string, error) {
		if _, err := br.Exec(); err != nil {
			return nil, err
		}
		rows, err := br.Query()
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, pgx.RowTo[string])
	}()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("mark sends begun: %w", valueError(classify(err)))
	}
	return marked, nil
}

func (q queries) EffectClaimUnknown(ctx context.Context, types []string, now *time.Time, claim time.Duration, limit int) ([]store.Effect, error) {
	if q.citus {
		return q.effectClaimCitus(ctx, `SELECT id, idempotency_key, action_type FROM effects
			WHERE state = 'unknown' AND executor = 'dispatcher' AND action_type = ANY($1)
			  AND (next_check_at IS NULL OR next_check_at <= airlock_now($2::timestamptz))
			ORDER BY next_check_at NULLS FIRST, updated_at LIMIT $3`,
			`state = 'unknown' AND (next_check_at IS NULL OR next_check_at <= airlock_now($2::timestamptz))`,
			types, now, claim, limit)
	}
	// SKIP LOCKED: an instance claiming at the same moment takes the next ones instead.
	return collectEffects(q.db.Query(ctx, `
		WITH due AS (
		  SELECT id FROM effects
		  WHERE state = 'unknown' AND executor = 'dispatcher' AND action_type = ANY($1)
		    AND (next_check_at IS NULL OR next_check_at <= airlock_now($2::timestamptz))
		  ORDER BY next_check_at NULLS FIRST, updated_at LIMIT $3
		  FOR UPDATE SKIP LOCKED
		)
		UPDATE effects e SET next_check_at = airlock_now($2::timestamptz) + $4::bigint * interval '1 microsecond',
		  version = e.version + 1
		FROM due WHERE e.id = due.id
		RETURNING `+prefixed("e.", effectColumns), types, now, limit, micros(claim)))
}

func (q queries) EffectClaimRecheck(ctx context.Context, types []string, now *time.Time, claim time.Duration, limit int) ([]store.Effect, error) {
	if q.citus {
		return q.effectClaimCitus(ctx, `SELECT id, idempotency_key, action_type FROM effects
			WHERE state = 'completed' AND next_check_at IS NOT NULL AND next_check_at <= airlock_now($2::timestamptz)
			  AND executor = 'dispatcher' AND action_type = ANY($1)
			ORDER BY next_check_at LIMIT $3`,
			`state = 'completed' AND next_check_at IS NOT NULL AND next_check_at <= airlock_now($2::timestamptz)`,
			types, now, claim, limit)
	}
	return collectEffects(q.db.Query(ctx, `
		WITH due AS (
		  SELECT id FROM effects
		  WHERE state = 'completed' AND next_check_at IS NOT NULL AND next_check_at <= airlock_now($2::timestamptz)
		    AND executor = 'dispatcher' AND action_type = ANY($1)
		  ORDER BY next_check_at LIMIT $3
		  FOR UPDATE SKIP LOCKED
		)
		UPDATE effects e SET next_check_at = airlock_now($2::timestamptz) + $4::bigint * interval '1 microsecond',
		  version = e.version + 1
		FROM due WHERE e.id = due.id
		RETURNING `+prefixed("e.", effectColumns), types, now, limit, micros(claim)))
}

func (q queries) EffectRecheckDone(ctx context.Context, id string, version int64) error {
	tag, err := q.db.Exec(ctx, `UPDATE effects SET next_check_at = NULL, version = version + 1
		WHERE id = $1 AND version = $2 AND state = 'completed'`, id, version)
	if err == nil && tag.RowsAffected() == 0 {
		return store.ErrNoMatch
	}
	return err
}

func (q queries) EffectCheckLater(ctx context.Context, id string, version int64, at time.Time) error {
	tag, err := q.db.Exec(ctx, `UPDATE effects SET next_check_at = $3, checks = checks + 1, version = version + 1
		WHERE id = $1 AND version = $2 AND state IN ('unknown', 'completed')`, id, version, at)
	if err == nil && tag.RowsAffected() == 0 {
		return store.ErrNoMatch
	}
	return err
}

func (q queries) EffectCancelPending(ctx context.Context, key, class string, now *time.Time) ([]store.Effect, error) {
	return collectEffects(q.db.Query(ctx, `UPDATE effects SET state = 'cancelled', last_error_class = $2,
		  updated_at = airlock_now($3::timestamptz), version = version + 1
		WHERE idempotency_key = $1 AND state = 'pending'
		RETURNING `+effectColumns, key, class, now))
}

func (q queries) EffectNotify(ctx context.Context) error {
	_, err := q.db.Exec(ctx, `SELECT pg_notify('`+notifyChannel+`', '')`)
	return err
}

// notifyChannel carries "an effect was queued" between instances.
const notifyChannel = "airlock_effects"

// killSwitchLock is the advisory lock key that orders kill switch changes against marks.
const killSwitchLock = 0x6169726b696c6c // "airkill"

func (q queries) KillSwitchGuard(ctx context.Context, exclusive bool) error {
	fn := "pg_advisory_xact_lock_shared"
	if exclusive {
		fn = "pg_advisory_xact_lock"
	}
	_, err := q.db.Exec(ctx, `SELECT `+fn+`($1)`, int64(killSwitchLock))
	return err
}

func (q queries) RunLockKeys(ctx context.Context, keys []string) (map[string]store.Run, error) {
	if q.citus {
		return q.runLockKeysCitus(ctx, keys)
	}
	rows, err := q.db.Query(ctx, `SELECT `+runColumns+` FROM workflow_runs
		WHERE idempotency_key = ANY($1) ORDER BY idempotency_key FOR UPDATE`, keys)
	if err != nil {
		return nil, fmt.Errorf("lock runs: %w", err)
	}
	runs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Run, error) { return scanRun(row) })
	if err != nil {
		return nil, fmt.Errorf("lock runs: %w", err)
	}
	out := make(map[string]store.Run, len(runs))
	for _, r := range runs {
		out[r.Key] = r
	}
	return out, nil
}

// ListenEffects holds one connection in LISTEN and calls wake for each notification,
// reconnecting with backoff until ctx ends. The connection is its own, never one of the
// pool's: a pool whose connections are all busy (writers waiting for a synchronous
// standby after a failover, a burst of load) must not keep the LISTEN from coming back,
// and the LISTEN must not take a slot from the writers.
func (s *Store) ListenEffects(ctx context.Context, wake func()) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		established, _ := s.listen(ctx, wake)
		if ctx.Err() != nil {
			return
		}
		if established {
			backoff = 100 * time.Millisecond // it was up: the next outage starts from the shortest wait
		}
		wake() // notifications may have been missed while disconnected
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		// At most a second between attempts: after a failover the LISTEN is back within
		// about a second of the promotion (each attempt is one connect: cheap).
		backoff = min(2*backoff, time.Second)
	}
}

// ListenState reports whether a LISTEN connection is up now and how many notifications
// this store's listeners have received (the metrics airlock_effects_listening and
// airlock_effects_notifications_total).
func (s *Store) ListenState() (listening bool, notifications uint64) {
	return s.listening.Load(), s.notifications.Load()
}

// listen opens a connection of its own — to the listen URL when one is set (past a
// transaction pooler, where a pooled connection has no session to hold the LISTEN), else
// with the pool's settings (a multi-host URL's target_session_attrs included, so it finds
// the primary) — and waits for notifications on it until an error, closing it on return.
// established reports whether the LISTEN was in place.
func (s *Store) listen(ctx context.Context, wake func()) (established bool, err error) {
	var conn *pgx.Conn
	if s.listenURL != "" {
		conn, err = pgx.Connect(ctx, s.listenURL)
	} else {
		conn, err = pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
	}
	if err != nil {
		return false, classify(err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, `LISTEN `+notifyChannel); err != nil {
		return false, err
	}
	s.listening.Store(true)
	defer s.listening.Store(false)
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return true, err
		}
		s.notifications.Add(1)
		wake()
	}
}

func (q queries) EffectUpdate(ctx context.Context, p store.EffectUpdateParams) (store.Effect, error) {
	if err := p.CheckFenced(); err != nil {
		return store.Effect{}, err
	}
	from := make([]string, len(p.From))
	for i, s := range p.From {
		from[i] = string(s)
	}
	// The clock is read once, in FROM: Citus refuses a function that is not IMMUTABLE
	// inside the CASEs (it would have to be evaluated per row on the workers).
	e, err := scanEffect(q.db.QueryRow(ctx, `
		UPDATE effects
		SET state = $3,
		    provider_id = coalesce($5, provider_id),
		    not_before = coalesce($6, not_before),
		    last_error_class = coalesce($7, last_error_class),
		    payload = coalesce($13::jsonb, payload),
		    attempts = attempts - CASE WHEN $8 THEN 1 ELSE 0 END,
		    lease_owner = CASE WHEN $3 = 'sending' THEN lease_owner ELSE '' END,
		    lease_expires_at = CASE WHEN $3 = 'sending' THEN lease_expires_at ELSE NULL END,
		    send_started_at = CASE WHEN $3 <> 'sending' THEN NULL
		                           WHEN $10 THEN n.t ELSE send_started_at END,
		    next_check_at = CASE WHEN $3 = 'unknown' AND state = 'unknown' THEN next_check_at
		                         WHEN $3 = 'completed' AND $20::bigint > 0
		                           THEN airlock_add_us(n.t, $20::bigint) END,
		    none_confirmed_at = CASE WHEN $19 THEN n.t ELSE none_confirmed_at END,
		    checks = CASE WHEN $3 = 'unknown' AND state = 'unknown' THEN checks ELSE 0 END,
		    ambiguous_at = CASE WHEN $17 THEN coalesce(send_started_at, n.t)
		                        WHEN $18 THEN NULL ELSE ambiguous_at END,
		    updated_at = n.t,
		    version = version + 1
		FROM (SELECT airlock_now($9::timestamptz) AS t) n
		WHERE id = $1 AND state = ANY($2) AND ($4 = '' OR lease_owner = $4) AND ($16 = 0 OR version = $16)
		  AND (NOT $11 OR lease_expires_at <= n.t)
		  AND (NOT $12 OR send_started_at IS NULL)
		  AND ($14 = 0 OR attempts = $14) AND ($15 = '' OR last_error_class = $15)
		RETURNING `+effectColumns, p.ID, from, string(p.To), p.Owner, p.ProviderID, p.NotBefore,
		p.ErrorClass, p.ReleaseAttempt, p.Now, p.Started, p.LeaseExpired, p.NotStarted, jsonArg(p.Payload),
		p.Attempts, p.FromErrorClass, p.Version, p.Ambiguous, p.Unambiguous, p.NoneConfirmed, p.RecheckAfter.Microseconds()))
	if errors.Is(err, store.ErrNotFound) {
		return store.Effect{}, store.ErrNoMatch
	}
	return e, err
}

func (q queries) EffectExpiredLeases(ctx context.Context, now *time.Time, limit int) ([]store.Effect, error) {
	return collectEffects(q.db.Query(ctx, `SELECT `+effectColumns+` FROM effects
		WHERE state = 'sending' AND lease_expires_at <= airlock_now($1::timestamptz)
		ORDER BY lease_expires_at LIMIT $2`, now, limit))
}

// compactEffectCountsSQL folds the deltas into effect_counts in one transaction, under a
// lock that one compaction at a time can take (the others skip it: the read is exact
// either way). The lock's second key is this schema's delta table.
const compactEffectCountsSQL = `
WITH lk AS (SELECT pg_try_advisory_xact_lock(hashtext('airlock.effect_counts'), 'effect_count_deltas'::regclass::oid::int) AS ok),
d AS (DELETE FROM effect_count_deltas WHERE (SELECT ok FROM lk) RETURNING state, n)
INSERT INTO effect_counts AS c (state, n)
SELECT state, sum(n) FROM d WHERE state IN ` + countedStates + ` GROUP BY state ORDER BY state
ON CONFLICT (state) DO UPDATE SET n = c.n + EXCLUDED.n`

// countedStates are the states the effects triggers count (0038_counts_of_settled.sql):
// those an effect can stay in for good. The others are counted from their partial
// indexes (effectCountSQL).
const countedStates = `('completed', 'failed', 'cancelled', 'planned')`

// effectCountSQL counts effects per state in one snapshot: the settled states from the
// counters (the compacted totals plus the deltas not yet folded in), each open state from
// the partial index that holds exactly its rows (an index-only count: its cost follows
// the open effects, never the history).
const effectCountSQL = `
SELECT state, sum(n)::bigint FROM (
  SELECT state, n FROM effect_counts WHERE state IN ` + countedStates + `
  UNION ALL SELECT state, n FROM effect_count_deltas WHERE state IN ` + countedStates + `) x
GROUP BY state HAVING sum(n) <> 0
UNION ALL SELECT 'pending', count(*) FROM effects WHERE state = 'pending' HAVING count(*) > 0
UNION ALL SELECT 'sending', count(*) FROM effects WHERE state = 'sending' HAVING count(*) > 0
UNION ALL SELECT 'unknown', count(*) FROM effects WHERE state = 'unknown' HAVING count(*) > 0`

// compactEffectCounts is run at each count (a scrape) and at each purge, so the deltas
// a read adds up are those of a scrape interval, whatever the table's size.
func (q queries) compactEffectCounts(ctx context.Context) error {
	if _, err := q.db.Exec(ctx, compactEffectCountsSQL); err != nil {
		return fmt.Errorf("compact effect counts: %w", err)
	}
	return nil
}

// EffectCountByState counts effects per state (effectCountSQL), after a compaction.
func (q queries) EffectCountByState(ctx context.Context) (map[store.EffectState]int, error) {
	if err := q.compactEffectCounts(ctx); err != nil {
		return nil, err
	}
	rows, err := q.db.Query(ctx, effectCountSQL)
	if err != nil {
		return nil, fmt.Errorf("count effects: %w", err)
	}
	out := map[store.EffectState]int{}
	var state string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&state, &n}, func() error {
		out[store.EffectState(state)] = n
		return nil
	})
	return out, err
}

func (q queries) KillSwitchList(ctx context.Context) ([]store.KillSwitch, error) {
	rows, err := q.db.Query(ctx, `SELECT scope, enabled, reason, actor, updated_at FROM kill_switch ORDER BY scope`)
	if err != nil {
		return nil, fmt.Errorf("read kill switch: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.KillSwitch, error) {
		var k store.KillSwitch
		err := row.Scan(&k.Scope, &k.Enabled, &k.Reason, &k.Actor, &k.UpdatedAt)
		return k, err
	})
}

func (q queries) KillSwitchSet(ctx context.Context, k store.KillSwitch) error {
	_, err := q.db.Exec(ctx, `
		INSERT INTO kill_switch (scope, enabled, reason, actor, updated_at)
		VALUES ($1, $2, $3, $4, airlock_now($5::timestamptz))
		ON CONFLICT (scope) DO UPDATE SET enabled = EXCLUDED.enabled, reason = EXCLUDED.reason,
		  actor = EXCLUDED.actor, updated_at = EXCLUDED.updated_at`,
		k.Scope, k.Enabled, k.Reason, k.Actor, timeArg(k.UpdatedAt))
	if err != nil {
		return fmt.Errorf("set kill switch: %w", err)
	}
	return nil
}

// onceString is a string computed once, by the first get.
type onceString struct {
	once sync.Once
	s    string
}

func (o *onceString) get(f func() string) string {
	o.once.Do(func() { o.s = f() })
	return o.s
}

// prefixed qualifies a column list with a table alias.
func prefixed(alias, cols string) string {
	parts := strings.Split(cols, ",")
	for i, c := range parts {
		parts[i] = alias + strings.TrimSpace(c)
	}
	return strings.Join(parts, ", ")
}

// EffectUpdateMany is EffectUpdate for a group of outcomes in one statement (the
// store.BatchQueries contract): the same compare-and-set (sending under the owner's
// lease), the same columns set as EffectUpdate sets them for a move out of sending, and
// the events of the updates that applied inserted by the same statement, in order (the
// rows reach the insert sorted by their position, so their ids follow it).
func (q queries) EffectUpdateMany(ctx context.Context, ps []store.EffectUpdateParams, events [][]store.EventInsertParams) ([]bool, error) {
	_, applied, err := q.effectUpdateMany(ctx, ps, events, false)
	return applied, err
}

// EffectUpdateManyLocked is EffectUpdateMany that locks the runs first, in the same
// statement: an InitPlan locks, in key order and before any effect row is touched, the
// runs of the updates that are not approved (FOR UPDATE re-reads a run that changes
// meanwhile and drops it if it became approved), and only those runs' updates apply.
// Holding the runs, it links their events itself, from the heads it locked, and moves
// each run's head once (0039): the events_chain trigger does nothing for them.
//
// On Citus it locks nothing and applies nothing (the caller then records the group in a
// transaction that locks the runs one by one, RunLockKeys): the lock is a FOR UPDATE over
// the runs of several shards in one statement, which Citus refuses.
func (q queries) EffectUpdateManyLocked(ctx context.Context, ps []store.EffectUpdateParams, events [][]store.EventInsertParams) ([]string, []bool, error) {
	if q.citus {
		return nil, make([]bool, len(ps)), nil
	}
	return q.effectUpdateMany(ctx, ps, events, true)
}

// The outcome statement without and with the run locks. It returns the position (from 1)
// of each update that applied — no effect row: nothing the caller does not already know
// is read back, decoded and sent —, and with the locks one more row (position 0) with
// the keys it locked.
var (
	effectUpdateManySQL       = effectUpdateManyStatement(false)
	effectUpdateManyLockedSQL = effectUpdateManyStatement(true)
)

func effectUpdateManyStatement(lock bool) string {
	// From sending, as EffectUpdate leaves a row it moves out of sending: no lease, not
	// begun, due for reconciliation at once if unknown (next_check_at NULL, checks 0).
	set := `
		  UPDATE effects e
		  SET state = u.state,
		      provider_id = coalesce(u.provider_id, e.provider_id),
		      not_before = coalesce(u.not_before, e.not_before),
		      last_error_class = coalesce(u.class, e.last_error_class),
		      lease_owner = '', lease_expires_at = NULL, send_started_at = NULL,
		      next_check_at = NULL, checks = 0,
		      updated_at = airlock_now($7::timestamptz),
		      version = e.version + 1
		  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::timestamptz[], $6::text[])
		       WITH ORDINALITY AS u(id, owner, state, provider_id, not_before, class, i)
		  WHERE e.id = u.id AND e.state = 'sending' AND e.lease_owner = u.owner`
	events := `unnest($8::text[], $9::text[], $10::timestamptz[], $11::text[], $12::bigint[], $13::text[], $14::text[], $15::text[],
		         $16::text[], $17::text[])
		       WITH ORDINALITY AS v(effect, run_key, at, kind, version, actor, meta, detail, mac_key, mac, i)`
	if !lock {
		return `
		WITH u AS (` + set + `
		  RETURNING e.id, u.i
		), ev AS (
		  INSERT INTO events (run_key, at, kind, version, actor, meta, detail, mac_key, mac)
		  SELECT v.run_key, coalesce(v.at, now()), v.kind, v.version, v.actor, v.meta::jsonb, v.detail::jsonb, v.mac_key, v.mac
		  FROM ` + events + `
		  WHERE v.effect IN (SELECT id FROM u)
		  ORDER BY v.i
		)
		SELECT i::int, NULL::text[] FROM u`
	}
	// With the locks, the statement links the events of the runs it locked itself (0039),
	// as the claim links a run's first (claimRecordSQL), and the trigger does nothing for
	// them. lk locks the runs in key order and keeps each one's head as FOR UPDATE returns
	// it: the latest committed, after a wait for another writer of the run. No later part
	// of the statement reads workflow_runs for a head: it would see the statement's
	// snapshot, taken before that wait. keys is the InitPlan the update of the effects
	// waits for, so every run is locked before an effect row is touched.
	//
	// The events of the updates that applied take their ids from the sequence in their
	// order (nextval over the already sorted rows), and each one's content is rendered
	// once (jsonb's text output included), into a materialized CTE whose columns
	// airlock_chain_field, inlined, names three times each. An event of a run whose head
	// is in its row is linked here: the k-th of the run in id order is link seq+k, and
	// airlock_chain_fold over the run's events (from its locked head, in id order) gives
	// each one's hash. Those of a run whose head is in event_chains (chained before 0035),
	// or of a key the statement did not lock, go in unlinked and the trigger links them.
	// Each linked run's head then moves once, to its last link (HOT, as the trigger's).
	return `
		WITH lk AS (SELECT r.idempotency_key AS key, r.chain_seq, r.chain_head FROM workflow_runs r
		    WHERE r.idempotency_key IN (SELECT e.idempotency_key FROM effects e WHERE e.id = ANY($1))
		      AND r.state <> 'approved'
		    ORDER BY r.idempotency_key FOR UPDATE OF r),
		keys AS (SELECT ARRAY(SELECT key FROM lk) AS keys),
		u AS (` + set + ` AND e.idempotency_key = ANY((SELECT keys FROM keys)::text[])
		  RETURNING e.id, u.i
		), numbered AS MATERIALIZED (
		  SELECT nextval(pg_get_serial_sequence('events', 'id')) AS id, s.*
		  FROM (SELECT v.i AS pos, v.run_key, coalesce(v.at, now()) AS at, v.kind, v.version, v.actor,
		          v.meta::jsonb AS meta, v.detail::jsonb AS detail, v.mac_key, v.mac
		        FROM ` + events + `
		        WHERE v.effect IN (SELECT id FROM u)
		        ORDER BY v.i) s
		), rendered AS MATERIALIZED (
		  SELECT n.*, n.id::text AS id_t, (extract(epoch FROM n.at) * 1000000)::bigint::text AS at_t,
		    n.version::text AS version_t, n.meta::text AS meta_t, n.detail::text AS detail_t,
		    l.chain_seq AS base_seq, l.chain_head AS base_head
		  FROM numbered n LEFT JOIN lk l ON l.key = n.run_key
		), linked AS (
		  SELECT b.id, b.run_key, b.base_seq + row_number() OVER w AS seq,
		    airlock_chain_fold(b.base_head, airlock_chain_field(b.id_t) || airlock_chain_field(b.run_key)
		      || airlock_chain_field(b.at_t) || airlock_chain_field(b.kind)
		      || airlock_chain_field(b.version_t) || airlock_chain_field(b.actor)
		      || airlock_chain_field(b.meta_t) || airlock_chain_field(b.detail_t)) OVER w AS hash
		  FROM rendered b WHERE b.base_seq IS NOT NULL
		  WINDOW w AS (PARTITION BY b.run_key ORDER BY b.id ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
		), ev AS (
		  INSERT INTO events (id, run_key, at, kind, version, actor, meta, detail, mac_key, mac, chain_seq, chain_hash)
		  OVERRIDING SYSTEM VALUE
		  SELECT b.id, b.run_key, b.at, b.kind, b.version, b.actor, b.meta, b.detail, b.mac_key, b.mac, l.seq, l.hash
		  FROM rendered b LEFT JOIN linked l ON l.id = b.id
		  ORDER BY b.id
		), heads AS (
		  UPDATE workflow_runs r SET chain_seq = h.seq, chain_head = h.hash
		  FROM (SELECT DISTINCT ON (l.run_key) l.run_key, l.seq, l.hash FROM linked l ORDER BY l.run_key, l.seq DESC) h
		  WHERE r.idempotency_key = h.run_key
		)
		SELECT i::int, NULL::text[] FROM u
		UNION ALL SELECT 0, keys FROM keys`
}

func (q queries) effectUpdateMany(ctx context.Context, ps []store.EffectUpdateParams, events [][]store.EventInsertParams, lock bool) ([]string, []bool, error) {
	if len(ps) == 0 {
		return nil, nil, nil
	}
	n := len(ps)
	ids, owners, tos := make([]string, n), make([]string, n), make([]string, n)
	providerIDs, classes := make([]*string, n), make([]*string, n)
	notBefore := make([]*time.Time, n)
	index := make(map[string]struct{}, n)
	var ev eventArrays
	for i, p := range ps {
		if !p.Batchable() || !sameTime(p.Now, ps[0].Now) {
			return nil, nil, fmt.Errorf("%w (effect %s to %s)", store.ErrUnbatchable, p.ID, p.To)
		}
		if _, dup := index[p.ID]; dup {
			return nil, nil, fmt.Errorf("%w (effect %s twice)", store.ErrUnbatchable, p.ID)
		}
		index[p.ID] = struct{}{}
		ids[i], owners[i], tos[i] = p.ID, p.Owner, string(p.To)
		providerIDs[i], classes[i], notBefore[i] = p.ProviderID, p.ErrorClass, p.NotBefore
		if i < len(events) {
			for _, e := range events[i] {
				if err := ev.add(q.key, p.ID, e); err != nil {
					return nil, nil, err
				}
			}
		}
	}
	sql := effectUpdateManySQL
	if lock {
		sql = effectUpdateManyLockedSQL
	}
	rows, err := q.db.Query(ctx, sql, ids, owners, tos, providerIDs, notBefore, classes, ps[0].Now,
		ev.effects, ev.keys, ev.ats, ev.kinds, ev.versions, ev.actors, ev.metas, ev.details, ev.macKeys, ev.macs)
	if err != nil {
		return nil, nil, fmt.Errorf("update effects: %w", err)
	}
	applied := make([]bool, n)
	var locked []string
	var pos int32
	var keys []string
	some := false
	_, err = pgx.ForEachRow(rows, []any{&pos, &keys}, func() error {
		switch {
		case pos == 0:
			locked = keys
		case pos < 0 || int(pos) > n:
			return fmt.Errorf("update effects: position %d of %d", pos, n)
		default:
			applied[pos-1], some = true, true
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("update effects: %w", err)
	}
	if !some {
		locked = nil // the contract: nil when nothing applied
	}
	return locked, applied, nil
}

// eventArrays are events as the arrays of a multi-row insert, each tied to an effect.
type eventArrays struct {
	effects, keys, kinds, actors []string
	versions                     []int64
	ats                          []*time.Time
	metas, details               []*string
	macKeys, macs                []*string
}

func (c *eventArrays) add(key *store.AuditKey, effect string, p store.EventInsertParams) error {
	macKey, mac, err := key.Seal(p)
	if err != nil {
		return fmt.Errorf("update effects: %w", err)
	}
	c.effects, c.keys, c.kinds, c.actors = append(c.effects, effect), append(c.keys, p.RunKey), append(c.kinds, p.Kind), append(c.actors, p.Actor)
	c.versions, c.ats = append(c.versions, p.Version), append(c.ats, p.Now)
	c.metas, c.details = append(c.metas, textArg(p.Meta)), append(c.details, textArg(p.Detail))
	c.macKeys, c.macs = append(c.macKeys, macKey), append(c.macs, mac)
	return nil
}

// textArg is a JSON document as a text array element: NULL for none.
func textArg(raw []byte) *string {
	if raw == nil {
		return nil
	}
	s := string(raw)
	return &s
}

func sameTime(a, b *time.Time) bool {
	return a == nil && b == nil || a != nil && b != nil && a.Equal(*b)
}
