package sqlite

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

// RunLock reads the run under its lease. Inside Transact the transaction began
// IMMEDIATE, so it already holds the database's write lock: no row lock is needed.
func (q queries) RunLock(ctx context.Context, p store.RunLockParams) (store.Run, error) {
	return noMatch(scanRun(q.db.QueryRowContext(ctx, `
		SELECT `+runColumns+` FROM workflow_runs
		WHERE idempotency_key = ? AND lease_owner = ? AND version = ? AND state = 'processing'
		  AND lease_expires_at > ?`, p.Key, p.Owner, p.Version, q.at(p.Now))))
}

const effectColumns = `id, idempotency_key, effect_id, action_type, target, executor, payload,
	payload_hash, state, lease_owner, lease_expires_at, send_started_at, provider_id, attempts, not_before,
	last_error_class, created_at, updated_at, next_check_at, checks, version, ambiguous_at, none_confirmed_at, trace_parent`

func scanEffect(row scanner) (store.Effect, error) {
	var e store.Effect
	var state string
	var payload sql.NullString
	var leaseExp, started, nextCheck, ambiguous, noneConfirmed sql.NullInt64
	var notBefore, created, updated int64
	err := row.Scan(&e.ID, &e.RunKey, &e.EffectID, &e.ActionType, &e.Target, &e.Executor, &payload,
		&e.PayloadHash, &state, &e.LeaseOwner, &leaseExp, &started, &e.ProviderID, &e.Attempts,
		&notBefore, &e.LastErrorClass, &created, &updated, &nextCheck, &e.Checks, &e.Version, &ambiguous, &noneConfirmed, &e.TraceParent)
	if err != nil {
		return store.Effect{}, interpret(err)
	}
	e.State, e.Payload, e.LeaseExpiresAt, e.SendStartedAt = store.EffectState(state), optJSON(payload), optTime(leaseExp), optTime(started)
	e.NotBefore, e.CreatedAt, e.UpdatedAt = fromMicros(notBefore), fromMicros(created), fromMicros(updated)
	e.NextCheckAt, e.AmbiguousAt, e.NoneConfirmedAt = optTime(nextCheck), optTime(ambiguous), optTime(noneConfirmed)
	return e, nil
}

// orNow resolves a zero time to the clock.
func (q queries) orNow(t time.Time) int64 {
	if t.IsZero() {
		return q.now().UnixMicro()
	}
	return t.UnixMicro()
}

func (q queries) EffectInsert(ctx context.Context, e store.Effect) (store.Effect, bool, error) {
	created := q.orNow(e.CreatedAt)
	notBefore := created
	if !e.NotBefore.IsZero() {
		notBefore = e.NotBefore.UnixMicro()
	}
	got, err := scanEffect(q.db.QueryRowContext(ctx, `
		INSERT INTO effects (id, idempotency_key, effect_id, action_type, target, executor, payload,
		  payload_hash, state, not_before, created_at, updated_at, trace_parent)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (idempotency_key, effect_id) DO NOTHING
		RETURNING `+effectColumns, e.ID, e.RunKey, e.EffectID, e.ActionType, e.Target, e.Executor,
		jsonArg(e.Payload), e.PayloadHash, string(e.State), notBefore, created, created, e.TraceParent))
	if err == nil {
		return got, true, nil
	}
	if !errors.Is(err, store.ErrNotFound) {
		return store.Effect{}, false, fmt.Errorf("insert effect: %w", err)
	}
	got, err = scanEffect(q.db.QueryRowContext(ctx, `SELECT `+effectColumns+` FROM effects
		WHERE idempotency_key = ? AND effect_id = ?`, e.RunKey, e.EffectID))
	if err != nil {
		return store.Effect{}, false, fmt.Errorf("read existing effect: %w", err)
	}
	return got, false, nil
}

