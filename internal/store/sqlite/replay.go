package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

const replayColumns = `api_key_id, route, idem_key, request_hash, status, response, created_at, expires_at`

// ReplayLock: a write transaction here already excludes every other, in this process
// (writeMu) and in others (the file's write lock).
func (q queries) ReplayLock(ctx context.Context, s store.ReplayScope) (bool, error) {
	return true, nil
}

func (q queries) ReplayGet(ctx context.Context, s store.ReplayScope, now *time.Time) (store.Replay, error) {
	var r store.Replay
	var created, expires int64
	err := q.db.QueryRowContext(ctx, `SELECT `+replayColumns+` FROM replays
		WHERE api_key_id = ?1 AND route = ?2 AND idem_key = ?3 AND expires_at > ?4`,
		s.APIKeyID, s.Route, s.Key, q.at(now)).Scan(&r.APIKeyID, &r.Route, &r.Key, &r.RequestHash, &r.Status, &r.Response, &created, &expires)
	if errors.Is(err, sql.ErrNoRows) {
		return store.Replay{}, store.ErrNotFound
	}
	r.CreatedAt, r.ExpiresAt = fromMicros(created), fromMicros(expires)
	return r, err
}

func (q queries) ReplayInsert(ctx context.Context, r store.Replay, ttl time.Duration, now *time.Time) error {
	at := q.at(now)
	res, err := q.db.ExecContext(ctx, `
		INSERT INTO replays AS r (`+replayColumns+`)
		VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7 + ?8)
		ON CONFLICT (api_key_id, route, idem_key) DO UPDATE
		SET request_hash = excluded.request_hash, status = excluded.status, response = excluded.response,
		    created_at = excluded.created_at, expires_at = excluded.expires_at
		WHERE r.expires_at <= excluded.created_at`,
		r.APIKeyID, r.Route, r.Key, r.RequestHash, r.Status, r.Response, at, ttl.Microseconds())
	if err != nil {
		return fmt.Errorf("record replay: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.ErrNoMatch
	}
	return nil
}
