package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/airlockhq/airlock/internal/store"
)

func (q queries) AlertOutboxTake(ctx context.Context, limit int) ([]store.Event, error) {
	evs, err := selectAll(ctx, q.db, func(row scanner) (store.Event, error) {
		e := store.Event{Kind: string(store.EventAlert)}
		var at int64
		var detail sql.NullString
		if err := row.Scan(&e.ID, &e.RunKey, &at, &detail); err != nil {
			return store.Event{}, err
		}
		e.At, e.Detail = fromMicros(at), optJSON(detail)
		return e, nil
	}, `SELECT event_id, run_key, at, detail FROM alert_outbox ORDER BY event_id LIMIT ?`, limit)
	if err != nil {
		return nil, fmt.Errorf("take alert outbox: %w", err)
	}
	return evs, nil
}

func (q queries) AlertOutboxDelete(ctx context.Context, eventIDs []int64) error {
	if len(eventIDs) == 0 {
		return nil
	}
	args := make([]any, len(eventIDs))
	for i, id := range eventIDs {
		args[i] = id
	}
	marks := strings.TrimSuffix(strings.Repeat("?,", len(eventIDs)), ",")
	if _, err := q.db.ExecContext(ctx, `DELETE FROM alert_outbox WHERE event_id IN (`+marks+`)`, args...); err != nil {
		return fmt.Errorf("delete alert outbox rows: %w", err)
	}
	return nil
}