func (q queries) EffectGet(ctx context.Context, id string) (store.Effect, error) {
	return scanEffect(q.db.QueryRowContext(ctx, `SELECT `+effectColumns+` FROM effects WHERE id = ?`, id))
}

// placeholders returns "?, ?, ?" for n values (n ≥ 1).
func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

func (q queries) EffectList(ctx context.Context, p store.EffectListParams) ([]store.Effect, error) {
	query := `SELECT ` + effectColumns + ` FROM effects WHERE (?1 = '' OR idempotency_key = ?1)`
	args := []any{p.RunKey}
	if len(p.States) > 0 {
		query += ` AND state IN (` + placeholders(len(p.States)) + `)`
		for _, s := range p.States {
			args = append(args, string(s))
		}
	}
	limit := p.Limit
	if limit <= 0 {
		limit = -1 // no limit
	}
	args = append(args, limit)
	return selectAll(ctx, q.db, scanEffect, query+` ORDER BY created_at, id LIMIT ?`, args...)
}

// EffectLease needs no SKIP LOCKED: the IMMEDIATE transaction holds the only write lock,
// so the select and the update see the same rows and no other writer runs in between.
// Each type is probed up to its own cap, then the oldest of those up to the limit.
func (q queries) EffectLease(ctx context.Context, p store.EffectLeaseParams) ([]store.Effect, error) {
	return q.lease(ctx, p, nil)
}

// lease is EffectLease that also marks begun the effects of the types of begin that the
// kill switch allows and whose run is not failed_terminal (BeginSends's conditions): only
// in LeaseEffects's IMMEDIATE transaction, which orders it against kill switch changes.
func (q queries) lease(ctx context.Context, p store.EffectLeaseParams, begin []string) ([]store.Effect, error) {
	now := q.at(p.Now)
	args := []any{p.Owner, now, p.Lease.Microseconds(), p.Executor}
	var probes []string
	for _, t := range slices.Sorted(maps.Keys(p.Caps)) {
		if p.Caps[t] < 1 {
			continue
		}
		probes = append(probes, fmt.Sprintf(`SELECT * FROM (SELECT id, not_before FROM effects
		  WHERE state = 'pending' AND executor = ?4 AND not_before <= ?2 AND action_type = ?%d
		  ORDER BY not_before LIMIT ?%d)`, len(args)+1, len(args)+2))
		args = append(args, t, p.Caps[t])
	}
	if len(probes) == 0 || p.Limit < 1 {
		return nil, nil
	}
	started := `NULL`
	if len(begin) > 0 {
		started = `CASE WHEN action_type IN (` + numbered(len(args)+1, len(begin)) + `)` + sqliteKillSwitchAllows + `
		  AND NOT EXISTS (SELECT 1 FROM workflow_runs r
		                  WHERE r.idempotency_key = effects.idempotency_key AND r.state = 'failed_terminal')
		  THEN ?2 END`
		for _, t := range begin {
			args = append(args, t)
		}
	}
	args = append(args, p.Limit)
	query := `UPDATE effects
		SET state = 'sending', lease_owner = ?1, attempts = attempts + 1, send_started_at = ` + started + `, version = version + 1,
		    lease_expires_at = ?2 + ?3, updated_at = ?2
		WHERE id IN (SELECT id FROM (` + strings.Join(probes, " UNION ALL ") + `) ORDER BY not_before LIMIT ?` +
		fmt.Sprint(len(args)) + `) RETURNING ` + effectColumns
	return selectAll(ctx, q.db, scanEffect, query, args...)
}

// LeaseEffects runs the lease in an IMMEDIATE transaction: SQLite's writers take turns
// under the store's write lock (an autocommit write would wait in the busy handler), so
// the begin-mark of p.Begin's types reads the kill switch ordered against its changes.
func (s *Store) LeaseEffects(ctx context.Context, p store.EffectLeaseParams) ([]store.Effect, error) {
	var got []store.Effect
	err := s.Transact(ctx, func(q store.Queries) error {
		var err error
		got, err = q.(queries).lease(ctx, p, p.Begin)
		return err
	})
	return got, err
}

