package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/airlockhq/airlock/internal/store"
)

const replayColumns = `api_key_id, route, idem_key, request_hash, attempt, done, status, response, created_at, expires_at`

func scanReplay(row interface{ Scan(...any) error }) (store.Replay, error) {
	var r store.Replay
	err := row.Scan(&r.APIKeyID, &r.Route, &r.Key, &r.RequestHash, &r.Attempt, &r.Done, &r.Status, &r.Response, &r.CreatedAt, &r.ExpiresAt)
	return r, interpret(err)
}

func (q queries) ReplayBegin(ctx context.Context, p store.ReplayBeginParams) (store.Replay, error) {
	for range 3 {
		// The record is taken when new, expired, or in flight too long with the same
		// request (its request died); otherwise the existing one is read.
		r, err := scanReplay(q.db.QueryRow(ctx, `
			INSERT INTO replays AS r (`+replayColumns+`)
			VALUES ($1, $2, $3, $4, $5, false, 0, NULL, coalesce($6::timestamptz, now()),
			        coalesce($6::timestamptz, now()) + $7::bigint * interval '1 microsecond')
			ON CONFLICT (api_key_id, route, idem_key) DO UPDATE
			SET request_hash = EXCLUDED.request_hash, attempt = EXCLUDED.attempt, done = false,
			    status = 0, response = NULL, created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at
			WHERE r.expires_at <= EXCLUDED.created_at
			   OR (NOT r.done AND r.request_hash = EXCLUDED.request_hash
			       AND r.created_at <= EXCLUDED.created_at - $8::bigint * interval '1 microsecond')
			RETURNING `+replayColumns,
			p.APIKeyID, p.Route, p.Key, p.RequestHash, p.Attempt, p.Now, micros(p.TTL), micros(p.StaleAfter)))
		if !errors.Is(err, store.ErrNotFound) {
			return r, err
		}
		r, err = scanReplay(q.db.QueryRow(ctx, `SELECT `+replayColumns+` FROM replays
			WHERE api_key_id = $1 AND route = $2 AND idem_key = $3`, p.APIKeyID, p.Route, p.Key))
		if !errors.Is(err, store.ErrNotFound) {
			return r, err
		}
		// Deleted (abandoned) between the two statements: try again.
	}
	return store.Replay{}, fmt.Errorf("begin replay: the record keeps changing")
}

func (q queries) ReplayFinish(ctx context.Context, s store.ReplayScope, attempt string, status int, response []byte) error {
	tag, err := q.db.Exec(ctx, `UPDATE replays SET done = true, status = $5, response = $6
		WHERE api_key_id = $1 AND route = $2 AND idem_key = $3 AND attempt = $4 AND NOT done`,
		s.APIKeyID, s.Route, s.Key, attempt, status, response)
	if err != nil {
		return fmt.Errorf("finish replay: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return store.ErrNoMatch
	}
	return nil
}

func (q queries) ReplayAbandon(ctx context.Context, s store.ReplayScope, attempt string) error {
	_, err := q.db.Exec(ctx, `DELETE FROM replays
		WHERE api_key_id = $1 AND route = $2 AND idem_key = $3 AND attempt = $4 AND NOT done`,
		s.APIKeyID, s.Route, s.Key, attempt)
	if err != nil {
		return fmt.Errorf("abandon replay: %w", err)
	}
	return nil
}
