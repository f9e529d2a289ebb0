package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

const replayColumns = `api_key_id, route, idem_key, request_hash, status, response, created_at, expires_at`

func (q queries) ReplayLock(ctx context.Context, s store.ReplayScope) (bool, error) {
	var ok bool
	err := q.db.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))`,
		"replay\x1f"+s.APIKeyID+"\x1f"+s.Route+"\x1f"+s.Key).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("lock replay: %w", err)
	}
	return ok, nil
}

func (q queries) ReplayGet(ctx context.Context, s store.ReplayScope, now *time.Time) (store.Replay, error) {
	var r store.Replay
	err := q.db.QueryRow(ctx, `SELECT `+replayColumns+` FROM replays
		WHERE api_key_id = $1 AND route = $2 AND idem_key = $3 AND expires_at > coalesce($4::timestamptz, now())`,
		s.APIKeyID, s.Route, s.Key, now).Scan(&r.APIKeyID, &r.Route, &r.Key, &r.RequestHash, &r.Status, &r.Response, &r.CreatedAt, &r.ExpiresAt)
	return r, interpret(err)
}

func (q queries) ReplayInsert(ctx context.Context, r store.Replay, ttl time.Duration, now *time.Time) error {
	tag, err := q.db.Exec(ctx, `
		INSERT INTO replays AS r (`+replayColumns+`)
		VALUES ($1, $2, $3, $4, $5, $6, coalesce($7::timestamptz, now()),
		        coalesce($7::timestamptz, now()) + $8::bigint * interval '1 microsecond')
		ON CONFLICT (api_key_id, route, idem_key) DO UPDATE
		SET request_hash = EXCLUDED.request_hash, status = EXCLUDED.status, response = EXCLUDED.response,
		    created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at
		WHERE r.expires_at <= EXCLUDED.created_at`,
		r.APIKeyID, r.Route, r.Key, r.RequestHash, r.Status, r.Response, now, micros(ttl))
	if err != nil {
		return fmt.Errorf("record replay: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return store.ErrNoMatch
	}
	return nil
}
