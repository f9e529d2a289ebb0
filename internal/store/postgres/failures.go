package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

func (q queries) RunCount(ctx context.Context, p store.RunCountParams) (store.Run, error) {
	return scanRun(q.db.QueryRow(ctx, `
		UPDATE workflow_runs
		SET model_calls = least(model_calls::bigint + $3, 2147483647),
		    tokens = CASE WHEN tokens > 9223372036854775807 - $4::bigint THEN 9223372036854775807 ELSE tokens + $4 END,
		    validations = validations + $5,
		    repairs = repairs + $6, action_type = CASE WHEN action_type = '' THEN $2 ELSE action_type END
		WHERE idempotency_key = $1
		RETURNING `+runColumns, p.Key, p.ActionType, p.ModelCalls, p.Tokens, p.Validations, p.Repairs))
}

const validationColumns = `id, idempotency_key, action_type, valid, repaired, output_hash, value, errors, created_at`

func (q queries) ValidationInsert(ctx context.Context, v store.Validation) (store.Validation, error) {
	err := q.db.QueryRow(ctx, `
		INSERT INTO validations (idempotency_key, action_type, valid, repaired, output_hash, value, errors, created_at)
		VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7::jsonb, airlock_now($8::timestamptz))
		RETURNING id, created_at`, v.RunKey, v.ActionType, v.Valid, v.Repaired, v.OutputHash,
		jsonArg(v.Value), jsonArg(v.Errors), timeArg(v.CreatedAt)).Scan(&v.ID, &v.CreatedAt)
	if err != nil {
		return store.Validation{}, fmt.Errorf("insert validation: %w", err)
	}
	return v, nil
}

func (q queries) ValidationLatestValid(ctx context.Context, key, actionType string) (store.Validation, error) {
	var v store.Validation
	var value, errs []byte
	err := q.db.QueryRow(ctx, `SELECT `+validationColumns+` FROM validations
		WHERE idempotency_key = $1 AND action_type = $2 AND valid ORDER BY id DESC LIMIT 1`, key, actionType).
		Scan(&v.ID, &v.RunKey, &v.ActionType, &v.Valid, &v.Repaired, &v.OutputHash, &value, &errs, &v.CreatedAt)
	if err != nil {
		return store.Validation{}, interpret(err)
	}
	v.Value, v.Errors = rawOrNil(value), rawOrNil(errs)
	return v, nil
}

func (q queries) FailureAttempt(ctx context.Context, key, class string) (int, error) {
	var n int
	err := q.db.QueryRow(ctx, `
		INSERT INTO run_failures (idempotency_key, class, attempts) VALUES ($1, $2, 1)
		ON CONFLICT (idempotency_key, class) DO UPDATE SET attempts = run_failures.attempts + 1
		RETURNING attempts`, key, class).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count failure: %w", err)
	}
	return n, nil
}

func (q queries) EffectRequeueFailed(ctx context.Context, key string, now *time.Time) ([]store.Effect, error) {
	return collectEffects(q.db.Query(ctx, `
		UPDATE effects SET state = 'pending', not_before = airlock_now($2::timestamptz),
		  updated_at = airlock_now($2::timestamptz), version = version + 1
		WHERE idempotency_key = $1 AND state = 'failed' AND executor = 'dispatcher'
		RETURNING `+effectColumns, key, now))
}

func (q queries) ReplacementInsert(ctx context.Context, r store.Replacement) error {
	ids, err := json.Marshal(r.ProviderIDs)
	if err != nil {
		return err
	}
	_, err = q.db.Exec(ctx, `INSERT INTO replacements (old_key, new_key, reason, actor, provider_ids, created_at)
		VALUES ($1, $2, $3, $4, $5::jsonb, airlock_now($6::timestamptz))`,
		r.OldKey, r.NewKey, r.Reason, r.Actor, string(ids), timeArg(r.CreatedAt))
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
	var ids []byte
	err := q.db.QueryRow(ctx, `SELECT old_key, new_key, reason, actor, provider_ids, created_at
		FROM replacements WHERE `+col+` = $1`, key).
		Scan(&r.OldKey, &r.NewKey, &r.Reason, &r.Actor, &ids, &r.CreatedAt)
	if err != nil {
		return store.Replacement{}, interpret(err)
	}
	return r, json.Unmarshal(ids, &r.ProviderIDs)
}

func (q queries) RunSetReplacedBy(ctx context.Context, key, newKey string) error {
	tag, err := q.db.Exec(ctx, `UPDATE workflow_runs SET replaced_by = $2 WHERE idempotency_key = $1`, key, newKey)
	if err != nil {
		return fmt.Errorf("link replacement: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return store.ErrNotFound
	}
	return nil
}