func (q queries) EffectMarkStarted(ctx context.Context, owner string, ids []string, now *time.Time) ([]string, error) {
	return q.markStarted(ctx, owner, ids, now, "")
}

// markStarted is the begin-mark's compare-and-set, with extra conditions on effects.
func (q queries) markStarted(ctx context.Context, owner string, ids []string, now *time.Time, and string) ([]string, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	args := []any{owner, q.at(now)}
	for _, id := range ids {
		args = append(args, id)
	}
	return selectAll(ctx, q.db, func(row scanner) (string, error) {
		var id string
		return id, row.Scan(&id)
	}, `UPDATE effects SET send_started_at = ?2, version = version + 1
		WHERE id IN (`+numbered(3, len(ids))+`) AND state = 'sending' AND lease_owner = ?1
		  AND send_started_at IS NULL AND lease_expires_at > ?2
		  AND NOT EXISTS (SELECT 1 FROM workflow_runs r
		                  WHERE r.idempotency_key = effects.idempotency_key AND r.state = 'failed_terminal')`+and+`
		RETURNING id`, args...)
}

// sqliteKillSwitchAllows is the default-deny rule of effects.Service.enabled as a
// condition on a row of effects: an enabled global row, no disabled row for its type.
const sqliteKillSwitchAllows = `
		  AND EXISTS (SELECT 1 FROM kill_switch k WHERE k.scope = 'global' AND k.enabled)
		  AND NOT EXISTS (SELECT 1 FROM kill_switch k WHERE k.scope = 'action:' || effects.action_type AND NOT k.enabled)`

// BeginSends marks in one IMMEDIATE transaction, which orders it against kill switch
// changes (SQLite's writers take turns): the default-deny rule of effects.Service.enabled
// as a condition on the row.
func (s *Store) BeginSends(ctx context.Context, owner string, ids []string, now *time.Time) ([]string, error) {
	var marked []string
	err := s.Transact(ctx, func(q store.Queries) error {
		var err error
		marked, err = q.(queries).markStarted(ctx, owner, ids, now, sqliteKillSwitchAllows)
		return err
	})
	return marked, err
}

// EffectClaimUnknown needs no SKIP LOCKED: the IMMEDIATE transaction holds the only write
// lock, so no other instance lists between the select and the update.
func (q queries) EffectClaimUnknown(ctx context.Context, types []string, now *time.Time, claim time.Duration, limit int) ([]store.Effect, error) {
	if len(types) == 0 {
		return nil, nil
	}
	at := q.at(now)
	args := []any{at, limit, at + claim.Microseconds()}
	for _, t := range types {
		args = append(args, t)
	}
	return selectAll(ctx, q.db, scanEffect, `UPDATE effects SET next_check_at = ?3, version = version + 1
		WHERE id IN (SELECT id FROM effects
		  WHERE state = 'unknown' AND executor = 'dispatcher' AND action_type IN (`+numbered(4, len(types))+`)
		    AND (next_check_at IS NULL OR next_check_at <= ?1)
		  ORDER BY next_check_at NULLS FIRST, updated_at LIMIT ?2)
		RETURNING `+effectColumns, args...)
}

func (q queries) EffectClaimRecheck(ctx context.Context, types []string, now *time.Time, claim time.Duration, limit int) ([]store.Effect, error) {
	if len(types) == 0 {
		return nil, nil
	}
	at := q.at(now)
	args := []any{at, limit, at + claim.Microseconds()}
	for _, t := range types {
		args = append(args, t)
	}
	return selectAll(ctx, q.db, scanEffect, `UPDATE effects SET next_check_at = ?3, version = version + 1
		WHERE id IN (SELECT id FROM effects
		  WHERE state = 'completed' AND next_check_at IS NOT NULL AND next_check_at <= ?1
		    AND executor = 'dispatcher' AND action_type IN (`+numbered(4, len(types))+`)
		  ORDER BY next_check_at LIMIT ?2)
		RETURNING `+effectColumns, args...)
}

