package sqlite

import (
	"context"
	"fmt"

	"github.com/airlockhq/airlock/internal/store"
)

// purgeStatements mirror PostgreSQL's; ?1 is the payload cutoff, ?2 the event cutoff,
// ?3 now, all in microseconds.
var purgeStatements = []struct{ kind, table, set, where string }{
	{"effect_payloads", "effects", "payload = NULL", "payload IS NOT NULL AND state IN ('completed', 'cancelled', 'failed') AND updated_at < ?1"},
	{"approval_payloads", "approvals", "payload = NULL", "payload IS NOT NULL AND consumed_at IS NOT NULL AND consumed_at < ?1"},
	{"validated_values", "validations", "value = NULL", "value IS NOT NULL AND created_at < ?1"},
	{"run_results", "workflow_runs", "result = NULL", "result IS NOT NULL AND state IN ('completed', 'failed_terminal', 'rejected') AND updated_at < ?1"},
	{"ledgers", "ledgers", "", "idempotency_key IN (SELECT idempotency_key FROM workflow_runs WHERE state IN ('completed', 'failed_terminal', 'rejected') AND updated_at < ?1)"},
	{"events", "events", "", "at < ?2"},
	{"sessions", "sessions", "", "expires_at < ?3"},
	{"signin_throttle", "signin_throttle", "", "next_at < ?3 AND updated_at < ?3 - 86400000000"},
	{"replays", "replays", "", "expires_at < ?3"},
}

func (q queries) Purge(ctx context.Context, p store.PurgeParams) (store.PurgeCounts, error) {
	out := store.PurgeCounts{}
	args := []any{p.PayloadsBefore.UnixMicro(), p.EventsBefore.UnixMicro(), p.Now.UnixMicro()}
	for _, st := range purgeStatements {
		where := st.where + " AND ?1 IS NOT NULL AND ?2 IS NOT NULL AND ?3 IS NOT NULL"
		if p.DryRun {
			var n int64
			if err := q.db.QueryRowContext(ctx, `SELECT count(*) FROM `+st.table+` WHERE `+where, args...).Scan(&n); err != nil {
				return nil, fmt.Errorf("count %s: %w", st.kind, err)
			}
			out[st.kind] = n
			continue
		}
		sql := `DELETE FROM ` + st.table + ` WHERE ` + where
		if st.set != "" {
			sql = `UPDATE ` + st.table + ` SET ` + st.set + ` WHERE ` + where
		}
		res, err := q.db.ExecContext(ctx, sql, args...)
		if err != nil {
			return nil, fmt.Errorf("purge %s: %w", st.kind, err)
		}
		n, _ := res.RowsAffected()
		out[st.kind] = n
	}
	return out, nil
}
