package postgres

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/airlockhq/airlock/internal/store"
)

// RunList builds its statement from the filters given, so that each plan (custom or
// generic) has only conditions an index serves.
func (q queries) RunList(ctx context.Context, p store.RunListParams) ([]store.Run, error) {
	var where []string
	var args []any
	arg := func(v any) string { args = append(args, v); return fmt.Sprintf("$%d", len(args)) }
	if p.State != "" {
		where = append(where, "state = "+arg(string(p.State)))
	}
	if p.KeyPrefix != "" {
		lo, hi := arg(p.KeyPrefix), arg(store.KeyPrefixEnd(p.KeyPrefix))
		where = append(where, `idempotency_key COLLATE "C" >= `+lo+`::text AND idempotency_key COLLATE "C" < `+hi+`::text`)
	}
	if p.OlderThan != nil {
		where = append(where, "created_at <= "+arg(*p.OlderThan))
	}
	if p.StalledAt != nil {
		where = append(where, "state = 'processing' AND lease_expires_at <= "+arg(*p.StalledAt))
	}
	if p.ActionType != "" {
		a := arg(p.ActionType)
		// Scalar subqueries with LIMIT 1 are looked up per run by its key (an index),
		// never hashed from a scan of the whole table.
		where = append(where, `coalesce((SELECT true FROM effects e WHERE e.idempotency_key = r.idempotency_key AND e.action_type = `+a+` LIMIT 1)
		  OR (SELECT true FROM approvals a WHERE a.idempotency_key = r.idempotency_key AND a.action_type = `+a+` LIMIT 1), false)`)
	}
	if !p.After.IsZero() {
		where = append(where, "(created_at, idempotency_key) < ("+arg(p.After.At)+"::timestamptz, "+arg(p.After.ID)+"::text)")
	}
	sql := `SELECT ` + runColumns + ` FROM workflow_runs r`
	if len(where) > 0 {
		sql += ` WHERE ` + strings.Join(where, " AND ")
	}
	sql += ` ORDER BY created_at DESC, idempotency_key DESC LIMIT ` + arg(p.Limit)
	rows, err := q.db.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	runs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Run, error) { return scanRun(row) })
	if err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	return runs, nil
}

func (q queries) RunsStalledUnmarked(ctx context.Context, now *time.Time, limit int) ([]store.Run, error) {
	rows, err := q.db.Query(ctx, `SELECT `+runColumns+` FROM workflow_runs
		WHERE state = 'processing' AND lease_expires_at <= coalesce($1::timestamptz, now())
		  AND stall_alerted_version IS DISTINCT FROM version
		ORDER BY lease_expires_at LIMIT $2`, now, limit)
	if err != nil {
		return nil, fmt.Errorf("list stalled runs: %w", err)
	}
	runs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Run, error) { return scanRun(row) })
	if err != nil {
		return nil, fmt.Errorf("list stalled runs: %w", err)
	}
	return runs, nil
}

func (q queries) RunStallMark(ctx context.Context, key string, version int64, now *time.Time) (bool, error) {
	tag, err := q.db.Exec(ctx, `UPDATE workflow_runs SET stall_alerted_version = version
		WHERE idempotency_key = $1 AND version = $2 AND state = 'processing'
		  AND lease_expires_at <= airlock_now($3::timestamptz)
		  AND stall_alerted_version IS DISTINCT FROM version`, key, version, now)
	if err != nil {
		return false, fmt.Errorf("mark the stall of %q: %w", key, err)
	}
	return tag.RowsAffected() == 1, nil
}

func (q queries) EffectsWaiting(ctx context.Context, dueBefore time.Time, limit int) ([]store.Effect, error) {
	return collectEffects(q.db.Query(ctx, `SELECT `+effectColumns+` FROM effects
		WHERE state = 'pending' AND executor IN ('dispatcher', 'worker') AND not_before <= $1
		ORDER BY not_before, id LIMIT $2`, dueBefore, limit))
}
