package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/airlockhq/airlock/internal/store"
)

// ChainEvents reads the values exactly as the events_chain trigger hashed them: at in
// microseconds and jsonb in its text form.
func (q queries) ChainEvents(ctx context.Context, key string, afterID int64, limit int) ([]store.ChainEvent, error) {
	rows, err := q.db.Query(ctx, `SELECT id, run_key, (extract(epoch FROM at) * 1000000)::bigint, kind, version,
		actor, meta::text, detail::text, chain_seq, chain_hash, mac_key, mac
		FROM events WHERE run_key = $1 AND id > $2 ORDER BY id LIMIT $3`, key, afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("list chain of %q: %w", key, err)
	}
	evs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.ChainEvent, error) {
		var e store.ChainEvent
		err := row.Scan(&e.ID, &e.RunKey, &e.AtMicros, &e.Kind, &e.Version, &e.Actor, &e.Meta, &e.Detail, &e.Seq, &e.Hash, &e.MACKey, &e.MAC)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("list chain of %q: %w", key, err)
	}
	return evs, nil
}

// A chain head's columns where it is kept: a run's row (0035: a run chained since then;
// NULL base columns are no base), or event_chains (a run chained before 0035, or a key
// with no run). Both read as scanHead scans.
const (
	runHeadColumns = `idempotency_key, chain_seq, chain_head, chain_started_at, coalesce(chain_base_seq, 0),
	coalesce(chain_base_hash, ''), chain_base_at, chain_base_mac_key, chain_base_mac`
	chainHeadColumns = `run_key, seq, head, started_at, base_seq, base_hash, base_at, base_mac_key, base_mac`
)

func scanHead(row pgx.Row) (store.ChainHead, error) {
	var h store.ChainHead
	err := row.Scan(&h.RunKey, &h.Seq, &h.Head, &h.StartedAt, &h.BaseSeq, &h.BaseHash, &h.BaseAt, &h.BaseMACKey, &h.BaseMAC)
	return h, err
}

// ChainHeadGet reads the key's head where it is: in its run's row, else in event_chains.
func (q queries) ChainHeadGet(ctx context.Context, key string) (store.ChainHead, error) {
	h, err := scanHead(q.db.QueryRow(ctx, `SELECT `+runHeadColumns+` FROM workflow_runs WHERE idempotency_key = $1 AND chain_seq IS NOT NULL`, key))
	if errors.Is(err, pgx.ErrNoRows) {
		h, err = scanHead(q.db.QueryRow(ctx, `SELECT `+chainHeadColumns+` FROM event_chains WHERE run_key = $1`, key))
	}
	if err != nil {
		return store.ChainHead{}, interpret(err)
	}
	return h, nil
}

// ChainRunKeys walks the run_key index one key at a time (a loose index scan), then adds
// heads whose events are all gone and runs with neither (their record was wiped).
//
// On Citus, which plans a recursive CTE only with the distribution column fixed, the keys
// are those of events, chain heads and runs merged from every shard: a multi-shard read
// whose cost grows with the shard's keys (an operator's command, `airlock audit verify`).
func (q queries) ChainRunKeys(ctx context.Context, afterKey string, limit int) ([]string, error) {
	sql := `WITH RECURSIVE k(key, n) AS (
		  SELECT (SELECT min(run_key) FROM events WHERE run_key > $1), 1
		  UNION ALL
		  SELECT (SELECT min(run_key) FROM events WHERE run_key > k.key), n + 1 FROM k
		  WHERE k.key IS NOT NULL AND n < $2
		)
		SELECT key FROM (SELECT key FROM k WHERE key IS NOT NULL
		  UNION (SELECT run_key FROM event_chains WHERE run_key > $1 ORDER BY run_key LIMIT $2)
		  UNION (SELECT idempotency_key FROM workflow_runs WHERE idempotency_key > $1 ORDER BY idempotency_key LIMIT $2)) u
		ORDER BY key LIMIT $2`
	if q.citus {
		sql = `SELECT key FROM (
		  (SELECT DISTINCT run_key AS key FROM events WHERE run_key > $1 ORDER BY 1 LIMIT $2)
		  UNION (SELECT run_key FROM event_chains WHERE run_key > $1 ORDER BY run_key LIMIT $2)
		  UNION (SELECT idempotency_key FROM workflow_runs WHERE idempotency_key > $1 ORDER BY idempotency_key LIMIT $2)) u
		ORDER BY key LIMIT $2`
	}
	rows, err := q.db.Query(ctx, sql, afterKey, limit)
	if err != nil {
		return nil, fmt.Errorf("list chained runs: %w", err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list chained runs: %w", err)
	}
	return keys, nil
}

// ChainFirstKeyed walks the id index from the start to the first keyed event: events
// from before the audit key was set are read once per verify.
func (q queries) ChainFirstKeyed(ctx context.Context) (int64, error) {
	var id *int64
	if err := q.db.QueryRow(ctx, `SELECT min(id) FROM events WHERE mac IS NOT NULL`).Scan(&id); err != nil {
		return 0, fmt.Errorf("find the first keyed event: %w", err)
	}
	if id == nil {
		return 0, nil
	}
	return *id, nil
}

// ChainHeads merges the heads in runs' rows and those in event_chains (a key's head is in
// one of the two), in the keys' byte order (SQLite's): the two lists merge in Go.
func (q queries) ChainHeads(ctx context.Context, afterKey string, limit int) ([]store.ChainHead, error) {
	read := func(sql string) ([]store.ChainHead, error) {
		rows, err := q.db.Query(ctx, sql, afterKey, limit)
		if err != nil {
			return nil, fmt.Errorf("list chain heads: %w", err)
		}
		heads, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.ChainHead, error) { return scanHead(row) })
		if err != nil {
			return nil, fmt.Errorf("list chain heads: %w", err)
		}
		return heads, nil
	}
	inRuns, err := read(`SELECT ` + runHeadColumns + ` FROM workflow_runs
		WHERE idempotency_key COLLATE "C" > $1 AND chain_seq IS NOT NULL ORDER BY idempotency_key COLLATE "C" LIMIT $2`)
	if err != nil {
		return nil, err
	}
	inChains, err := read(`SELECT ` + chainHeadColumns + `
		FROM event_chains WHERE run_key COLLATE "C" > $1 ORDER BY run_key COLLATE "C" LIMIT $2`)
	if err != nil {
		return nil, err
	}
	heads := append(inRuns, inChains...)
	slices.SortFunc(heads, func(a, b store.ChainHead) int { return strings.Compare(a.RunKey, b.RunKey) })
	return heads[:min(len(heads), limit)], nil
}

func (s *Store) ChainSnapshot(ctx context.Context, fn func(q store.ChainQueries) error) error {
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("begin snapshot: %w", classify(err))
	}
	defer func() { _ = tx.Rollback(ctx) }()
	return fn(queries{db: classified{tx}, citus: s.citus, key: s.key})
}
