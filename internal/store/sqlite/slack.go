package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

func (q queries) SlackLinkPut(ctx context.Context, l store.SlackLink) error {
	_, err := q.db.ExecContext(ctx, `INSERT INTO slack_links (team_id, user_id, subject, account_id, linked_at, linked_by)
		VALUES (?1, ?2, ?3, nullif(?4, ''), ?5, ?6)
		ON CONFLICT (team_id, user_id) DO UPDATE SET subject = excluded.subject, account_id = excluded.account_id,
			linked_at = excluded.linked_at, linked_by = excluded.linked_by`,
		l.TeamID, l.UserID, l.Subject, l.AccountID, q.orNow(l.LinkedAt), l.LinkedBy)
	if err != nil {
		return fmt.Errorf("link slack user: %w", err)
	}
	return nil
}

func (q queries) SlackLinkGet(ctx context.Context, teamID, userID string) (store.SlackLink, error) {
	l := store.SlackLink{TeamID: teamID, UserID: userID}
	var account sql.NullString
	var linked int64
	err := q.db.QueryRowContext(ctx, `SELECT subject, account_id, linked_at, linked_by FROM slack_links WHERE team_id = ? AND user_id = ?`,
		teamID, userID).Scan(&l.Subject, &account, &linked, &l.LinkedBy)
	if err != nil {
		return store.SlackLink{}, interpret(err)
	}
	l.AccountID, l.LinkedAt = account.String, fromMicros(linked)
	return l, nil
}

func (q queries) SlackLinkDelete(ctx context.Context, teamID, userID string) error {
	res, err := q.db.ExecContext(ctx, `DELETE FROM slack_links WHERE team_id = ? AND user_id = ?`, teamID, userID)
	if err != nil {
		return fmt.Errorf("unlink slack user: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("unlink slack user: %w", err)
	} else if n == 0 {
		return store.ErrNotFound
	}
	return nil
}

func (q queries) SlackCodePut(ctx context.Context, c store.SlackCode) error {
	_, err := q.db.ExecContext(ctx, `INSERT INTO slack_link_codes (code_hash, subject, account_id, expires_at)
		VALUES (?1, ?2, nullif(?3, ''), ?4)
		ON CONFLICT (subject) DO UPDATE SET code_hash = excluded.code_hash, account_id = excluded.account_id,
			expires_at = excluded.expires_at`, c.CodeHash, c.Subject, c.AccountID, c.ExpiresAt.UnixMicro())
	if err != nil {
		return fmt.Errorf("store slack link code: %w", err)
	}
	return nil
}

func (q queries) SlackCodeTake(ctx context.Context, codeHash string, now *time.Time) (store.SlackCode, error) {
	c := store.SlackCode{CodeHash: codeHash}
	var account sql.NullString
	var expires int64
	err := q.db.QueryRowContext(ctx, `DELETE FROM slack_link_codes WHERE code_hash = ? AND expires_at > ?
		RETURNING subject, account_id, expires_at`, codeHash, q.at(now)).Scan(&c.Subject, &account, &expires)
	if err != nil {
		return store.SlackCode{}, interpret(err)
	}
	c.AccountID, c.ExpiresAt = account.String, fromMicros(expires)
	return c, nil
}

func (q queries) SlackRequestSeen(ctx context.Context, sigHash string, seenAt, forgetBefore time.Time) (bool, error) {
	if _, err := q.db.ExecContext(ctx, `DELETE FROM slack_requests_seen WHERE seen_at < ?`, forgetBefore.UnixMicro()); err != nil {
		return false, fmt.Errorf("forget slack requests: %w", err)
	}
	res, err := q.db.ExecContext(ctx, `INSERT INTO slack_requests_seen (sig_hash, seen_at) VALUES (?, ?) ON CONFLICT (sig_hash) DO NOTHING`,
		sigHash, seenAt.UnixMicro())
	if err != nil {
		return false, fmt.Errorf("record slack request: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("record slack request: %w", err)
	}
	return n == 1, nil
}

func (q queries) PersonSeenGet(ctx context.Context, subject string) (store.PersonSeen, error) {
	p := store.PersonSeen{Subject: subject}
	var roles string
	var seen int64
	if err := q.db.QueryRowContext(ctx, `SELECT roles, seen_at FROM people_seen WHERE subject = ?`, subject).Scan(&roles, &seen); err != nil {
		return store.PersonSeen{}, interpret(err)
	}
	p.Roles, p.SeenAt = splitList(roles), fromMicros(seen)
	return p, nil
}