func (q queries) EffectRecheckDone(ctx context.Context, id string, version int64) error {
	return q.exactlyOne(q.db.ExecContext(ctx, `UPDATE effects SET next_check_at = NULL, version = version + 1
		WHERE id = ? AND version = ? AND state = 'completed'`, id, version))
}

// exactlyOne turns an update that changed no row into store.ErrNoMatch.
func (q queries) exactlyOne(res sql.Result, err error) error {
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return cmp.Or(err, store.ErrNoMatch)
	}
	return nil
}

func (q queries) EffectCheckLater(ctx context.Context, id string, version int64, at time.Time) error {
	res, err := q.db.ExecContext(ctx, `UPDATE effects SET next_check_at = ?, checks = checks + 1, version = version + 1
		WHERE id = ? AND version = ? AND state IN ('unknown', 'completed')`, at.UnixMicro(), id, version)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return cmp.Or(err, store.ErrNoMatch)
	}
	return nil
}

func (q queries) EffectCancelPending(ctx context.Context, key, class string, now *time.Time) ([]store.Effect, error) {
	return selectAll(ctx, q.db, scanEffect, `UPDATE effects SET state = 'cancelled', last_error_class = ?2, updated_at = ?3,
		  version = version + 1
		WHERE idempotency_key = ?1 AND state = 'pending'
		RETURNING `+effectColumns, key, class, q.at(now))
}

// EffectNotify has no one to tell: other processes on the file find new effects by polling.
func (q queries) EffectNotify(context.Context) error { return nil }

// KillSwitchGuard needs no lock: the IMMEDIATE transaction already excludes every writer.
func (q queries) KillSwitchGuard(context.Context, bool) error { return nil }

// RunLockKeys reads the runs: the IMMEDIATE transaction already holds the write lock.
func (q queries) RunLockKeys(ctx context.Context, keys []string) (map[string]store.Run, error) {
	out := make(map[string]store.Run, len(keys))
	for _, k := range keys {
		r, err := q.RunGet(ctx, k)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out[k] = r
	}
	return out, nil
}

func (q queries) EffectUpdate(ctx context.Context, p store.EffectUpdateParams) (store.Effect, error) {
	if err := p.CheckFenced(); err != nil {
		return store.Effect{}, err
	}
	args := []any{p.ID, string(p.To), p.Owner, p.ProviderID, nil, p.ErrorClass, p.ReleaseAttempt, q.at(p.Now), p.Started,
		p.LeaseExpired, p.NotStarted, nil, p.Attempts, p.FromErrorClass, p.Version, p.Ambiguous, p.Unambiguous, p.NoneConfirmed, p.RecheckAfter.Microseconds()}
	if p.Payload != nil {
		args[11] = string(p.Payload)
	}
	if p.NotBefore != nil {
		args[4] = p.NotBefore.UnixMicro()
	}
	for _, s := range p.From {
		args = append(args, string(s))
	}
	e, err := scanEffect(q.db.QueryRowContext(ctx, `
		UPDATE effects
		SET state = ?2,
		    provider_id = coalesce(?4, provider_id),
		    not_before = coalesce(?5, not_before),
		    last_error_class = coalesce(?6, last_error_class),
		    payload = coalesce(?12, payload),
		    attempts = attempts - CASE WHEN ?7 THEN 1 ELSE 0 END,
		    lease_owner = CASE WHEN ?2 = 'sending' THEN lease_owner ELSE '' END,
		    lease_expires_at = CASE WHEN ?2 = 'sending' THEN lease_expires_at ELSE NULL END,
		    send_started_at = CASE WHEN ?2 <> 'sending' THEN NULL WHEN ?9 THEN ?8 ELSE send_started_at END,
		    next_check_at = CASE WHEN ?2 = 'unknown' AND state = 'unknown' THEN next_check_at
		                         WHEN ?2 = 'completed' AND ?19 > 0 THEN ?8 + ?19 END,
		    none_confirmed_at = CASE WHEN ?18 THEN ?8 ELSE none_confirmed_at END,
		    checks = CASE WHEN ?2 = 'unknown' AND state = 'unknown' THEN checks ELSE 0 END,
		    ambiguous_at = CASE WHEN ?16 THEN coalesce(send_started_at, ?8) WHEN ?17 THEN NULL ELSE ambiguous_at END,
		    updated_at = ?8,
		    version = version + 1
		WHERE id = ?1 AND (?3 = '' OR lease_owner = ?3) AND (?15 = 0 OR version = ?15)
		  AND (NOT ?10 OR lease_expires_at <= ?8) AND (NOT ?11 OR send_started_at IS NULL)
		  AND (?13 = 0 OR attempts = ?13) AND (?14 = '' OR last_error_class = ?14)
		  AND state IN (`+numbered(20, len(p.From))+`)
		RETURNING `+effectColumns, args...))
	if errors.Is(err, store.ErrNotFound) {
		return store.Effect{}, store.ErrNoMatch
	}
	return e, err
}

