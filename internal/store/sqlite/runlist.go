package sqlite

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

// RunList builds its statement from the filters given, as PostgreSQL's does.
func (q queries) RunList(ctx context.Context, p store.RunListParams) ([]store.Run, error) {
	sql, args := runListSQL(p)
	runs, err := selectAll(ctx, q.db, scanRun, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	return runs, nil
}

func runListSQL(p store.RunListParams) (string, []any) {
	var where []string
	var args []any
	arg := func(v any) string { args = append(args, v); return fmt.Sprintf("?%d", len(args)) }
	if p.State != "" {
		where = append(where, "state = "+arg(string(p.State)))
	}
	if p.KeyPrefix != "" {
		where = append(where, "idempotency_key >= "+arg(p.KeyPrefix)+" AND idempotency_key < "+arg(store.KeyPrefixEnd(p.KeyPrefix)))
	}
	if p.OlderThan != nil {
		where = append(where, "created_at <= "+arg(p.OlderThan.UnixMicro()))
	}
	if p.StalledAt != nil {
		where = append(where, "state = 'processing' AND lease_expires_at <= "+arg(p.StalledAt.UnixMicro()))
	}
	if p.ActionType != "" {
		a := arg(p.ActionType)
		where = append(where, `(EXISTS (SELECT 1 FROM effects e WHERE e.idempotency_key = r.idempotency_key AND e.action_type = `+a+`)
		  OR EXISTS (SELECT 1 FROM approvals a WHERE a.idempotency_key = r.idempotency_key AND a.action_type = `+a+`))`)
	}
	if !p.After.IsZero() {
		at, key := arg(p.After.At.UnixMicro()), arg(p.After.ID)
		where = append(where, "(created_at < "+at+" OR (created_at = "+at+" AND idempotency_key < "+key+"))")
	}
	sql := `SELECT ` + runColumns + ` FROM workflow_runs r`
	if len(where) > 0 {
		sql += ` WHERE ` + strings.Join(where, " AND ")
	}
	sql += ` ORDER BY created_at DESC, idempotency_key DESC LIMIT ` + arg(p.Limit)
	return sql, args
}

func (q queries) RunsStalledUnmarked(ctx context.Context, now *time.Time, limit int) ([]store.Run, error) {
	runs, err := selectAll(ctx, q.db, scanRun, `SELECT `+runColumns+` FROM workflow_runs
		WHERE state = 'processing' AND lease_expires_at <= ?1 AND stall_alerted_version IS NOT version
		ORDER BY lease_expires_at LIMIT ?2`, q.at(now), limit)
	if err != nil {
		return nil, fmt.Errorf("list stalled runs: %w", err)
	}
	return runs, nil
}

func (q queries) RunStallMark(ctx context.Context, key string, version int64, now *time.Time) (bool, error) {
	res, err := q.db.ExecContext(ctx, `UPDATE workflow_runs SET stall_alerted_version = version
		WHERE idempotency_key = ?1 AND version = ?2 AND state = 'processing' AND lease_expires_at <= ?3
		  AND stall_alerted_version IS NOT version`, key, version, q.at(now))
	if err != nil {
		return false, fmt.Errorf("mark the stall of %q: %w", key, err)
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

func (q queries) EffectsWaiting(ctx context.Context, dueBefore time.Time, limit int) ([]store.Effect, error) {
	return selectAll(ctx, q.db, scanEffect, `SELECT `+effectColumns+` FROM effects
		WHERE state = 'pending' AND executor IN ('dispatcher', 'worker') AND not_before <= ?1
		ORDER BY not_before, id LIMIT ?2`, dueBefore.UnixMicro(), limit)
}
