package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/airlockhq/airlock/internal/store"
)

// stepColumns are a step's due and claimed columns (constants, never user input).
func stepColumns(step store.ApprovalStep) (due, taken string, err error) {
	switch step {
	case store.StepWarn:
		return "warn_at", "warned_at", nil
	case store.StepEscalate:
		return "escalate_at", "escalated_at", nil
	}
	return "", "", fmt.Errorf("unknown approval step %q", step)
}

func (q queries) ApprovalsDue(ctx context.Context, step store.ApprovalStep, now *time.Time, limit int) ([]store.Approval, error) {
	due, taken, err := stepColumns(step)
	if err != nil {
		return nil, err
	}
	// The partial index approvals_{warn,escalate}_due holds only the rows not yet taken.
	rows, err := q.db.Query(ctx, `SELECT `+approvalColumns+` FROM approvals
		WHERE consumed_at IS NULL AND `+taken+` IS NULL AND `+due+` IS NOT NULL
		  AND `+due+` <= airlock_now($1::timestamptz) AND expires_at > airlock_now($1::timestamptz)
		ORDER BY `+due+` LIMIT $2`, now, limit)
	if err != nil {
		return nil, fmt.Errorf("list approvals due to %s: %w", step, err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Approval, error) { return scanApproval(row) })
}

func (q queries) ApprovalClaimStep(ctx context.Context, id string, step store.ApprovalStep, now *time.Time) (store.Approval, error) {
	due, taken, err := stepColumns(step)
	if err != nil {
		return store.Approval{}, err
	}
	a, err := scanApproval(q.db.QueryRow(ctx, `
		UPDATE approvals SET `+taken+` = airlock_now($2::timestamptz)
		WHERE id = $1 AND consumed_at IS NULL AND `+taken+` IS NULL AND `+due+` IS NOT NULL
		  AND `+due+` <= airlock_now($2::timestamptz) AND expires_at > airlock_now($2::timestamptz)
		RETURNING `+approvalColumns, id, now))
	if errors.Is(err, store.ErrNotFound) {
		return store.Approval{}, store.ErrNoMatch
	}
	return a, err
}

func (q queries) ApprovalSetUndecidable(ctx context.Context, id string, undecidable bool, now *time.Time) (store.Approval, error) {
	// Each statement runs when it is queried: choose one, never query both.
	var a store.Approval
	var err error
	if undecidable {
		a, err = scanApproval(q.db.QueryRow(ctx, `UPDATE approvals SET undecidable_since = airlock_now($2::timestamptz)
		WHERE id = $1 AND undecidable_since IS NULL AND consumed_at IS NULL AND expires_at > airlock_now($2::timestamptz)
		RETURNING `+approvalColumns, id, now))
	} else {
		a, err = scanApproval(q.db.QueryRow(ctx, `UPDATE approvals SET undecidable_since = NULL
		WHERE id = $1 AND undecidable_since IS NOT NULL RETURNING `+approvalColumns, id))
	}
	if errors.Is(err, store.ErrNotFound) {
		return store.Approval{}, store.ErrNoMatch
	}
	return a, err
}

func (q queries) ApprovalsUndecidable(ctx context.Context, after store.Cursor, now *time.Time, limit int) ([]store.Approval, error) {
	at, id := cursorArgs(after)
	// The partial index approvals_undecidable holds only these rows, in this order.
	rows, err := q.db.Query(ctx, `SELECT `+approvalColumns+` FROM approvals
		WHERE consumed_at IS NULL AND undecidable_since IS NOT NULL
		  AND ($1::timestamptz IS NULL OR (created_at, id) < ($1, $2::text))
		  AND expires_at > airlock_now($3::timestamptz)
		ORDER BY created_at DESC, id DESC LIMIT $4`, at, id, now, limit)
	if err != nil {
		return nil, fmt.Errorf("list undecidable approvals: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Approval, error) { return scanApproval(row) })
}

func (q queries) ApprovalsUndecidableCount(ctx context.Context, now *time.Time) (int, error) {
	var n int
	err := q.db.QueryRow(ctx, `SELECT count(*) FROM approvals
		WHERE consumed_at IS NULL AND undecidable_since IS NOT NULL AND expires_at > airlock_now($1::timestamptz)`, now).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count undecidable approvals: %w", err)
	}
	return n, nil
}

func (q queries) PersonSeenPut(ctx context.Context, p store.PersonSeen) error {
	_, err := q.db.Exec(ctx, `INSERT INTO people_seen (subject, roles, seen_at) VALUES ($1, $2, coalesce($3, now()))
		ON CONFLICT (subject) DO UPDATE SET roles = excluded.roles, seen_at = excluded.seen_at`,
		p.Subject, strings.Join(p.Roles, ","), timeArg(p.SeenAt))
	if err != nil {
		return fmt.Errorf("record sign-in of %q: %w", p.Subject, err)
	}
	return nil
}

func (q queries) PeopleSeen(ctx context.Context, since time.Time) ([]store.PersonSeen, error) {
	rows, err := q.db.Query(ctx, `SELECT subject, roles, seen_at FROM people_seen WHERE seen_at >= $1 ORDER BY subject`, since)
	if err != nil {
		return nil, fmt.Errorf("list people seen: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.PersonSeen, error) {
		var p store.PersonSeen
		var roles string
		err := row.Scan(&p.Subject, &roles, &p.SeenAt)
		p.Roles = splitList(roles)
		return p, err
	})
}
