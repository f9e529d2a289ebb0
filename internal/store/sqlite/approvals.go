package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

func splitList(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func (q queries) UserInsert(ctx context.Context, u store.User) error {
	_, err := q.db.ExecContext(ctx, `INSERT INTO users (id, name, password_hash, roles, created_at) VALUES (?, ?, ?, ?, ?)`,
		u.ID, u.Name, u.PasswordHash, strings.Join(u.Roles, ","), q.orNow(u.CreatedAt))
	if err != nil {
		return fmt.Errorf("insert user: %w", err)
	}
	return nil
}

func (q queries) UserByName(ctx context.Context, name string) (store.User, error) {
	var u store.User
	var roles string
	var created int64
	var disabled sql.NullInt64
	err := q.db.QueryRowContext(ctx, `SELECT id, name, password_hash, roles, created_at, disabled_at FROM users WHERE name = ?`, name).
		Scan(&u.ID, &u.Name, &u.PasswordHash, &roles, &created, &disabled)
	if err != nil {
		return store.User{}, interpret(err)
	}
	u.Roles, u.CreatedAt, u.DisabledAt = splitList(roles), fromMicros(created), optTime(disabled)
	return u, nil
}

func (q queries) SessionInsert(ctx context.Context, s store.Session) error {
	_, err := q.db.ExecContext(ctx, `INSERT INTO sessions (id_hash, user_id, subject, roles, created_at, last_seen_at, expires_at)
		VALUES (?1, nullif(?2, ''), ?3, ?4, ?5, ?5, ?6)`, s.IDHash, s.UserID, s.Subject, strings.Join(s.Roles, ","), s.CreatedAt.UnixMicro(), s.ExpiresAt.UnixMicro())
	if err != nil {
		return fmt.Errorf("insert session: %w", err)
	}
	return nil
}

func (q queries) SessionTouch(ctx context.Context, idHash string, idle time.Duration, now *time.Time) (store.Session, error) {
	var s store.Session
	var roles string
	var created, seen, expires int64
	err := q.db.QueryRowContext(ctx, `
		UPDATE sessions SET last_seen_at = ?3
		WHERE id_hash = ?1 AND expires_at > ?3 AND last_seen_at + ?2 > ?3
		RETURNING id_hash, coalesce(user_id, ''), subject, roles, created_at, last_seen_at, expires_at`, idHash, idle.Microseconds(), q.at(now)).
		Scan(&s.IDHash, &s.UserID, &s.Subject, &roles, &created, &seen, &expires)
	if err != nil {
		return store.Session{}, interpret(err)
	}
	s.Roles, s.CreatedAt, s.LastSeenAt, s.ExpiresAt = splitList(roles), fromMicros(created), fromMicros(seen), fromMicros(expires)
	return s, nil
}

func (q queries) SessionDelete(ctx context.Context, idHash string) error {
	_, err := q.db.ExecContext(ctx, `DELETE FROM sessions WHERE id_hash = ?`, idHash)
	return err
}

const approvalColumns = `id, idempotency_key, token_hash, mode, allowed_decisions, expires_at, consumed_at,
	coalesce(decision, ''), coalesce(approver_subject, ''), coalesce(reason, ''), requested_by, approver_roles,
	approver_subjects, separation_of_duties, action_type, target, effect_id, executor, payload, payload_hash, created_at, requesters,
	warn_at, warned_at, escalate_at, escalated_at, escalation_roles, undecidable_since`

func scanApproval(row scanner) (store.Approval, error) {
	var a store.Approval
	var allowed, roles, subjects, requesters, escalation string
	var payload sql.NullString
	var expires, created int64
	var consumed, warnAt, warned, escalateAt, escalated, undecidable sql.NullInt64
	err := row.Scan(&a.ID, &a.RunKey, &a.TokenHash, &a.Mode, &allowed, &expires, &consumed, &a.Decision,
		&a.ApproverSubject, &a.Reason, &a.RequestedBy, &roles, &subjects, &a.SeparationOfDuties, &a.ActionType,
		&a.Target, &a.EffectID, &a.Executor, &payload, &a.PayloadHash, &created, &requesters,
		&warnAt, &warned, &escalateAt, &escalated, &escalation, &undecidable)
	if err != nil {
		return store.Approval{}, interpret(err)
	}
	a.AllowedDecisions, a.ApproverRoles, a.ApproverSubjects = splitList(allowed), splitList(roles), splitList(subjects)
	a.WarnAt, a.WarnedAt, a.EscalateAt, a.EscalatedAt = optTime(warnAt), optTime(warned), optTime(escalateAt), optTime(escalated)
	a.EscalationRoles, a.UndecidableSince = splitList(escalation), optTime(undecidable)
	if a.Requesters, err = store.DecodeList(requesters); err != nil {
		return store.Approval{}, err
	}
	a.Payload, a.ExpiresAt, a.ConsumedAt, a.CreatedAt = optJSON(payload), fromMicros(expires), optTime(consumed), fromMicros(created)
	return a, nil
}

func (q queries) ApprovalInsert(ctx context.Context, a store.Approval) error {
	_, err := q.db.ExecContext(ctx, `INSERT INTO approvals (id, idempotency_key, token_hash, mode, allowed_decisions, expires_at,
		  requested_by, approver_roles, approver_subjects, separation_of_duties, action_type, target, effect_id, executor,
		  payload, payload_hash, created_at, requesters, warn_at, escalate_at, escalation_roles, undecidable_since)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		a.ID, a.RunKey, a.TokenHash, a.Mode, strings.Join(a.AllowedDecisions, ","), a.ExpiresAt.UnixMicro(), a.RequestedBy,
		strings.Join(a.ApproverRoles, ","), strings.Join(a.ApproverSubjects, ","), a.SeparationOfDuties, a.ActionType,
		a.Target, a.EffectID, a.Executor, jsonArg(a.Payload), a.PayloadHash, q.orNow(a.CreatedAt), store.EncodeList(a.Requesters),
		microsOrNil(a.WarnAt), microsOrNil(a.EscalateAt), strings.Join(a.EscalationRoles, ","), microsOrNil(a.UndecidableSince))
	if err != nil {
		return fmt.Errorf("insert approval: %w", err)
	}
	return nil
}

func (q queries) ApprovalByTokenHash(ctx context.Context, tokenHash string) (store.Approval, error) {
	return scanApproval(q.db.QueryRowContext(ctx, `SELECT `+approvalColumns+` FROM approvals WHERE token_hash = ?`, tokenHash))
}

func (q queries) ApprovalsByRun(ctx context.Context, key string) ([]store.Approval, error) {
	return selectAll(ctx, q.db, scanApproval, `SELECT `+approvalColumns+` FROM approvals WHERE idempotency_key = ? ORDER BY created_at, id`, key)
}

func (q queries) ApprovalConsume(ctx context.Context, p store.ApprovalConsumeParams) (store.Approval, error) {
	a, err := scanApproval(q.db.QueryRowContext(ctx, `
		UPDATE approvals
		SET consumed_at = ?5, decision = ?2, approver_subject = ?3, reason = ?4
		WHERE token_hash = ?1
		  AND consumed_at IS NULL
		  AND expires_at > ?5
		  AND instr(',' || allowed_decisions || ',', ',' || ?2 || ',') > 0
		RETURNING `+approvalColumns, p.TokenHash, p.Decision, p.Subject, p.Reason, q.at(p.Now)))
	if errors.Is(err, store.ErrNotFound) {
		return store.Approval{}, store.ErrNoMatch
	}
	return a, err
}

func (q queries) ApprovalsExpired(ctx context.Context, now *time.Time, limit int) ([]store.Approval, error) {
	return selectAll(ctx, q.db, scanApproval, `SELECT `+approvalColumns+` FROM approvals
		WHERE consumed_at IS NULL AND expires_at <= ? ORDER BY expires_at LIMIT ?`, q.at(now), limit)
}

func (q queries) ApprovalExpire(ctx context.Context, id string, now *time.Time) (store.Approval, error) {
	a, err := scanApproval(q.db.QueryRowContext(ctx, `
		UPDATE approvals SET consumed_at = ?2, decision = 'expired'
		WHERE id = ?1 AND consumed_at IS NULL AND expires_at <= ?2
		RETURNING `+approvalColumns, id, q.at(now)))
	if errors.Is(err, store.ErrNotFound) {
		return store.Approval{}, store.ErrNoMatch
	}
	return a, err
}

func (q queries) ApprovalRekey(ctx context.Context, id, tokenHash string, now *time.Time) (store.Approval, error) {
	a, err := scanApproval(q.db.QueryRowContext(ctx, `
		UPDATE approvals SET token_hash = ?2
		WHERE id = ?1 AND consumed_at IS NULL AND expires_at > ?3
		RETURNING `+approvalColumns, id, tokenHash, q.at(now)))
	if errors.Is(err, store.ErrNotFound) {
		return store.Approval{}, store.ErrNoMatch
	}
	return a, err
}

func (q queries) RunSetState(ctx context.Context, p store.RunSetStateParams) (store.Run, error) {
	return noMatch(scanRun(q.db.QueryRowContext(ctx, `
		UPDATE workflow_runs
		SET state = ?3, version = version + 1, result = coalesce(?4, result), park_reason = ?5,
		    lease_expires_at = NULL, updated_at = ?6
		WHERE idempotency_key = ?1 AND state = ?2
		RETURNING `+runColumns, p.Key, string(p.From), string(p.To), jsonArg(p.Result), p.ParkReason, q.at(p.Now))))
}

func (q queries) ApprovalByID(ctx context.Context, id string) (store.Approval, error) {
	return scanApproval(q.db.QueryRowContext(ctx, `SELECT `+approvalColumns+` FROM approvals WHERE id = ?`, id))
}

func (q queries) ApprovalsOpen(ctx context.Context, mode string, limit int) ([]store.Approval, error) {
	return selectAll(ctx, q.db, scanApproval, `SELECT `+approvalColumns+` FROM approvals
		WHERE consumed_at IS NULL AND mode = ? ORDER BY created_at, id LIMIT ?`, mode, limit)
}
