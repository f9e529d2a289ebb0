package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"time"

	msqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/airlockhq/airlock/internal/store"
)

// purgeStatements mirror PostgreSQL's; ?1 is the payload cutoff, ?2 the event cutoff,
// ?3 now, all in microseconds. Each has an index path (0010_cost.sql); the ledgers' looks
// up each ledger's run by key.
var purgeStatements = []struct{ kind, table, set, where, order string }{
	{"effect_payloads", "effects", "payload = NULL", "payload IS NOT NULL AND state IN ('completed', 'cancelled') AND updated_at < ?1", "updated_at"},
	{"approval_payloads", "approvals", "payload = NULL", "payload IS NOT NULL AND consumed_at IS NOT NULL AND consumed_at < ?1", "consumed_at"},
	{"validated_values", "validations", "value = NULL", "value IS NOT NULL AND created_at < ?1", "created_at"},
	{"run_results", "workflow_runs", "result = NULL", "result IS NOT NULL AND state IN ('completed', 'failed_terminal', 'rejected') AND updated_at < ?1", "updated_at"},
	{"ledgers", "ledgers", "", "(SELECT r.state IN ('completed', 'failed_terminal', 'rejected') AND r.updated_at < ?1 FROM workflow_runs r WHERE r.idempotency_key = ledgers.idempotency_key)", ""},
	{"events", "events", "", "at < ?2", "at"},
	{"sessions", "sessions", "", "expires_at < ?3", "expires_at"},
	{"signin_throttle", "signin_throttle", "", "next_at < ?3 AND updated_at < ?3 - 86400000000", ""},
	{"replays", "replays", "", "expires_at < ?3", ""},
	// People no longer counted as holding a role (store.PeopleSeenHorizon).
	{"people_seen", "people_seen", "", fmt.Sprintf("seen_at < ?3 - %d", store.PeopleSeenHorizon.Microseconds()), ""},
}

func purgeWhere(where string) string {
	return where + " AND ?1 IS NOT NULL AND ?2 IS NOT NULL AND ?3 IS NOT NULL"
}

// purgeBatchSQL changes at most ?4 rows, the first in the index's order from ?5, and
// returns their position: the next batch starts at the last, never walking again over
// what its predecessors removed. Each batch is one statement in autocommit, so the write
// lock is released between batches.
func purgeBatchSQL(table, set, where, order string) string {
	from, returning := ` AND ?5 IS NOT NULL`, `NULL`
	if order != "" {
		from, returning = ` AND `+order+` >= ?5 ORDER BY `+order, order
	}
	batch := `rowid IN (SELECT rowid FROM ` + table + ` WHERE ` + where + from + ` LIMIT ?4) RETURNING ` + returning
	if set != "" {
		return `UPDATE ` + table + ` SET ` + set + ` WHERE ` + batch
	}
	return `DELETE FROM ` + table + ` WHERE ` + batch
}

func (q queries) Purge(ctx context.Context, p store.PurgeParams) (store.PurgeCounts, error) {
	out := store.PurgeCounts{}
	args := []any{p.PayloadsBefore.UnixMicro(), p.EventsBefore.UnixMicro(), p.Now.UnixMicro()}
	batch := p.BatchSize()
	for _, st := range purgeStatements {
		where := purgeWhere(st.where)
		if p.DryRun {
			var n int64
			if err := q.db.QueryRowContext(ctx, `SELECT count(*) FROM `+st.table+` WHERE `+where, args...).Scan(&n); err != nil {
				return nil, fmt.Errorf("count %s: %w", st.kind, err)
			}
			out[st.kind] = n
			continue
		}
		sql := purgeBatchSQL(st.table, st.set, where, st.order)
		out[st.kind] = 0
		from := int64(math.MinInt64)
		for {
			start := time.Now()
			if st.table == "events" {
				if err := q.purgeChainBase(ctx, where, append(args, batch, from)); busy(err) {
					if err := p.Between(ctx, time.Since(start)); err != nil {
						return out, fmt.Errorf("purge %s: %w", st.kind, err)
					}
					continue
				} else if err != nil {
					return out, fmt.Errorf("purge %s: %w", st.kind, err)
				}
			}
			n, last, err := q.purgeBatch(ctx, sql, append(args, batch, from))
			if busy(err) {
				// Writers kept the lock through the busy timeout: they go first; the
				// purge is background work and tries the batch again after a pause.
				if err := p.Between(ctx, time.Since(start)); err != nil {
					return out, fmt.Errorf("purge %s: %w", st.kind, err)
				}
				continue
			}
			if err != nil {
				return out, fmt.Errorf("purge %s: %w", st.kind, err)
			}
			out[st.kind] += n
			if n < int64(batch) {
				break
			}
			if last.Valid {
				from = last.Int64
			}
			if err := p.Between(ctx, time.Since(start)); err != nil {
				return out, fmt.Errorf("purge %s: %w", st.kind, err)
			}
		}
	}
	return out, nil
}

// purgeChainBase moves each run's chain base (event_chains.base_seq, base_hash) to the
// last link the next batch of events deletes, so that `airlock audit verify` checks the
// kept chain from there and still finds any other deletion. It runs just before the
// batch, the same selection: if the batch then fails, a base ahead of the deletions only
// leaves a few kept events unchecked, never a chain reported broken.
func (q queries) purgeChainBase(ctx context.Context, where string, args []any) error {
	_, err := q.db.ExecContext(ctx, `UPDATE event_chains SET base_seq = b.s, base_hash = b.h
		FROM (SELECT run_key, chain_seq AS s, chain_hash AS h FROM (
		        SELECT run_key, chain_seq, chain_hash,
		          row_number() OVER (PARTITION BY run_key ORDER BY chain_seq DESC) AS rn
		        FROM (SELECT run_key, chain_seq, chain_hash FROM events WHERE `+where+` AND at >= ?5 ORDER BY at LIMIT ?4)
		        WHERE chain_seq IS NOT NULL)
		      WHERE rn = 1) AS b
		WHERE event_chains.run_key = b.run_key AND b.s > event_chains.base_seq`, args...)
	return err
}

// busy reports SQLITE_BUSY (the write lock stayed taken through the busy timeout).
func busy(err error) bool {
	var se *msqlite.Error
	return errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_BUSY
}

// purgeBatch runs one batch: how many rows it changed, and the greatest position.
func (q queries) purgeBatch(ctx context.Context, query string, args []any) (int64, sql.NullInt64, error) {
	var n int64
	var last sql.NullInt64
	rows, err := q.db.QueryContext(ctx, query, args...)
	if err != nil {
		return 0, last, err
	}
	defer rows.Close()
	for rows.Next() {
		var at sql.NullInt64
		if err := rows.Scan(&at); err != nil {
			return 0, last, err
		}
		n++
		if at.Valid && (!last.Valid || at.Int64 > last.Int64) {
			last = at
		}
	}
	return n, last, rows.Err()
}

// RenameEffectsForTest renames the effects table inside q's transaction, for the test
// that proves counting never reads it (the transaction is rolled back).
func (s *Store) RenameEffectsForTest(ctx context.Context, q store.Queries) error {
	_, err := q.(queries).db.ExecContext(ctx, `ALTER TABLE effects RENAME TO effects_renamed_for_test`)
	return err
}
