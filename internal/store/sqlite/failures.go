package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

func (q queries) RunCount(ctx context.Context, p store.RunCountParams) (store.Run, error) {
	return scanRun(q.db.QueryRowContext(ctx, `
		UPDATE workflow_runs
		SET model_calls = min(model_calls + ?3, 2147483647),
		    tokens = CASE WHEN tokens > 9223372036854775807 - ?4 THEN 9223372036854775807 ELSE tokens + ?4 END,
		    validations = validations + ?5,
		    repairs = repairs + ?6, action_type = CASE WHEN action_type = '' THEN ?2 ELSE action_type END
		WHERE idempotency_key = ?1
		RETURNING `+runColumns, p.Key, p.ActionType, p.ModelCalls, p.Tokens, p.Validations, p.Repairs))
}

func (q queries) ValidationInsert(ctx context.Context, v store.Validation) (store.Validation, error) {
	at := q.orNow(v.CreatedAt)
	err := q.db.QueryRowContext(ctx, `
		INSERT INTO validations (idempotency_key, action_type, valid, repaired, output_hash, value, errors, created_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id`, v.RunKey, v.ActionType, v.Valid, v.Repaired, v.OutputHash,
		jsonArg(v.Value), jsonArg(v.Errors), at).Scan(&v.ID)
	if err != nil {
		return store.Validation{}, fmt.Errorf("insert validation: %w", err)
	}
	v.CreatedAt = fromMicros(at)
	return v, nil
}

func (q queries) ValidationLatestValid(ctx context.Context, key, actionType string) (store.Validation, error) {
	var v store.Validation
	var value, errs sql.NullString
	var at int64
	err := q.db.QueryRowContext(ctx, `SELECT id, idempotency_key, action_type, valid, repaired, output_hash, value, errors, created_at
		FROM validations WHERE idempotency_key = ? AND action_type = ? AND valid ORDER BY id DESC LIMIT 1`, key, actionType).
		Scan(&v.ID, &v.RunKey, &v.ActionType, &v.Valid, &v.Repaired, &v.OutputHash, &value, &errs, &at)
	if err != nil {
		return store.Validation{}, interpret(err)
	}
	v.Value, v.Errors, v.CreatedAt = optJSON(value), optJSON(errs), fromMicros(at)
	return v, nil
}

func (q queries) FailureAttempt(ctx context.Context, key, class string) (int, error) {
	var n int
	err := q.db.QueryRowContext(ctx, `
		INSERT INTO run_failures (idempotency_key, class, attempts) VALUES (?, ?, 1)
		ON CONFLICT (idempotency_key, class) DO UPDATE SET attempts = attempts + 1
		RETURNING attempts`, key, class).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count failure: %w", err)
	}
	return n, nil
}

func (q queries) EffectRequeueFailed(ctx context.Context, key string, now *time.Time) ([]store.Effect, error) {
	at := q.at(now)
	return selectAll(ctx, q.db, scanEffect, `
		UPDATE effects SET state = 'pending', not_before = ?2, updated_at = ?2, version = version + 1
		WHERE idempotency_key = ?1 AND state = 'failed' AND executor = 'dispatcher'
		RETURNING `+effectColumns, key, at)
}

func (q queries) ReplacementInsert(ctx context.Context, r store.Replacement) error {
	ids, err := json.Marshal(r.ProviderIDs)
	if err != nil {
		return err
	}
	_, err = q.db.ExecContext(ctx, `INSERT INTO replacements (old_key, new_key, reason, actor, provider_ids, created_at)
		VALUES (?, ?, ?, ?, ?, ?)`, r.OldKey, r.NewKey, r.Reason, r.Actor, string(ids), q.orNow(r.CreatedAt))
	if err != nil {
		return fmt.Errorf("insert replacement: %w", err)
	}
	return nil
}

func (q queries) ReplacementFind(ctx context.Context, key string, byNew bool) (store.Replacement, error) {
	col := "old_key"
	if byNew {
		col = "new_key"
	}
	var r store.Replacement
	var ids string
	var at int64
	err := q.db.QueryRowContext(ctx, `SELECT old_key, new_key, reason, actor, provider_ids, created_at
		FROM replacements WHERE `+col+` = ?1`, key).
		Scan(&r.OldKey, &r.NewKey, &r.Reason, &r.Actor, &ids, &at)
	if err != nil {
		return store.Replacement{}, interpret(err)
	}
	r.CreatedAt = fromMicros(at)
	return r, json.Unmarshal([]byte(ids), &r.ProviderIDs)
}

func (q queries) RunSetReplacedBy(ctx context.Context, key, newKey string) error {
	res, err := q.db.ExecContext(ctx, `UPDATE workflow_runs SET replaced_by = ? WHERE idempotency_key = ?`, newKey, key)
	if err != nil {
		return fmt.Errorf("link replacement: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.ErrNotFound
	}
	return nil
}
