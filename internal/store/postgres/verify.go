package postgres

// Checks `airlock verify` makes of a live deployment's database that the store's interface
// does not express: the isolation level of airlock's transactions, whether a pooler
// multiplexes sessions, and the removal of the command's scratch namespace.

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// TransactionIsolation is the isolation level of a transaction as Transact begins it
// ("read committed" is what the store's locking is written for).
func (s *Store) TransactionIsolation(ctx context.Context) (string, error) {
	var level string
	err := s.transact(ctx, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SHOW transaction_isolation`).Scan(&level)
	})
	if err != nil {
		return "", fmt.Errorf("read transaction isolation: %w", err)
	}
	return level, nil
}

// Multiplexed reports whether a pooler in transaction (or statement) mode stands between
// the pool and PostgreSQL: client connections then share server sessions, so session state
// (LISTEN, session advisory locks, named prepared statements) does not survive a
// transaction. The probe: connection A reads its backend pid; connection B, in a
// transaction, reads its own; A reads again. Without a pooler A's two pids are equal and
// B's differs (two sessions never share a pid); behind one, B is handed A's idle server
// session, or A's second statement goes to another. The probes use the simple protocol,
// so they work whatever the query exec mode.
func (s *Store) Multiplexed(ctx context.Context) (bool, error) {
	a, err := s.pool.Acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("pooler probe: %w", classify(err))
	}
	defer a.Release()
	// The second connection is a new one, not the pool's: a pool of one connection
	// (pool_max_conns=1) must not wait for itself.
	b, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
	if err != nil {
		return false, fmt.Errorf("pooler probe: %w", classify(err))
	}
	defer func() { _ = b.Close(context.WithoutCancel(ctx)) }()
	pid := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) (int32, error) {
		var p int32
		err := q.QueryRow(ctx, `SELECT pg_backend_pid()`, pgx.QueryExecModeSimpleProtocol).Scan(&p)
		return p, err
	}
	first, err := pid(a)
	if err != nil {
		return false, fmt.Errorf("pooler probe: %w", classify(err))
	}
	tx, err := b.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("pooler probe: %w", classify(err))
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	other, err := pid(tx)
	if err != nil {
		return false, fmt.Errorf("pooler probe: %w", classify(err))
	}
	second, err := pid(a)
	if err != nil {
		return false, fmt.Errorf("pooler probe: %w", classify(err))
	}
	return other == first || second != first, nil
}

// ListenSeparate reports whether LISTEN uses a connection string of its own.
func (s *Store) ListenSeparate() bool { return s.listenURL != "" }

// QueryMode is the pool's query exec mode.
func (s *Store) QueryMode() pgx.QueryExecMode { return s.pool.Config().ConnConfig.DefaultQueryExecMode }

// VerifyCleanup removes what `airlock verify` wrote: the runs (their events and
// event chain heads) whose keys start with prefix, and the kill switch row of scope.
func (s *Store) VerifyCleanup(ctx context.Context, prefix, scope string) error {
	return s.transact(ctx, func(tx pgx.Tx) error {
		for _, stmt := range []struct{ sql, arg string }{
			{`DELETE FROM events WHERE left(run_key, length($1)) = $1`, prefix},
			{`DELETE FROM event_chains WHERE left(run_key, length($1)) = $1`, prefix},
			{`DELETE FROM workflow_runs WHERE left(idempotency_key, length($1)) = $1`, prefix},
			{`DELETE FROM kill_switch WHERE scope = $1`, scope},
		} {
			if _, err := tx.Exec(ctx, stmt.sql, stmt.arg); err != nil {
				return fmt.Errorf("verify cleanup: %w", err)
			}
		}
		return nil
	})
}
