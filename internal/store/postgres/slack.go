package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

func (q queries) SlackLinkPut(ctx context.Context, l store.SlackLink) error {
	_, err := q.db.Exec(ctx, `INSERT INTO slack_links (team_id, user_id, subject, account_id, linked_at, linked_by)
		VALUES ($1, $2, $3, nullif($4, ''), coalesce($5, now()), $6)
		ON CONFLICT (team_id, user_id) DO UPDATE SET subject = excluded.subject, account_id = excluded.account_id,
			linked_at = excluded.linked_at, linked_by = excluded.linked_by`,
		l.TeamID, l.UserID, l.Subject, l.AccountID, timeArg(l.LinkedAt), l.LinkedBy)
	if err != nil {
		return fmt.Errorf("link slack user: %w", err)
	}
	return nil
}

func (q queries) SlackLinkGet(ctx context.Context, teamID, userID string) (store.SlackLink, error) {
	l := store.SlackLink{TeamID: teamID, UserID: userID}
	var account *string
	err := q.db.QueryRow(ctx, `SELECT subject, account_id, linked_at, linked_by FROM slack_links WHERE team_id = $1 AND user_id = $2`,
		teamID, userID).Scan(&l.Subject, &account, &l.LinkedAt, &l.LinkedBy)
	if err != nil {
		return store.SlackLink{}, interpret(err)
	}
	if account != nil {
		l.AccountID = *account
	}
	return l, nil
}

func (q queries) SlackLinkDelete(ctx context.Context, teamID, userID string) error {
	tag, err := q.db.Exec(ctx, `DELETE FROM slack_links WHERE team_id = $1 AND user_id = $2`, teamID, userID)
	if err != nil {
		return fmt.Errorf("unlink slack user: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return store.ErrNotFound
	}
	return nil
}

func (q queries) SlackCodePut(ctx context.Context, c store.SlackCode) error {
	_, err := q.db.Exec(ctx, `INSERT INTO slack_link_codes (code_hash, subject, account_id, expires_at)
		VALUES ($1, $2, nullif($3, ''), $4)
		ON CONFLICT (subject) DO UPDATE SET code_hash = excluded.code_hash, account_id = excluded.account_id,
			expires_at = excluded.expires_at`, c.CodeHash, c.Subject, c.AccountID, c.ExpiresAt)
	if err != nil {
		return fmt.Errorf("store slack link code: %w", err)
	}
	return nil
}

func (q queries) SlackCodeTake(ctx context.Context, codeHash string, now *time.Time) (store.SlackCode, error) {
	c := store.SlackCode{CodeHash: codeHash}
	var account *string
	err := q.db.QueryRow(ctx, `DELETE FROM slack_link_codes WHERE code_hash = $1 AND expires_at > coalesce($2::timestamptz, now())
		RETURNING subject, account_id, expires_at`, codeHash, now).Scan(&c.Subject, &account, &c.ExpiresAt)
	if err != nil {
		return store.SlackCode{}, interpret(err)
	}
	if account != nil {
		c.AccountID = *account
	}
	return c, nil
}

func (q queries) SlackRequestSeen(ctx context.Context, sigHash string, seenAt, forgetBefore time.Time) (bool, error) {
	if _, err := q.db.Exec(ctx, `DELETE FROM slack_requests_seen WHERE seen_at < $1`, forgetBefore); err != nil {
		return false, fmt.Errorf("forget slack requests: %w", err)
	}
	tag, err := q.db.Exec(ctx, `INSERT INTO slack_requests_seen (sig_hash, seen_at) VALUES ($1, $2) ON CONFLICT (sig_hash) DO NOTHING`,
		sigHash, seenAt)
	if err != nil {
		return false, fmt.Errorf("record slack request: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

func (q queries) PersonSeenGet(ctx context.Context, subject string) (store.PersonSeen, error) {
	p := store.PersonSeen{Subject: subject}
	var roles string
	if err := q.db.QueryRow(ctx, `SELECT roles, seen_at FROM people_seen WHERE subject = $1`, subject).Scan(&roles, &p.SeenAt); err != nil {
		return store.PersonSeen{}, interpret(err)
	}
	p.Roles = splitList(roles)
	return p, nil
}
