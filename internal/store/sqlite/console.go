package sqlite

import (
	"context"
	"math"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

// beforeCursor is the first position of a newest-first page: after every row.
func beforeCursor(c store.Cursor) (int64, string) {
	if c.IsZero() {
		return math.MaxInt64, ""
	}
	return c.At.UnixMicro(), c.ID
}

func (q queries) ApprovalsPending(ctx context.Context, after store.Cursor, now *time.Time, limit int) ([]store.Approval, error) {
	at, id := beforeCursor(after)
	// The partial index approvals_pending holds only undecided approvals, in this order.
	return selectAll(ctx, q.db, scanApproval, `SELECT `+approvalColumns+` FROM approvals
		WHERE consumed_at IS NULL AND (created_at < ?1 OR (created_at = ?1 AND (?2 = '' OR id < ?2)))
		  AND mode <> 'review' AND expires_at > ?3
		ORDER BY created_at DESC, id DESC LIMIT ?4`, at, id, q.at(now), limit)
}

func (q queries) EffectsInState(ctx context.Context, state store.EffectState, after store.Cursor, limit int) ([]store.Effect, error) {
	at := int64(math.MinInt64)
	if !after.IsZero() {
		at = after.At.UnixMicro()
	}
	return selectAll(ctx, q.db, scanEffect, `SELECT `+effectColumns+` FROM effects
		WHERE state IN ('unknown', 'failed') AND state = ?1 AND (updated_at > ?2 OR (updated_at = ?2 AND id > ?3))
		ORDER BY state, updated_at, id LIMIT ?4`, string(state), at, after.ID, limit)
}

func (q queries) RunsParked(ctx context.Context, after store.Cursor, limit int) ([]store.Run, error) {
	at, key := beforeCursor(after)
	return selectAll(ctx, q.db, scanRun, `SELECT `+runColumns+` FROM workflow_runs
		WHERE state = 'awaiting_human' AND park_reason IN ('unknown_commit', 'input_mismatch')
		  AND (updated_at < ?1 OR (updated_at = ?1 AND (?2 = '' OR idempotency_key < ?2)))
		ORDER BY updated_at DESC, idempotency_key DESC LIMIT ?3`, at, key, limit)
}
