package sqlite

import (
	"context"
	"fmt"
)

// VerifyCleanup removes what `airlock verify` wrote: the runs (their events and
// event chain heads) whose keys start with prefix, and the kill switch row of scope.
func (s *Store) VerifyCleanup(ctx context.Context, prefix, scope string) error {
	return s.transact(ctx, func(b *bound) error {
		for _, stmt := range []struct{ sql, arg string }{
			{`DELETE FROM events WHERE substr(run_key, 1, length(?1)) = ?1`, prefix},
			{`DELETE FROM event_chains WHERE substr(run_key, 1, length(?1)) = ?1`, prefix},
			{`DELETE FROM workflow_runs WHERE substr(idempotency_key, 1, length(?1)) = ?1`, prefix},
			{`DELETE FROM kill_switch WHERE scope = ?1`, scope},
		} {
			if _, err := b.tx.ExecContext(ctx, stmt.sql, stmt.arg); err != nil {
				return fmt.Errorf("verify cleanup: %w", err)
			}
		}
		return nil
	})
}