// numbered returns "?9, ?10, …" for n values starting at from.
func numbered(from, n int) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = fmt.Sprintf("?%d", from+i)
	}
	return strings.Join(parts, ", ")
}

func (q queries) EffectExpiredLeases(ctx context.Context, now *time.Time, limit int) ([]store.Effect, error) {
	return selectAll(ctx, q.db, scanEffect, `SELECT `+effectColumns+` FROM effects
		WHERE state = 'sending' AND lease_expires_at <= ? ORDER BY lease_expires_at LIMIT ?`, q.at(now), limit)
}

// EffectCountByState reads the counters the effects triggers keep (0010_cost.sql).
func (q queries) EffectCountByState(ctx context.Context) (map[store.EffectState]int, error) {
	rows, err := q.db.QueryContext(ctx, `SELECT state, n FROM effect_counts WHERE n <> 0`)
	if err != nil {
		return nil, fmt.Errorf("count effects: %w", err)
	}
	defer rows.Close()
	out := map[store.EffectState]int{}
	for rows.Next() {
		var state string
		var n int
		if err := rows.Scan(&state, &n); err != nil {
			return nil, err
		}
		out[store.EffectState(state)] = n
	}
	return out, rows.Err()
}

func (q queries) KillSwitchList(ctx context.Context) ([]store.KillSwitch, error) {
	rows, err := q.db.QueryContext(ctx, `SELECT scope, enabled, reason, actor, updated_at FROM kill_switch ORDER BY scope`)
	if err != nil {
		return nil, fmt.Errorf("read kill switch: %w", err)
	}
	defer rows.Close()
	var out []store.KillSwitch
	for rows.Next() {
		var k store.KillSwitch
		var at int64
		if err := rows.Scan(&k.Scope, &k.Enabled, &k.Reason, &k.Actor, &at); err != nil {
			return nil, fmt.Errorf("read kill switch: %w", err)
		}
		k.UpdatedAt = fromMicros(at)
		out = append(out, k)
	}
	return out, rows.Err()
}

func (q queries) KillSwitchSet(ctx context.Context, k store.KillSwitch) error {
	_, err := q.db.ExecContext(ctx, `
		INSERT INTO kill_switch (scope, enabled, reason, actor, updated_at) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (scope) DO UPDATE SET enabled = excluded.enabled, reason = excluded.reason,
		  actor = excluded.actor, updated_at = excluded.updated_at`,
		k.Scope, k.Enabled, k.Reason, k.Actor, q.orNow(k.UpdatedAt))
	if err != nil {
		return fmt.Errorf("set kill switch: %w", err)
	}
	return nil
}
