package sqlite

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

func (q queries) LedgerInsert(ctx context.Context, key string, checkpoint int, doc json.RawMessage, now *time.Time) error {
	res, err := q.db.ExecContext(ctx, `INSERT INTO ledgers (idempotency_key, checkpoint_version, document, created_at)
		VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING`, key, checkpoint, string(doc), q.at(now))
	if err != nil {
		return fmt.Errorf("insert ledger: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.ErrNoMatch
	}
	return nil
}

func (q queries) LedgerLatest(ctx context.Context, key string) (int, json.RawMessage, error) {
	var v int
	var doc string
	err := q.db.QueryRowContext(ctx, `SELECT checkpoint_version, document FROM ledgers WHERE idempotency_key = ?
		ORDER BY checkpoint_version DESC LIMIT 1`, key).Scan(&v, &doc)
	if err != nil {
		return 0, nil, interpret(err)
	}
	return v, json.RawMessage(doc), nil
}

func (q queries) EffectByRunEffectID(ctx context.Context, key, effectID string) (store.Effect, error) {
	return scanEffect(q.db.QueryRowContext(ctx, `SELECT `+effectColumns+` FROM effects WHERE idempotency_key = ? AND effect_id = ?`, key, effectID))
}
