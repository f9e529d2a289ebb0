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

func (q queries) UserInsert(ctx context.Context, u store.User) error {
	_, err := q.db.Exec(ctx, `INSERT INTO users (id, name, password_hash, roles, created_at) VALUES ($1, $2, $3, $4, coalesce($5, now()))`,
		u.ID, u.Name, u.PasswordHash, strings.Join(u.Roles, ","), timeArg(u.CreatedAt))
	if err != nil {
		return fmt.Errorf("insert user: %w", err)
	}
	return nil
}

func (q queries) UserByName(ctx context.Context, name string) (store.User, error) {
	var u store.User
	var roles string
	err := q.db.QueryRow(ctx, `SELECT id, name, password_hash, roles, created_at, disabled_at FROM users WHERE name = $1`, name).
		Scan(&u.ID, &u.Name, &u.PasswordHash, &roles, &u.CreatedAt, &u.DisabledAt)
	if err != nil {
		return store.User{}, interpret(err)
	}
	u.Roles = splitList(roles)
	return u, nil
}

func splitList(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func (q queries) SessionInsert(ctx context.Context, s store.Session) error {
	_, err := q.db.Exec(ctx, `INSERT INTO sessions (id_hash, user_id, subject, roles, created_at, last_seen_at, expires_at)
		VALUES ($1, nullif($2, ''), $3, $4, $5, $5, $6)`, s.IDHash, s.UserID, s.Subject, strings.Join(s.Roles, ","), s.CreatedAt, s.ExpiresAt)
	if err != nil {
		return fmt.Errorf("insert session: %w", err)
	}
	return nil
}

func (q queries) SessionTouch(ctx context.Context, idHash string, idle time.Duration, now *time.Time) (store.Session, error) {
	var s store.Session
	var roles string
	err := q.db.QueryRow(ctx, `
		UPDATE sessions SET last_seen_at = airlock_now($3::timestamptz)
		WHERE id_hash = $1 AND expires_at > airlock_now($3::timestamptz)
		  AND last_seen_at + $2::bigint * interval '1 microsecond' > airlock_now($3::timestamptz)
		RETURNING id_hash, coalesce(user_id, ''), subject, roles, created_at, last_seen_at, expires_at`, idHash, micros(idle), now).
		Scan(&s.IDHash, &s.UserID, &s.Subject, &roles, &s.CreatedAt, &s.LastSeenAt, &s.ExpiresAt)
	if err != nil {
		return store.Session{}, interpret(err)
	}
	s.Roles = splitList(roles)
	return s, nil
}

func (q queries) SessionDelete(ctx context.Context, idHash string) error {
	_, err := q.db.Exec(ctx, `DELETE FROM sessions WHERE id_hash = $1`, idHash)
	return err
}

const approvalColumns = `id, idempotency_key, token_hash, mode, allowed_decisions, expires_at, consumed_at,
	coalesce(decision, ''), coalesce(approver_subject, ''), coalesce(reason, ''), requested_by, approver_roles,
	approver_subjects, separation_of_duties, action_type, target, effect_id, executor, payload, payload_hash, created_at, requesters,
	warn_at, warned_at, escalate_at, escalated_at, escalation_roles, undecidable_since`

func scanApproval(row pgx.Row) (store.Approval, error) {
	var a store.Approval
	var allowed, roles, subjects, requesters, escalation string
	var payload []byte
	err := row.Scan(&a.ID, &a.RunKey, &a.TokenHash, &a.Mode, &allowed, &a.ExpiresAt, &a.ConsumedAt, &a.Decision,
		&a.ApproverSubject, &a.Reason, &a.RequestedBy, &roles, &subjects, &a.SeparationOfDuties, &a.ActionType,
		&a.Target, &a.EffectID, &a.Executor, &payload, &a.PayloadHash, &a.CreatedAt, &requesters,
		&a.WarnAt, &a.WarnedAt, &a.EscalateAt, &a.EscalatedAt, &escalation, &a.UndecidableSince)
	if err != nil {
		return store.Approval{}, interpret(err)
	}
	a.AllowedDecisions, a.ApproverRoles, a.ApproverSubjects = splitList(allowed), splitList(roles), splitList(subjects)
	a.EscalationRoles = splitList(escalation)
	if a.Requesters, err = store.DecodeList(requesters); err != nil {
		return store.Approval{}, err
	}
	a.Payload = rawOrNil(payload)
	return a, nil
}

func (q queries) ApprovalInsert(ctx context.Context, a store.Approval) error {
	_, err := q.db.Exec(ctx, `INSERT INTO approvals (id, idempotency_key, token_hash, mode, allowed_decisions, expires_at,
		  requested_by, approver_roles, approver_subjects, separation_of_duties, action_type, target, effect_id, executor,
		  payload, payload_hash, created_at, requesters, warn_at, escalate_at, escalation_roles, undecidable_since)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15::jsonb, $16, coalesce($17, now()), $18,
		  $19, $20, $21, $22)`,
		a.ID, a.RunKey, a.TokenHash, a.Mode, strings.Join(a.AllowedDecisions, ","), a.ExpiresAt, a.RequestedBy,
		strings.Join(a.ApproverRoles, ","), strings.Join(a.ApproverSubjects, ","), a.SeparationOfDuties, a.ActionType,
		a.Target, a.EffectID, a.Executor, jsonArg(a.Payload), a.PayloadHash, timeArg(a.CreatedAt), store.EncodeList(a.Requesters),
		a.WarnAt, a.EscalateAt, strings.Join(a.EscalationRoles, ","), a.UndecidableSince)
	if err != nil {
		return fmt.Errorf("insert approval: %w", err)
	}
	return nil
}

func (q queries) ApprovalByTokenHash(ctx context.Context, tokenHash string) (store.Approval, error) {
	return scanApproval(q.db.QueryRow(ctx, `SELECT `+approvalColumns+` FROM approvals WHERE token_hash = $1`, tokenHash))
}

func (q queries) ApprovalsByRun(ctx context.Context, key string) ([]store.Approval, error) {
	rows, err := q.db.Query(ctx, `SELECT `+approvalColumns+` FROM approvals WHERE idempotency_key = $1 ORDER BY created_at, id`, key)
	if err != nil {
		return nil, fmt.Errorf("list approvals: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Approval, error) { return scanApproval(row) })
}

func (q queries) ApprovalConsume(ctx context.Context, p store.ApprovalConsumeParams) (store.Approval, error) {
	a, err := scanApproval(q.db.QueryRow(ctx, `
		UPDATE approvals
		SET consumed_at = airlock_now($5::timestamptz), decision = $2, approver_subject = $3, reason = $4
		WHERE token_hash = $1
		  AND consumed_at IS NULL
		  AND expires_at > airlock_now($5::timestamptz)
		  AND $2 = ANY (string_to_array(allowed_decisions, ','))
		RETURNING `+approvalColumns, p.TokenHash, p.Decision, p.Subject, p.Reason, p.Now))
	if errors.Is(err, store.ErrNotFound) {
		return store.Approval{}, store.ErrNoMatch
	}
	return a, err
}

func (q queries) ApprovalsExpired(ctx context.Context, now *time.Time, limit int) ([]store.Approval, error) {
	rows, err := q.db.Query(ctx, `SELECT `+approvalColumns+` FROM approvals
		WHERE consumed_at IS NULL AND expires_at <= airlock_now($1::timestamptz) ORDER BY expires_at LIMIT $2`, now, limit)
	if err != nil {
		return nil, fmt.Errorf("list expired approvals: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Approval, error) { return scanApproval(row) })
}

func (q queries) ApprovalExpire(ctx context.Context, id string, now *time.Time) (store.Approval, error) {
	a, err := scanApproval(q.db.QueryRow(ctx, `
		UPDATE approvals SET consumed_at = airlock_now($2::timestamptz), decision = 'expired'
		WHERE id = $1 AND consumed_at IS NULL AND expires_at <= airlock_now($2::timestamptz)
		RETURNING `+approvalColumns, id, now))
	if errors.Is(err, store.ErrNotFound) {
		return store.Approval{}, store.ErrNoMatch
	}
	return a, err
}

func (q queries) ApprovalRekey(ctx context.Context, id, tokenHash string, now *time.Time) (store.Approval, error) {
	a, err := scanApproval(q.db.QueryRow(ctx, `
		UPDATE approvals SET token_hash = $2
		WHERE id = $1 AND consumed_at IS NULL AND expires_at > airlock_now($3::timestamptz)
		RETURNING `+approvalColumns, id, tokenHash, now))
	if errors.Is(err, store.ErrNotFound) {
		return store.Approval{}, store.ErrNoMatch
	}
	return a, err
}

func (q queries) RunSetState(ctx context.Context, p store.RunSetStateParams) (store.Run, error) {
	return noMatch(scanRun(q.db.QueryRow(ctx, `
		UPDATE workflow_runs
		SET state = $3, version = version + 1, result = coalesce($4::jsonb, result), park_reason = $5,
		    lease_expires_at = NULL, updated_at = airlock_now($6::timestamptz)
		WHERE idempotency_key = $1 AND state = $2
		RETURNING `+runColumns, p.Key, string(p.From), string(p.To), jsonArg(p.Result), p.ParkReason, p.Now)))
}

func (q queries) ApprovalByID(ctx context.Context, id string) (store.Approval, error) {
	return scanApproval(q.db.QueryRow(ctx, `SELECT `+approvalColumns+` FROM approvals WHERE id = $1`, id))
}

func (q queries) ApprovalsOpen(ctx context.Context, mode string, limit int) ([]store.Approval, error) {
	rows, err := q.db.Query(ctx, `SELECT `+approvalColumns+` FROM approvals
		WHERE consumed_at IS NULL AND mode = $1 ORDER BY created_at, id LIMIT $2`, mode, limit)
	if err != nil {
		return nil, fmt.Errorf("list open approvals: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Approval, error) { return scanApproval(row) })
}
