package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/airlockhq/airlock/internal/store"
)

func (q queries) AuditCount(ctx context.Context, since time.Time) (store.AuditCounts, error) {
	out := store.AuditCounts{ByKind: map[string]int64{}}
	rows, err := q.db.Query(ctx, `SELECT kind, count(*) FROM events WHERE at >= $1 GROUP BY kind`, since)
	if err != nil {
		return store.AuditCounts{}, fmt.Errorf("count events: %w", err)
	}
	counts, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (struct {
		kind string
		n    int64
	}, error) {
		var c struct {
			kind string
			n    int64
		}
		err := row.Scan(&c.kind, &c.n)
		return c, err
	})
	if err != nil {
		return store.AuditCounts{}, fmt.Errorf("count events: %w", err)
	}
	for _, c := range counts {
		out.ByKind[c.kind] = c.n
	}
	err = q.db.QueryRow(ctx, `SELECT count(DISTINCT run_key) FROM events WHERE at >= $1 AND run_key <> ''`, since).Scan(&out.Runs)
	if err != nil {
		return store.AuditCounts{}, fmt.Errorf("count runs: %w", err)
	}
	return out, nil
}

func (q queries) AuditEvents(ctx context.Context, p store.AuditEventsParams) ([]store.Event, error) {
	after := p.AfterAt
	if after.IsZero() {
		after = p.Since // (at, id) > (since, 0): at >= since, as ids start at 1
	}
	rows, err := q.db.Query(ctx, `
		SELECT `+eventColumns+` FROM events
		WHERE kind = $1 AND (at, id) > ($2::timestamptz, $3::bigint)
		ORDER BY at, id LIMIT $4`, p.Kind, after, p.AfterID, p.Limit)
	if err != nil {
		return nil, fmt.Errorf("list audit events: %w", err)
	}
	return pgx.CollectRows(rows, scanEvent)
}

func (q queries) AuditGateWaits(ctx context.Context, since time.Time) ([]store.GateWait, error) {
	rows, err := q.db.Query(ctx, `
		SELECT d.run_key, coalesce(d.detail->>'approval_id', ''), coalesce(d.detail->>'decision', ''),
		  (SELECT min(r.at) FROM events r
		   WHERE r.run_key = d.run_key AND r.kind = 'approval_requested'
		     AND r.detail->>'approval_id' = d.detail->>'approval_id'),
		  d.at
		FROM events d
		WHERE d.kind = 'approval_decided' AND d.at >= $1
		ORDER BY d.id`, since)
	if err != nil {
		return nil, fmt.Errorf("list gate waits: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.GateWait, error) {
		var w store.GateWait
		err := row.Scan(&w.RunKey, &w.ApprovalID, &w.Decision, &w.RequestedAt, &w.DecidedAt)
		return w, err
	})
}
