package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/airlockhq/airlock/internal/store"
)

// cursorArgs: a zero cursor is NULL, the first page.
func cursorArgs(c store.Cursor) (any, string) {
	if c.IsZero() {
		return nil, ""
	}
	return c.At, c.ID
}

func (q queries) ApprovalsPending(ctx context.Context, after store.Cursor, now *time.Time, limit int) ([]store.Approval, error) {
	at, id := cursorArgs(after)
	// The partial index approvals_pending holds only undecided approvals, in this order.
	rows, err := q.db.Query(ctx, `SELECT `+approvalColumns+` FROM approvals
		WHERE consumed_at IS NULL AND ($1::timestamptz IS NULL OR (created_at, id) < ($1, $2::text))
		  AND mode <> 'review' AND expires_at > airlock_now($3::timestamptz)
		ORDER BY created_at DESC, id DESC LIMIT $4`, at, id, now, limit)
	if err != nil {
		return nil, fmt.Errorf("list pending approvals: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Approval, error) { return scanApproval(row) })
}

func (q queries) EffectsInState(ctx context.Context, state store.EffectState, after store.Cursor, limit int) ([]store.Effect, error) {
	at, id := cursorArgs(after)
	return collectEffects(q.db.Query(ctx, `SELECT `+effectColumns+` FROM effects
		WHERE state IN ('unknown', 'failed') AND state = $1 AND ($2::timestamptz IS NULL OR (updated_at, id) > ($2, $3::text))
		ORDER BY state, updated_at, id LIMIT $4`, string(state), at, id, limit))
}

func (q queries) RunsParked(ctx context.Context, after store.Cursor, limit int) ([]store.Run, error) {
	at, key := cursorArgs(after)
	rows, err := q.db.Query(ctx, `SELECT `+runColumns+` FROM workflow_runs
		WHERE state = 'awaiting_human' AND park_reason IN ('unknown_commit', 'input_mismatch')
		  AND ($1::timestamptz IS NULL OR (updated_at, idempotency_key) < ($1, $2::text))
		ORDER BY updated_at DESC, idempotency_key DESC LIMIT $3`, at, key, limit)
	if err != nil {
		return nil, fmt.Errorf("list parked runs: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Run, error) { return scanRun(row) })
}
