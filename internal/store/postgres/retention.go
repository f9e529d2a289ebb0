package postgres

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/airlockhq/airlock/internal/store"
)

// purgeStatements name what expires and how: each is a WHERE clause, run as a count (dry)
// or as the change. $1 is the payload cutoff, $2 the event cutoff, $3 now. Each has an
// index path (0010_cost.sql), which TestHotQueriesUseIndexes checks: the ledgers' is
// a lookup of each ledger's run by key (a subquery per row, never a hash of all runs).
var purgeStatements = []struct{ kind, table, set, where, order string }{
	{"effect_payloads", "effects", "payload = NULL", "payload IS NOT NULL AND state IN ('completed', 'cancelled') AND updated_at < $1", "updated_at"},
	{"approval_payloads", "approvals", "payload = NULL", "payload IS NOT NULL AND consumed_at IS NOT NULL AND consumed_at < $1", "consumed_at"},
	{"validated_values", "validations", "value = NULL", "value IS NOT NULL AND created_at < $1", "created_at"},
	{"run_results", "workflow_runs", "result = NULL", "result IS NOT NULL AND state IN ('completed', 'failed_terminal', 'rejected') AND updated_at < $1", "updated_at"},
	{"ledgers", "ledgers", "", "(SELECT r.state IN ('completed', 'failed_terminal', 'rejected') AND r.updated_at < $1 FROM workflow_runs r WHERE r.idempotency_key = ledgers.idempotency_key)", ""},
	{"events", "events", "", "at < $2", "at"},
	{"sessions", "sessions", "", "expires_at < $3", "expires_at"},
	{"signin_throttle", "signin_throttle", "", "next_at < $3 AND updated_at < $3::timestamptz - interval '1 day'", ""},
	{"replays", "replays", "", "expires_at < $3", ""},
	// People no longer counted as holding a role (store.PeopleSeenHorizon): one row per
	// person, no index on seen_at needed.
	{"people_seen", "people_seen", "", fmt.Sprintf("seen_at < $3::timestamptz - make_interval(secs => %d)", int64(store.PeopleSeenHorizon/time.Second)), ""},
}

// purgeWhere is a statement's clause naming all three parameters, so their types are
// always known.
func purgeWhere(where string) string {
	return where + " AND $1::timestamptz IS NOT NULL AND $2::timestamptz IS NOT NULL AND $3::timestamptz IS NOT NULL"
}

// purgeBatchSQL changes at most $4 rows: the first in the index's order from $5, and
// returns how many and the last one's position; the next batch starts there, so no batch
// walks again over the index entries its predecessors left dead. The ORDER BY also keeps
// the index path in the generic plan PostgreSQL switches to after a few runs of a prepared
// statement: without it, "LIMIT n of a third of the table" looks cheapest as a sequential
// scan, which reads all history before reaching the old rows at its end. The outer WHERE
// checks each row again, so a row changed since it was found is left as it is.
//
// On Citus (citus) a batch names its rows by their key (citusRowKey) instead: a ctid is
// per shard, and Citus cannot plan a distributed change by ctid.
func purgeBatchSQL(table, set, where, order string, citus bool) string {
	from, returning, last := "", "NULL::timestamptz", "NULL::timestamptz"
	if order != "" {
		from, returning, last = ` AND `+order+` >= $5 ORDER BY `+order, order, `max(o)`
	}
	batch := `ctid = ANY(ARRAY(SELECT ctid FROM ` + table + ` WHERE ` + where + from + ` LIMIT $4)) AND ` + where
	if k := citusRowKey[table]; citus && k != "" {
		batch = k + ` IN (SELECT ` + strings.Trim(k, "()") + ` FROM ` + table + ` WHERE ` + where + from + ` LIMIT $4) AND ` + where
	}
	change := `DELETE FROM ` + table + ` WHERE ` + batch
	if set != "" {
		change = `UPDATE ` + table + ` SET ` + set + ` WHERE ` + batch
	}
	if table == "events" {
		return batch // purgeEventsBatch's selection
	}
	// $5 is echoed so that its type is known in the statements without an order.
	return `WITH d AS (` + change + ` RETURNING ` + returning + ` AS o) SELECT count(*), ` + last + `, $5::timestamptz FROM d`
}

