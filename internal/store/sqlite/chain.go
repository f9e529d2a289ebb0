package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"

	msqlite "modernc.org/sqlite"

	"github.com/airlockhq/airlock/internal/store"
)

// newDriver is the driver of every connection airlock opens: it carries
// airlock_chain_hash, which the events_chain trigger (0015_chain.sql) calls.
func newDriver() *msqlite.Driver {
	d := &msqlite.Driver{}
	d.MustRegisterDeterministicScalarFunction("airlock_chain_hash", 9, chainHashSQL)
	return d
}

// chainHashSQL is airlock_chain_hash(prev, id, run_key, at, kind, version, actor, meta,
// detail): store.ChainHash of the row's stored values.
func chainHashSQL(_ *msqlite.FunctionContext, args []driver.Value) (driver.Value, error) {
	text := func(v driver.Value) (*string, error) {
		switch v := v.(type) {
		case nil:
			return nil, nil
		case string:
			return &v, nil
		case []byte:
			s := string(v)
			return &s, nil
		}
		return nil, fmt.Errorf("airlock_chain_hash: a %T where text belongs", v)
	}
	integer := func(v driver.Value) (int64, error) {
		if n, ok := v.(int64); ok {
			return n, nil
		}
		return 0, fmt.Errorf("airlock_chain_hash: a %T where an integer belongs", v)
	}
	var strs [6]*string
	for i, at := range []int{0, 2, 4, 6, 7, 8} {
		s, err := text(args[at])
		if err != nil {
			return nil, err
		}
		strs[i] = s
	}
	var ints [3]int64
	for i, at := range []int{1, 3, 5} {
		n, err := integer(args[at])
		if err != nil {
			return nil, err
		}
		ints[i] = n
	}
	deref := func(s *string) string {
		if s == nil {
			return ""
		}
		return *s
	}
	e := store.ChainEvent{ID: ints[0], RunKey: deref(strs[1]), AtMicros: ints[1], Kind: deref(strs[2]),
		Version: ints[2], Actor: deref(strs[3]), Meta: strs[4], Detail: strs[5]}
	return store.ChainHash(deref(strs[0]), e), nil
}

func (q queries) ChainEvents(ctx context.Context, key string, afterID int64, limit int) ([]store.ChainEvent, error) {
	evs, err := selectAll(ctx, q.db, func(row scanner) (store.ChainEvent, error) {
		var e store.ChainEvent
		var meta, detail, hash, macKey, mac sql.NullString
		var seq sql.NullInt64
		if err := row.Scan(&e.ID, &e.RunKey, &e.AtMicros, &e.Kind, &e.Version, &e.Actor, &meta, &detail, &seq, &hash, &macKey, &mac); err != nil {
			return store.ChainEvent{}, err
		}
		if meta.Valid {
			e.Meta = &meta.String
		}
		if detail.Valid {
			e.Detail = &detail.String
		}
		if seq.Valid {
			e.Seq = &seq.Int64
		}
		if hash.Valid {
			e.Hash = &hash.String
		}
		if macKey.Valid {
			e.MACKey = &macKey.String
		}
		if mac.Valid {
			e.MAC = &mac.String
		}
		return e, nil
	}, `SELECT id, run_key, at, kind, version, actor, meta, detail, chain_seq, chain_hash, mac_key, mac
		FROM events WHERE run_key = ? AND id > ? ORDER BY id LIMIT ?`, key, afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("list chain of %q: %w", key, err)
	}
	return evs, nil
}

func (q queries) ChainHeadGet(ctx context.Context, key string) (store.ChainHead, error) {
	h, err := scanHead(q.db.QueryRowContext(ctx, `SELECT `+headColumns+` FROM event_chains WHERE run_key = ?`, key))
	if err != nil {
		return store.ChainHead{}, interpret(err)
	}
	return h, nil
}

