package postgres

import (
	"context"
	"fmt"

	"github.com/airlockhq/airlock/internal/store"
)

// purgeStatements name what expires and how: each is a WHERE clause, run as a count (dry)
// or as the change. $1 is the payload cutoff, $2 the event cutoff, $3 now.
var purgeStatements = []struct{ kind, table, set, where string }{
	{"effect_payloads", "effects", "payload = NULL", "payload IS NOT NULL AND state IN ('completed', 'cancelled', 'failed') AND updated_at < $1"},
	{"approval_payloads", "approvals", "payload = NULL", "payload IS NOT NULL AND consumed_at IS NOT NULL AND consumed_at < $1"},
	{"validated_values", "validations", "value = NULL", "value IS NOT NULL AND created_at < $1"},
	{"run_results", "workflow_runs", "result = NULL", "result IS NOT NULL AND state IN ('completed', 'failed_terminal', 'rejected') AND updated_at < $1"},
	{"ledgers", "ledgers", "", "idempotency_key IN (SELECT idempotency_key FROM workflow_runs WHERE state IN ('completed', 'failed_terminal', 'rejected') AND updated_at < $1)"},
	{"events", "events", "", "at < $2"},
	{"sessions", "sessions", "", "expires_at < $3"},
	{"signin_throttle", "signin_throttle", "", "next_at < $3 AND updated_at < $3::timestamptz - interval '1 day'"},
	{"replays", "replays", "", "expires_at < $3"},
}

func (q queries) Purge(ctx context.Context, p store.PurgeParams) (store.PurgeCounts, error) {
	out := store.PurgeCounts{}
	for _, st := range purgeStatements {
		// Each statement names all three parameters so their types are always known.
		where := st.where + " AND $1::timestamptz IS NOT NULL AND $2::timestamptz IS NOT NULL AND $3::timestamptz IS NOT NULL"
		if p.DryRun {
			var n int64
			if err := q.db.QueryRow(ctx, `SELECT count(*) FROM `+st.table+` WHERE `+where, p.PayloadsBefore, p.EventsBefore, p.Now).Scan(&n); err != nil {
				return nil, fmt.Errorf("count %s: %w", st.kind, err)
			}
			out[st.kind] = n
			continue
		}
		sql := `DELETE FROM ` + st.table + ` WHERE ` + where
		if st.set != "" {
			sql = `UPDATE ` + st.table + ` SET ` + st.set + ` WHERE ` + where
		}
		tag, err := q.db.Exec(ctx, sql, p.PayloadsBefore, p.EventsBefore, p.Now)
		if err != nil {
			return nil, fmt.Errorf("purge %s: %w", st.kind, err)
		}
		out[st.kind] = tag.RowsAffected()
	}
	return out, nil
}
