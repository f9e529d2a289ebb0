package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

// The report's statements; each reads the window through an index (0010_cost.sql), which
// TestSQLiteHotQueriesUseIndexes checks. The counts name theirs: without statistics
// SQLite would rather read all of events_report_kind_at in kind order than sort the window.
const (
	auditCountSQL = `SELECT kind, count(*) FROM events INDEXED BY events_at WHERE at >= ? GROUP BY kind`
	auditRunsSQL  = `SELECT count(DISTINCT run_key) FROM events INDEXED BY events_at WHERE at >= ? AND run_key <> ''`
	// auditEventsSQL is completed with one ? per kind and the closing parenthesis.
	auditEventsSQL = `SELECT ` + eventColumns + ` FROM events WHERE at >= ? AND kind IN (`
)

// auditGateWaitsSQL reads the approval_decided events from events_report_kind_at.
var auditGateWaitsSQL = `
		SELECT d.run_key, coalesce(json_extract(d.detail, '$.approval_id'), ''),
		  coalesce(json_extract(d.detail, '$.decision'), ''),
		  (SELECT min(r.at) FROM events r
		   WHERE r.run_key = d.run_key AND r.kind = 'approval_requested'
		     AND json_extract(r.detail, '$.approval_id') = json_extract(d.detail, '$.approval_id')),
		  d.at
		FROM events d
		WHERE d.kind = 'approval_decided' AND d.` + store.ReportKindsPredicate() + ` AND d.at >= ?
		ORDER BY d.id`

func (q queries) AuditCount(ctx context.Context, since time.Time) (store.AuditCounts, error) {
	out := store.AuditCounts{ByKind: map[string]int64{}}
	rows, err := q.db.QueryContext(ctx, auditCountSQL, since.UnixMicro())
	if err != nil {
		return store.AuditCounts{}, fmt.Errorf("count events: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var kind string
		var n int64
		if err := rows.Scan(&kind, &n); err != nil {
			return store.AuditCounts{}, fmt.Errorf("count events: %w", err)
		}
		out.ByKind[kind] = n
	}
	if err := rows.Err(); err != nil {
		return store.AuditCounts{}, fmt.Errorf("count events: %w", err)
	}
	err = q.db.QueryRowContext(ctx, auditRunsSQL, since.UnixMicro()).Scan(&out.Runs)
	if err != nil {
		return store.AuditCounts{}, fmt.Errorf("count runs: %w", err)
	}
	return out, nil
}

func (q queries) AuditEvents(ctx context.Context, since time.Time, kinds []string, fn func(store.Event) error) error {
	if len(kinds) == 0 {
		return nil
	}
	args := []any{since.UnixMicro()}
	for _, k := range kinds {
		args = append(args, k)
	}
	rows, err := q.db.QueryContext(ctx, auditEventsFor(kinds), args...)
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

// auditEventsFor is AuditEvents' statement for kinds: through events_report_kind_at when
// they are all store.ReportKinds (the report's are), whose WHERE clause it repeats, since
// SQLite uses a partial index only for a query that names its terms.
func auditEventsFor(kinds []string) string {
	sql := auditEventsSQL + strings.Repeat("?, ", len(kinds)-1) + "?)"
	if store.AreReportKinds(kinds) {
		sql += ` AND ` + store.ReportKindsPredicate()
	}
	return sql
}

func (q queries) AuditGateWaits(ctx context.Context, since time.Time) ([]store.GateWait, error) {
	rows, err := q.db.QueryContext(ctx, auditGateWaitsSQL, since.UnixMicro())
	if err != nil {
		return nil, fmt.Errorf("list gate waits: %w", err)
	}
	defer rows.Close()
	var out []store.GateWait
	for rows.Next() {
		var w store.GateWait
		var requested sql.NullInt64
		var decided int64
		if err := rows.Scan(&w.RunKey, &w.ApprovalID, &w.Decision, &requested, &decided); err != nil {
			return nil, fmt.Errorf("list gate waits: %w", err)
		}
		w.RequestedAt, w.DecidedAt = optTime(requested), fromMicros(decided)
		out = append(out, w)
	}
	return out, rows.Err()
}