// purgeEventsBatch deletes a batch of events and, in the same transaction, moves each
// run's chain base (event_chains.base_seq, base_hash, base_at and, with the audit key,
// its MAC) to the last link it actually deleted (store.ChainBases), so that `airlock
// audit verify` checks the kept chain from there and still finds any other deletion. The
// heads are locked in key order, as writers lock them. It returns how many rows went and
// the greatest time among them (the next batch starts there).
func (q queries) purgeEventsBatch(ctx context.Context, batch string, args ...any) (n int64, last *time.Time, err error) {
	err = q.atomically(ctx, func(ctx context.Context) error {
		n, last = 0, nil
		rows, err := q.db.Query(ctx, `DELETE FROM events WHERE `+batch+`
			RETURNING at, run_key, chain_seq, chain_hash`, args...)
		if err != nil {
			return err
		}
		var links []store.PurgedLink
		var at time.Time
		var key string
		var seq *int64
		var hash *string
		// The link's time in microseconds is taken from at here, not computed in RETURNING:
		// Citus refuses extract() there (it is not IMMUTABLE).
		_, err = pgx.ForEachRow(rows, []any{&at, &key, &seq, &hash}, func() error {
			n++
			if last == nil || at.After(*last) {
				t := at
				last = &t
			}
			if seq != nil && hash != nil {
				links = append(links, store.PurgedLink{RunKey: key, Seq: *seq, Hash: *hash, AtMicros: at.UnixMicro()})
			}
			return nil
		})
		if err != nil {
			return err
		}
		bases := store.ChainBases(q.key, links)
		if len(bases) == 0 {
			return nil
		}
		keys, seqs, hashes, ats := make([]string, len(bases)), make([]int64, len(bases)), make([]string, len(bases)), make([]int64, len(bases))
		macKeys, macs := make([]*string, len(bases)), make([]*string, len(bases))
		for i, b := range bases {
			keys[i], seqs[i], hashes[i], ats[i], macKeys[i], macs[i] = b.RunKey, b.Seq, b.Hash, b.AtMicros, b.MACKey, b.MAC
		}
		if q.citus {
			return q.chainBasesCitus(ctx, keys, seqs, hashes, ats, macKeys, macs)
		}
		// A key's head is in its run's row (0035) or in event_chains: both are moved, each
		// only where the head is.
		_, err = q.db.Exec(ctx, `WITH l AS (SELECT r.idempotency_key FROM workflow_runs r
		      WHERE r.idempotency_key = ANY($1::text[]) AND r.chain_seq IS NOT NULL
		      ORDER BY r.idempotency_key FOR NO KEY UPDATE)
			UPDATE workflow_runs r SET chain_base_seq = u.seq, chain_base_hash = u.hash,
			  chain_base_at = timestamptz 'epoch' + u.at * interval '1 microsecond', chain_base_mac_key = u.mac_key, chain_base_mac = u.mac
			FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[], $5::text[], $6::text[]) AS u(key, seq, hash, at, mac_key, mac)
			WHERE r.idempotency_key = u.key AND r.idempotency_key IN (SELECT idempotency_key FROM l)
			  AND r.chain_seq IS NOT NULL AND coalesce(r.chain_base_seq, 0) < u.seq`,
			keys, seqs, hashes, ats, macKeys, macs)
		if err != nil {
			return err
		}
		_, err = q.db.Exec(ctx, `WITH l AS (SELECT c.run_key FROM event_chains c WHERE c.run_key = ANY($1::text[])
		      ORDER BY c.run_key FOR UPDATE)
			UPDATE event_chains c SET base_seq = u.seq, base_hash = u.hash,
			  base_at = timestamptz 'epoch' + u.at * interval '1 microsecond', base_mac_key = u.mac_key, base_mac = u.mac
			FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[], $5::text[], $6::text[]) AS u(key, seq, hash, at, mac_key, mac)
			WHERE c.run_key = u.key AND c.run_key IN (SELECT run_key FROM l) AND c.base_seq < u.seq`,
			keys, seqs, hashes, ats, macKeys, macs)
		return err
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

func (q queries) Purge(ctx context.Context, p store.PurgeParams) (store.PurgeCounts, error) {
	out := store.PurgeCounts{}
	batch := p.BatchSize()
	for _, st := range purgeStatements {
		where := purgeWhere(st.where)
		if p.DryRun {
			var n int64
			if err := q.db.QueryRow(ctx, `SELECT count(*) FROM `+st.table+` WHERE `+where, p.PayloadsBefore, p.EventsBefore, p.Now).Scan(&n); err != nil {
				return nil, fmt.Errorf("count %s: %w", st.kind, err)
			}
			out[st.kind] = n
			continue
		}
		sql := purgeBatchSQL(st.table, st.set, where, st.order, q.citus)
		out[st.kind] = 0
		from := time.Time{} // before every stored time
		for {
			start := time.Now()
			var n int64
			var last, echo *time.Time
			var err error
			if st.table == "events" {
				n, last, err = q.purgeEventsBatch(ctx, sql, p.PayloadsBefore, p.EventsBefore, p.Now, batch, from)
			} else {
				err = q.db.QueryRow(ctx, sql, p.PayloadsBefore, p.EventsBefore, p.Now, batch, from).Scan(&n, &last, &echo)
			}
			if err != nil {
				return out, fmt.Errorf("purge %s: %w", st.kind, err)
			}
			out[st.kind] += n
			if n < int64(batch) {
				break
			}
			if last != nil {
				from = *last
			}
			if err := p.Between(ctx, time.Since(start)); err != nil {
				return out, fmt.Errorf("purge %s: %w", st.kind, err)
			}
		}
	}
	if !p.DryRun {
		if err := q.compactEffectCounts(ctx); err != nil {
			return out, err
		}
	}
	return out, nil
}

// HideCountedEffectsForTest deletes, inside q's transaction and without firing a trigger
// (session_replication_role = replica: a superuser's setting), every effect whose count
// is read from the counters (countedStates), for the test that proves counting does not
// read them (the transaction is rolled back).
func (s *Store) HideCountedEffectsForTest(ctx context.Context, q store.Queries) error {
	db := q.(queries).db
	if _, err := db.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
		return err
	}
	_, err := db.Exec(ctx, `DELETE FROM effects WHERE state IN `+countedStates)
	return err
}
