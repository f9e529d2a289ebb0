package postgres

// Checks `airlock verify` makes of a live deployment's database that the store's interface
// does not express: the isolation level of airlock's transactions, whether a pooler
// multiplexes sessions, how commits are replicated, and the removal of the command's
// scratch namespace.

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

// Replication is what the server airlock's sessions reach says about where a commit is
// durable before it is acknowledged: whether it is a standby, which standbys stream from
// it and which of them a commit waits for, and the synchronous_commit of airlock's own
// sessions (a role or database setting applies to them, not to the server's default).
type Replication struct {
	InRecovery   bool   // pg_is_in_recovery(): a standby
	StandbyNames string // synchronous_standby_names
	// SyncCommit is current_setting('synchronous_commit') in a session as airlock opens
	// it; SyncCommitSource is pg_settings.source for it ("default", "configuration file",
	// "user", "database", "database user", "client"); SyncCommitServer is the value in the
	// server's configuration files ("" when the role may not read pg_file_settings or no
	// file sets it).
	SyncCommit, SyncCommitSource, SyncCommitServer string
	Role, Database                                 string // current_user, current_database()
	Standbys                                       []Standby
	// IdleSlots are physical replication slots no standby streams from: a standby that
	// is down now, and will stream again when it is back.
	IdleSlots []string
}

// Standby is one physical streaming standby (a pg_stat_replication row; logical
// walsenders and base backups in progress are left out: they are no failover target).
type Standby struct {
	Name      string // application_name
	State     string // streaming, catchup, …
	SyncState string // async, potential, sync, quorum; "" when the role may not see it (pg_read_all_stats)
}

// Replication reads the replication set-up of the server the pool's sessions reach.
func (s *Store) Replication(ctx context.Context) (Replication, error) {
	var r Replication
	err := s.pool.QueryRow(ctx, `SELECT pg_is_in_recovery(), current_setting('synchronous_standby_names'),
		setting, source, current_user, current_database()
		FROM pg_settings WHERE name = 'synchronous_commit'`).
		Scan(&r.InRecovery, &r.StandbyNames, &r.SyncCommit, &r.SyncCommitSource, &r.Role, &r.Database)
	if err != nil {
		return r, fmt.Errorf("read replication settings: %w", classify(err))
	}
	rows, err := s.pool.Query(ctx, `SELECT coalesce(r.application_name, ''), coalesce(r.state, ''), coalesce(r.sync_state, '')
		FROM pg_stat_replication r
		WHERE coalesce(r.state, '') <> 'backup'
		  AND NOT EXISTS (SELECT 1 FROM pg_replication_slots l WHERE l.active_pid = r.pid AND l.slot_type = 'logical')
		ORDER BY 1`)
	if err != nil {
		return r, fmt.Errorf("read pg_stat_replication: %w", classify(err))
	}
	r.Standbys, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Standby, error) {
		var sb Standby
		err := row.Scan(&sb.Name, &sb.State, &sb.SyncState)
		return sb, err
	})
	if err != nil {
		return r, fmt.Errorf("read pg_stat_replication: %w", classify(err))
	}
	rows, err = s.pool.Query(ctx, `SELECT slot_name::text FROM pg_replication_slots WHERE slot_type = 'physical' AND NOT active ORDER BY 1`)
	if err != nil {
		return r, fmt.Errorf("read pg_replication_slots: %w", classify(err))
	}
	if r.IdleSlots, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		return r, fmt.Errorf("read pg_replication_slots: %w", classify(err))
	}
	// The configuration files' value, to name what a role's or database's setting
	// overrides: pg_file_settings is for superusers and pg_read_all_settings only, so a
	// refusal (or no file setting it: the default or the command line) leaves it unknown.
	var server string
	if err := s.pool.QueryRow(ctx, `SELECT setting FROM pg_file_settings
		WHERE name = 'synchronous_commit' AND applied AND error IS NULL ORDER BY seqno DESC LIMIT 1`).Scan(&server); err == nil {
		r.SyncCommitServer = server
	}
	return r, nil
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
