package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

func (q queries) AuditCount(ctx context.Context, since time.Time) (store.AuditCounts, error) {
	out := store.AuditCounts{ByKind: map[string]int64{}}
	rows, err := q.db.QueryContext(ctx, `SELECT kind, count(*) FROM events WHERE at >= ? GROUP BY kind`, since.UnixMicro())
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
	err = q.db.QueryRowContext(ctx, `SELECT count(DISTINCT run_key) FROM events WHERE at >= ? AND run_key <> ''`,
		since.UnixMicro()).Scan(&out.Runs)
	if err != nil {
		return store.AuditCounts{}, fmt.Errorf("count runs: %w", err)
	}
	return out, nil
}

func (q queries) AuditEvents(ctx context.Context, p store.AuditEventsParams) ([]store.Event, error) {
	if len(p.Kinds) == 0 {
		return nil, nil
	}
	args := []any{p.Since.UnixMicro(), p.AfterID}
	for _, k := range p.Kinds {
		args = append(args, k)
	}
	args = append(args, p.Limit)
	evs, err := selectAll(ctx, q.db, scanEvent, `
		SELECT `+eventColumns+` FROM events
		WHERE at >= ? AND id > ? AND kind IN (?`+strings.Repeat(", ?", len(p.Kinds)-1)+`)
		ORDER BY id LIMIT ?`, args...)
	if err != nil {
		return nil, fmt.Errorf("list audit events: %w", err)
	}
	return evs, nil
}

func (q queries) AuditGateWaits(ctx context.Context, since time.Time) ([]store.GateWait, error) {
	rows, err := q.db.QueryContext(ctx, `
		SELECT d.run_key, coalesce(json_extract(d.detail, '$.approval_id'), ''),
		  coalesce(json_extract(d.detail, '$.decision'), ''),
		  (SELECT min(r.at) FROM events r
		   WHERE r.run_key = d.run_key AND r.kind = 'approval_requested'
		     AND json_extract(r.detail, '$.approval_id') = json_extract(d.detail, '$.approval_id')),
		  d.at
		FROM events d
		WHERE d.kind = 'approval_decided' AND d.at >= ?
		ORDER BY d.id`, since.UnixMicro())
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
