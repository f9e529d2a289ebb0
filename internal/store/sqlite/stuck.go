package sqlite

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

// microsOrNil stores an optional time as microseconds, or NULL.
func microsOrNil(t *time.Time) any {
	if t == nil {
		return nil
	}
	return t.UnixMicro()
}

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
	return selectAll(ctx, q.db, scanApproval, `SELECT `+approvalColumns+` FROM approvals
		WHERE consumed_at IS NULL AND `+taken+` IS NULL AND `+due+` IS NOT NULL
		  AND `+due+` <= ?1 AND expires_at > ?1
		ORDER BY `+due+` LIMIT ?2`, q.at(now), limit)
}

func (q queries) ApprovalClaimStep(ctx context.Context, id string, step store.ApprovalStep, now *time.Time) (store.Approval, error) {
	due, taken, err := stepColumns(step)
	if err != nil {
		return store.Approval{}, err
	}
	a, err := scanApproval(q.db.QueryRowContext(ctx, `
		UPDATE approvals SET `+taken+` = ?2
		WHERE id = ?1 AND consumed_at IS NULL AND `+taken+` IS NULL AND `+due+` IS NOT NULL
		  AND `+due+` <= ?2 AND expires_at > ?2
		RETURNING `+approvalColumns, id, q.at(now)))
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
		a, err = scanApproval(q.db.QueryRowContext(ctx, `UPDATE approvals SET undecidable_since = ?2
		WHERE id = ?1 AND undecidable_since IS NULL AND consumed_at IS NULL AND expires_at > ?2
		RETURNING `+approvalColumns, id, q.at(now)))
	} else {
		a, err = scanApproval(q.db.QueryRowContext(ctx, `UPDATE approvals SET undecidable_since = NULL
		WHERE id = ?1 AND undecidable_since IS NOT NULL RETURNING `+approvalColumns, id))
	}
	if errors.Is(err, store.ErrNotFound) {
		return store.Approval{}, store.ErrNoMatch
	}
	return a, err
}

func (q queries) ApprovalsUndecidable(ctx context.Context, after store.Cursor, now *time.Time, limit int) ([]store.Approval, error) {
	at, id := beforeCursor(after)
	// The partial index approvals_undecidable holds only these rows, in this order.
	return selectAll(ctx, q.db, scanApproval, `SELECT `+approvalColumns+` FROM approvals
		WHERE consumed_at IS NULL AND undecidable_since IS NOT NULL
		  AND (created_at < ?1 OR (created_at = ?1 AND (?2 = '' OR id < ?2)))
		  AND expires_at > ?3
		ORDER BY created_at DESC, id DESC LIMIT ?4`, at, id, q.at(now), limit)
}

func (q queries) ApprovalsUndecidableCount(ctx context.Context, now *time.Time) (int, error) {
	var n int
	err := q.db.QueryRowContext(ctx, `SELECT count(*) FROM approvals
		WHERE consumed_at IS NULL AND undecidable_since IS NOT NULL AND expires_at > ?`, q.at(now)).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count undecidable approvals: %w", err)
	}
	return n, nil
}

func (q queries) PersonSeenPut(ctx context.Context, p store.PersonSeen) error {
	_, err := q.db.ExecContext(ctx, `INSERT INTO people_seen (subject, roles, seen_at) VALUES (?, ?, ?)
		ON CONFLICT (subject) DO UPDATE SET roles = excluded.roles, seen_at = excluded.seen_at`,
		p.Subject, strings.Join(p.Roles, ","), q.orNow(p.SeenAt))
	if err != nil {
		return fmt.Errorf("record sign-in of %q: %w", p.Subject, err)
	}
	return nil
}

func (q queries) PeopleSeen(ctx context.Context, since time.Time) ([]store.PersonSeen, error) {
	return selectAll(ctx, q.db, func(row scanner) (store.PersonSeen, error) {
		var p store.PersonSeen
		var roles string
		var seen int64
		err := row.Scan(&p.Subject, &roles, &seen)
		p.Roles, p.SeenAt = splitList(roles), fromMicros(seen)
		return p, err
	}, `SELECT subject, roles, seen_at FROM people_seen WHERE seen_at >= ? ORDER BY subject`, since.UnixMicro())
}
