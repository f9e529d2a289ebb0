package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/airlockhq/airlock/internal/store"
)

const replayColumns = `api_key_id, route, idem_key, request_hash, attempt, done, status, response, created_at, expires_at`

func scanReplay(row scanner) (store.Replay, error) {
	var r store.Replay
	var created, expires int64
	err := row.Scan(&r.APIKeyID, &r.Route, &r.Key, &r.RequestHash, &r.Attempt, &r.Done, &r.Status, &r.Response, &created, &expires)
	if errors.Is(err, sql.ErrNoRows) {
		return store.Replay{}, store.ErrNotFound
	}
	r.CreatedAt, r.ExpiresAt = fromMicros(created), fromMicros(expires)
	return r, err
}

func (q queries) ReplayBegin(ctx context.Context, p store.ReplayBeginParams) (store.Replay, error) {
	now := q.at(p.Now)
	for range 3 {
		// The record is taken when new, expired, or in flight too long with the same
		// request (its request died); otherwise the existing one is read.
		r, err := scanReplay(q.db.QueryRowContext(ctx, `
			INSERT INTO replays AS r (`+replayColumns+`)
			VALUES (?1, ?2, ?3, ?4, ?5, 0, 0, NULL, ?6, ?6 + ?7)
			ON CONFLICT (api_key_id, route, idem_key) DO UPDATE
			SET request_hash = excluded.request_hash, attempt = excluded.attempt, done = 0,
			    status = 0, response = NULL, created_at = excluded.created_at, expires_at = excluded.expires_at
			WHERE r.expires_at <= excluded.created_at
			   OR (NOT r.done AND r.request_hash = excluded.request_hash
			       AND r.created_at <= excluded.created_at - ?8)
			RETURNING `+replayColumns,
			p.APIKeyID, p.Route, p.Key, p.RequestHash, p.Attempt, now, p.TTL.Microseconds(), p.StaleAfter.Microseconds()))
		if !errors.Is(err, store.ErrNotFound) {
			return r, err
		}
		r, err = scanReplay(q.db.QueryRowContext(ctx, `SELECT `+replayColumns+` FROM replays
			WHERE api_key_id = ?1 AND route = ?2 AND idem_key = ?3`, p.APIKeyID, p.Route, p.Key))
		if !errors.Is(err, store.ErrNotFound) {
			return r, err
		}
	}
	return store.Replay{}, fmt.Errorf("begin replay: the record keeps changing")
}

func (q queries) ReplayFinish(ctx context.Context, s store.ReplayScope, attempt string, status int, response []byte) error {
	res, err := q.db.ExecContext(ctx, `UPDATE replays SET done = 1, status = ?5, response = ?6
		WHERE api_key_id = ?1 AND route = ?2 AND idem_key = ?3 AND attempt = ?4 AND NOT done`,
		s.APIKeyID, s.Route, s.Key, attempt, status, response)
	if err != nil {
		return fmt.Errorf("finish replay: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.ErrNoMatch
	}
	return nil
}

func (q queries) ReplayAbandon(ctx context.Context, s store.ReplayScope, attempt string) error {
	_, err := q.db.ExecContext(ctx, `DELETE FROM replays
		WHERE api_key_id = ?1 AND route = ?2 AND idem_key = ?3 AND attempt = ?4 AND NOT done`,
		s.APIKeyID, s.Route, s.Key, attempt)
	if err != nil {
		return fmt.Errorf("abandon replay: %w", err)
	}
	return nil
}