const headColumns = `run_key, seq, head, started_at, base_seq, base_hash, base_at, base_mac_key, base_mac`

func scanHead(row scanner) (store.ChainHead, error) {
	var h store.ChainHead
	var started int64
	var baseAt sql.NullInt64
	var baseMACKey, baseMAC sql.NullString
	if err := row.Scan(&h.RunKey, &h.Seq, &h.Head, &started, &h.BaseSeq, &h.BaseHash, &baseAt, &baseMACKey, &baseMAC); err != nil {
		return store.ChainHead{}, err
	}
	h.StartedAt = fromMicros(started)
	if baseAt.Valid {
		t := fromMicros(baseAt.Int64)
		h.BaseAt = &t
	}
	if baseMACKey.Valid {
		h.BaseMACKey = &baseMACKey.String
	}
	if baseMAC.Valid {
		h.BaseMAC = &baseMAC.String
	}
	return h, nil
}

func (q queries) ChainHeads(ctx context.Context, afterKey string, limit int) ([]store.ChainHead, error) {
	heads, err := selectAll(ctx, q.db, scanHead, `SELECT `+headColumns+` FROM event_chains WHERE run_key > ? ORDER BY run_key LIMIT ?`, afterKey, limit)
	if err != nil {
		return nil, fmt.Errorf("list chain heads: %w", err)
	}
	return heads, nil
}

// ChainRunKeys walks the run_key index one key at a time (a skip scan by hand), then
// adds heads whose events are all gone and runs with neither (their record was wiped).
func (q queries) ChainRunKeys(ctx context.Context, afterKey string, limit int) ([]string, error) {
	keys, err := selectAll(ctx, q.db, func(row scanner) (string, error) {
		var k string
		return k, row.Scan(&k)
	}, `WITH RECURSIVE k(key, n) AS (
		  SELECT (SELECT min(run_key) FROM events WHERE run_key > ?1), 1
		  UNION ALL
		  SELECT (SELECT min(run_key) FROM events WHERE run_key > k.key), n + 1 FROM k
		  WHERE k.key IS NOT NULL AND n < ?2
		)
		SELECT key FROM (SELECT key FROM k WHERE key IS NOT NULL
		  UNION SELECT run_key FROM (SELECT run_key FROM event_chains WHERE run_key > ?1 ORDER BY run_key LIMIT ?2)
		  UNION SELECT idempotency_key FROM (SELECT idempotency_key FROM workflow_runs WHERE idempotency_key > ?1
		    ORDER BY idempotency_key LIMIT ?2))
		ORDER BY key LIMIT ?2`, afterKey, limit)
	if err != nil {
		return nil, fmt.Errorf("list chained runs: %w", err)
	}
	return keys, nil
}

// sqliteDriver is shared: a driver's functions are registered once.
var sqliteDriver = newDriver()

// ChainFirstKeyed walks the id index from the start to the first keyed event: events
// from before the audit key was set are read once per verify.
func (q queries) ChainFirstKeyed(ctx context.Context) (int64, error) {
	var id sql.NullInt64
	if err := q.db.QueryRowContext(ctx, `SELECT min(id) FROM events WHERE mac IS NOT NULL`).Scan(&id); err != nil {
		return 0, fmt.Errorf("find the first keyed event: %w", err)
	}
	return id.Int64, nil
}

// ChainSnapshot holds one connection in a deferred read transaction: its first read
// fixes the snapshot (WAL), and writers of other connections go on meanwhile.
func (s *Store) ChainSnapshot(ctx context.Context, fn func(q store.ChainQueries) error) error {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("begin snapshot: %w", err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `BEGIN DEFERRED`); err != nil {
		return fmt.Errorf("begin snapshot: %w", err)
	}
	defer func() { _, _ = conn.ExecContext(context.WithoutCancel(ctx), `ROLLBACK`) }()
	return fn(queries{db: conn, now: s.now, key: s.key})
}
