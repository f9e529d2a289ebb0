package postgres

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/airlockhq/airlock/internal/store"
)

// RunList builds its statement from the filters given, so that each plan (custom or
// generic) has only conditions an index serves (runListSQL).
func (q queries) RunList(ctx context.Context, p store.RunListParams) ([]store.Run, error) {
	sql, args := runListSQL(p)
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

// runListSQL is RunList's statement. Runs of one state (the state filter, or the
// stalled one, which is processing) are one range of workflow_runs_state_created, read
// newest first. Runs of every state are that index's range of each state, each read
// newest first up to the page, merged (a Merge Append of one ordered scan per state,
// stopping at the page): there is no index on (created_at, key) alone, which every run's
// insert and state change would write (0036_runlist_fold.sql). store.States is the
// CHECK constraint's set (TestRunStatesMatchTheSchema). Each state's branch must find
// its first row before the merge starts: with a filter no index serves (the action
// type; a key prefix the plan does not read by workflow_runs_key_bytes), a large state
// with no matching run is read whole.
func runListSQL(p store.RunListParams) (string, []any) {
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
	oneState := p.State != "" || p.StalledAt != nil
	// The page's size is written into a merged statement without a key prefix: its
	// prepared statement then takes a generic plan after five runs (the same plan, its
	// cost known) instead of planning every state's branch on every call — with LIMIT
	// $n the generic plan is costed for a tenth of the table, so it is never chosen. A key
	// prefix keeps LIMIT $n, and custom plans: which index serves it depends on the
	// prefix (TestHotQueriesUseIndexes EXPLAINs both plans).
	limit := strconv.Itoa(p.Limit)
	if oneState || p.KeyPrefix != "" {
		limit = arg(p.Limit)
	}
	page := ` ORDER BY created_at DESC, idempotency_key DESC LIMIT ` + limit
	runs := func(where []string) string {
		sql := `SELECT ` + runColumns + ` FROM workflow_runs r`
		if len(where) > 0 {
			sql += ` WHERE ` + strings.Join(where, " AND ")
		}
		return sql + page
	}
	if oneState {
		return runs(where), args
	}
	branches := make([]string, len(store.States))
	for i, s := range store.States {
		// A literal, not a parameter: each branch's plan is that state's range.
		branches[i] = "(" + runs(append([]string{"state = '" + string(s) + "'"}, where...)) + ")"
	}
	return `SELECT ` + runColumns + ` FROM (` + strings.Join(branches, "\n\t  UNION ALL ") + `) r` + page, args
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
