package postgres

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/airlockhq/airlock/internal/store"
)

// unavailableCodes are the SQLSTATEs by which PostgreSQL says it cannot do the work now,
// not that the request was wrong: the same request may succeed once the server is back,
// promoted, or has room again. Class 08 (connection exception) counts whole.
var unavailableCodes = map[string]bool{
	"57P01": true, // admin_shutdown: pg_ctl stop -m fast, or pg_terminate_backend
	"57P02": true, // crash_shutdown: another backend crashed
	"57P03": true, // cannot_connect_now: starting up, in recovery, or shutting down
	"25006": true, // read_only_sql_transaction: a standby, or a primary demoted by failover
	"53000": true, // insufficient_resources
	"53100": true, // disk_full
	"53200": true, // out_of_memory
	"53300": true, // too_many_connections
	"53400": true, // configuration_limit_exceeded
	"58000": true, // system_error
	"58030": true, // io_error
}

// unavailable reports whether err, from pgx, says the database cannot serve now.
func unavailable(err error) bool {
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		// No connection at all: refused, reset, a timeout, too many connections, starting up.
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return strings.HasPrefix(pgErr.Code, "08") || unavailableCodes[pgErr.Code] || citusConnectionLost(pgErr)
	}
	var ne net.Error
	switch {
	case errors.Is(err, context.Canceled):
		return false // the caller gave up: no outage
	case errors.Is(err, context.DeadlineExceeded):
		// The database did not answer in time (or no pooled connection came free):
		// the caller's own deadline, never a client that went away (context.Canceled).
		return true
	case pgconn.SafeToRetry(err):
		// The connection failed before the statement was sent (a pooled connection the
		// server closed): nothing ran.
		return true
	case errors.As(err, &ne), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EPIPE):
		// The connection broke mid-statement.
		return true
	case errors.Is(err, pgconn.ErrConnClosed):
		return true
	}
	return false
}

// classify marks driver errors that say the database is unavailable as
// store.ErrUnavailable; others are returned as they are. It is applied only to errors
// pgx returned, never to what a transaction's fn returns (that may be a provider's
// network error, which is no outage of the store).
func classify(err error) error {
	if err == nil || !unavailable(err) {
		return err
	}
	return store.Unavailable(err)
}

// classified is a dbtx whose errors are classified: every statement the store runs goes
// through one (joined for autocommit and Within, Transact's for its transaction).
type classified struct{ db dbtx }

func (c classified) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tag, err := c.db.Exec(ctx, sql, args...)
	return tag, classify(err)
}

func (c classified) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	rows, err := c.db.Query(ctx, sql, args...)
	if err != nil {
		return rows, classify(err)
	}
	return classifiedRows{rows}, nil
}

func (c classified) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return classifiedRow{c.db.QueryRow(ctx, sql, args...)}
}

type classifiedRow struct{ pgx.Row }

func (r classifiedRow) Scan(dest ...any) error { return classify(r.Row.Scan(dest...)) }

type classifiedRows struct{ pgx.Rows }

func (r classifiedRows) Err() error             { return classify(r.Rows.Err()) }
func (r classifiedRows) Scan(dest ...any) error { return classify(r.Rows.Scan(dest...)) }
func (r classifiedRows) Values() ([]any, error) {
	v, err := r.Rows.Values()
	return v, classify(err)
}

// citusConnectionLost reports a Citus coordinator's internal error (XX000) for a worker
// connection that failed mid-transaction — a worker stopped or unreachable: the same
// request succeeds once it is back. Citus reports a refused connection as 08006 (class 08
// above); these it reports with its own messages only, or with libpq's for a connection
// that broke mid-statement (seen with a worker stopped under load: "SSL SYSCALL error:
// EOF detected"), or a commit whose worker went away under it ("could not commit
// transaction for shard N on at least one active node": its outcome is the one a broken
// connection at COMMIT leaves, as class 08 above; seen once in TestStoppedWorkerUnderLoad).
func citusConnectionLost(e *pgconn.PgError) bool {
	if e.Code != "XX000" {
		return false
	}
	for _, m := range []string{"failure on connection marked as essential", "connection to the remote node",
		"SSL SYSCALL error", "server closed the connection unexpectedly", "could not commit transaction for shard"} {
		if strings.HasPrefix(e.Message, m) {
			return true
		}
	}
	return false
}
