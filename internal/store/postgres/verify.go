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

// SessionsPinned reports whether consecutive statements on one client connection reach
// the same server session (one backend pid): false behind a pooler in transaction or
// statement pooling mode, where session state (LISTEN, session advisory locks, named
// prepared statements) does not survive a transaction.
func (s *Store) SessionsPinned(ctx context.Context) (bool, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("acquire: %w", classify(err))
	}
	defer conn.Release()
	var first int32
	for i := range 4 {
		var pid int32
		if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			return false, fmt.Errorf("read backend pid: %w", classify(err))
		}
		if i == 0 {
			first = pid
		} else if pid != first {
			return false, nil
		}
	}
	return true, nil
}

// VerifyCleanup removes what `airlock verify` wrote: the runs (and their events) whose
// keys start with prefix, and the kill switch row of scope.
func (s *Store) VerifyCleanup(ctx context.Context, prefix, scope string) error {
	return s.transact(ctx, func(tx pgx.Tx) error {
		for _, stmt := range []struct{ sql, arg string }{
			{`DELETE FROM events WHERE left(run_key, length($1)) = $1`, prefix},
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
