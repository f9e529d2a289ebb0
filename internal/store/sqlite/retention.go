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
		query := purgeBatchSQL(st.table, st.set, where, st.order)
		out[st.kind] = 0
		from := int64(math.MinInt64)
		for {
			start := time.Now()
			var n int64
			var last sql.NullInt64
			var err error
			if st.table == "events" {
				n, last, err = q.purgeEventsBatch(ctx, where, append(args, batch, from))
			} else {
				n, last, err = q.purgeBatch(ctx, query, append(args, batch, from))
			}
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

// purgeEventsBatch deletes a batch of events and, in the same transaction, moves each
// run's chain base (event_chains.base_seq, base_hash, base_at and, with the audit key,
// its MAC) to the last link it actually deleted (store.ChainBases), so that `airlock
// audit verify` checks the kept chain from there and still finds any other deletion. Two
// purges of one file never leave a base apart from its deletion: each moves bases from
// the rows it deleted itself, and only forward.
func (q queries) purgeEventsBatch(ctx context.Context, where string, args []any) (n int64, last sql.NullInt64, err error) {
	err = q.atomically(ctx, func(ctx context.Context) error {
		n, last = 0, sql.NullInt64{}
		rows, err := q.db.QueryContext(ctx, `DELETE FROM events WHERE rowid IN (SELECT rowid FROM events WHERE `+where+`
			AND at >= ?5 ORDER BY at LIMIT ?4) RETURNING at, run_key, chain_seq, chain_hash`, args...)
		if err != nil {
			return err
		}
		var links []store.PurgedLink
		for rows.Next() {
			var at int64
			var key string
			var seq sql.NullInt64
			var hash sql.NullString
			if err := rows.Scan(&at, &key, &seq, &hash); err != nil {
				rows.Close()
				return err
			}
			n++
			if !last.Valid || at > last.Int64 {
				last = sql.NullInt64{Int64: at, Valid: true}
			}
			if seq.Valid && hash.Valid {
				links = append(links, store.PurgedLink{RunKey: key, Seq: seq.Int64, Hash: hash.String, AtMicros: at})
			}
		}
		if err := rows.Close(); err != nil {
			return err
		}
		if err := rows.Err(); err != nil {
			return err
		}
		for _, b := range store.ChainBases(q.key, links) {
			if _, err := q.db.ExecContext(ctx, `UPDATE event_chains SET base_seq = ?, base_hash = ?, base_at = ?,
				base_mac_key = ?, base_mac = ? WHERE run_key = ? AND base_seq < ?`,
				b.Seq, b.Hash, b.AtMicros, b.MACKey, b.MAC, b.RunKey, b.Seq); err != nil {
				return err
			}
		}
		return nil
	})
	return n, last, err
}

// atomically runs fn in a transaction: the store's (its statements on q.db join it), or
// the one q already runs in.
func (q queries) atomically(ctx context.Context, fn func(ctx context.Context) error) error {
	if j, ok := q.db.(joined); ok {
		return j.s.Within(ctx, fn)
	}
	return fn(ctx)
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

// HideCountedEffectsForTest hides, inside q's transaction, every effect whose count is
// read from the counters — here all of them: it renames the effects table —, for the
// test that proves counting does not read them (the transaction is rolled back).
func (s *Store) HideCountedEffectsForTest(ctx context.Context, q store.Queries) error {
	_, err := q.(queries).db.ExecContext(ctx, `ALTER TABLE effects RENAME TO effects_renamed_for_test`)
	return err
}
