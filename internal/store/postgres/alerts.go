package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/airlockhq/airlock/internal/store"
)

func (q queries) AlertOutboxTake(ctx context.Context, limit int) ([]store.Event, error) {
	if q.citus {
		return q.alertOutboxTakeCitus(ctx, limit)
	}
	evs, err := collectAlerts(q.db.Query(ctx, `SELECT event_id, run_key, at, detail FROM alert_outbox
		ORDER BY event_id LIMIT $1 FOR UPDATE SKIP LOCKED`, limit))
	if err != nil {
		return nil, fmt.Errorf("take alert outbox: %w", err)
	}
	return evs, nil
}

func collectAlerts(rows pgx.Rows, err error) ([]store.Event, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Event, error) {
		e := store.Event{Kind: string(store.EventAlert)}
		var detail []byte
		if err := row.Scan(&e.ID, &e.RunKey, &e.At, &detail); err != nil {
			return store.Event{}, err
		}
		e.Detail = detail
		return e, nil
	})
}

func (q queries) AlertOutboxDelete(ctx context.Context, eventIDs []int64) error {
	if len(eventIDs) == 0 {
		return nil
	}
	if _, err := q.db.Exec(ctx, `DELETE FROM alert_outbox WHERE event_id = ANY($1)`, eventIDs); err != nil {
		return fmt.Errorf("delete alert outbox rows: %w", err)
	}
	return nil
}
