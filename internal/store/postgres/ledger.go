package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

func (q queries) LedgerInsert(ctx context.Context, key string, checkpoint int, doc json.RawMessage, now *time.Time) error {
	tag, err := q.db.Exec(ctx, `INSERT INTO ledgers (idempotency_key, checkpoint_version, document, created_at)
		VALUES ($1, $2, $3::jsonb, airlock_now($4::timestamptz)) ON CONFLICT DO NOTHING`, key, checkpoint, string(doc), now)
	if err != nil {
		return fmt.Errorf("insert ledger: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return store.ErrNoMatch
	}
	return nil
}

func (q queries) LedgerLatest(ctx context.Context, key string) (int, json.RawMessage, error) {
	var v int
	var doc []byte
	err := q.db.QueryRow(ctx, `SELECT checkpoint_version, document FROM ledgers WHERE idempotency_key = $1
		ORDER BY checkpoint_version DESC LIMIT 1`, key).Scan(&v, &doc)
	if err != nil {
		return 0, nil, interpret(err)
	}
	return v, json.RawMessage(doc), nil
}

func (q queries) EffectByRunEffectID(ctx context.Context, key, effectID string) (store.Effect, error) {
	return scanEffect(q.db.QueryRow(ctx, `SELECT `+effectColumns+` FROM effects WHERE idempotency_key = $1 AND effect_id = $2`, key, effectID))
}
