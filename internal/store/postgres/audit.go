package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/airlockhq/airlock/internal/store"
)

// AuditCount counts the window's events by kind and its distinct runs in one scan of
// events_at (index-only: it carries kind and run_key); the grouping set () is the total.
func (q queries) AuditCount(ctx context.Context, since time.Time) (store.AuditCounts, error) {
	out := store.AuditCounts{ByKind: map[string]int64{}}
	sql := `
		SELECT coalesce(kind, ''), GROUPING(kind) = 1, count(*), count(DISTINCT run_key) FILTER (WHERE run_key <> '')
		FROM events WHERE at >= $1 GROUP BY GROUPING SETS ((kind), ())`
	if q.citus {
		// Citus cannot run GROUPING SETS across shards: the two groupings as two
		// aggregates, each run by every shard and summed on the coordinator (the runs are
		// counted by the distribution column, so each shard's distinct count adds up).
		sql = `
		SELECT kind, false, count(*), 0::bigint FROM events WHERE at >= $1 GROUP BY kind
		UNION ALL
		SELECT '', true, 0::bigint, count(DISTINCT run_key) FILTER (WHERE run_key <> '') FROM events WHERE at >= $1`
	}
	rows, err := q.db.Query(ctx, sql, since)
	if err != nil {
		return store.AuditCounts{}, fmt.Errorf("count events: %w", err)
	}
	var kind string
	var total bool
	var n, runs int64
	_, err = pgx.ForEachRow(rows, []any{&kind, &total, &n, &runs}, func() error {
		if total {
			out.Runs = runs
		} else {
			out.ByKind[kind] = n
		}
		return nil
	})
	if err != nil {
		return store.AuditCounts{}, fmt.Errorf("count events: %w", err)
	}
	return out, nil
}

// AuditEvents reads the window's events of some kinds from events_report_kind_at, one
// range of the index per kind, when they are all store.ReportKinds (the report's are: its
// index holds no others); other kinds are read from events_at's window.
func (q queries) AuditEvents(ctx context.Context, since time.Time, kinds []string, fn func(store.Event) error) error {
	rows, err := q.db.Query(ctx, auditEventsSQL(kinds), kinds, since)
	if err != nil {
		return fmt.Errorf("list audit events: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		e, err := scanEvent(rows)
		if err != nil {
			return fmt.Errorf("list audit events: %w", err)
		}
		if err := fn(e); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("list audit events: %w", err)
	}
	return nil
}

// auditEventsSQL is AuditEvents' statement for kinds ($1) since $2.
func auditEventsSQL(kinds []string) string {
	sql := `SELECT ` + eventColumns + ` FROM events WHERE kind = ANY($1) AND at >= $2`
	if store.AreReportKinds(kinds) {
		sql += ` AND ` + store.ReportKindsPredicate()
	}
	return sql
}

// AuditGateWaits reads the approval_decided events from events_report_kind_at; each one's
// request is looked up among its run's events.
func (q queries) AuditGateWaits(ctx context.Context, since time.Time) ([]store.GateWait, error) {
	rows, err := q.db.Query(ctx, `
		SELECT d.run_key, coalesce(d.detail->>'approval_id', ''), coalesce(d.detail->>'decision', ''),
		  (SELECT min(r.at) FROM events r
		   WHERE r.run_key = d.run_key AND r.kind = 'approval_requested'
		     AND r.detail->>'approval_id' = d.detail->>'approval_id'),
		  d.at
		FROM events d
		WHERE d.kind = 'approval_decided' AND d.`+store.ReportKindsPredicate()+` AND d.at >= $1
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
