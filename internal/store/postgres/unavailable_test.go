package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/airlockhq/airlock/internal/store"
)

// Which driver errors are an outage (store.ErrUnavailable): the SQLSTATEs of a server
// that cannot serve now, and connections that fail; never a refusal on the merits.
func TestClassify(t *testing.T) {
	pg := func(code string) error {
		return fmt.Errorf("insert event: %w", &pgconn.PgError{Code: code, Message: "m"})
	}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"admin shutdown", pg("57P01"), true},
		{"crash shutdown", pg("57P02"), true},
		{"cannot connect now", pg("57P03"), true},
		{"read-only transaction (standby, failover)", pg("25006"), true},
		{"disk full", pg("53100"), true},
		{"out of memory", pg("53200"), true},
		{"too many connections", pg("53300"), true},
		{"io error", pg("58030"), true},
		{"connection failure", pg("08006"), true},
		{"no connection", &pgconn.ConnectError{}, true},
		{"refused", &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, true},
		{"reset", fmt.Errorf("read: %w", syscall.ECONNRESET), true},
		{"closed mid-answer", io.ErrUnexpectedEOF, true},
		{"conn closed", pgconn.ErrConnClosed, true},
		{"deadline", context.DeadlineExceeded, true},
		{"citus: a worker's connection lost mid-transaction", &pgconn.PgError{Code: "XX000", Message: "failure on connection marked as essential: 127.0.0.1:5433"}, true},
		{"citus: a worker gone at commit", &pgconn.PgError{Code: "XX000", Message: "could not commit transaction for shard 102671 on at least one active node"}, true},
		{"citus: a worker's socket gone", &pgconn.PgError{Code: "XX000", Message: "connection to the remote node 127.0.0.1:5433 failed: invalid socket"}, true},
		{"citus: a worker stopped mid-statement (TLS)", &pgconn.PgError{Code: "XX000", Message: "SSL SYSCALL error: EOF detected\ninvalid socket"}, true},
		{"citus: a worker stopped mid-statement", &pgconn.PgError{Code: "XX000", Message: "server closed the connection unexpectedly\n\tThis probably means the server terminated abnormally"}, true},
		{"internal error of another kind", &pgconn.PgError{Code: "XX000", Message: "could not find tuple"}, false},
		{"unique violation", pg("23505"), false},
		{"serialization failure", pg("40001"), false},
		{"invalid text", pg("22021"), false},
		{"no rows", pgx.ErrNoRows, false},
		{"client went away", context.Canceled, false},
		{"other", errors.New("boom"), false},
	} {
		got := classify(c.err)
		if errors.Is(got, store.ErrUnavailable) != c.want {
			t.Errorf("%s: %v; unavailable want %v", c.name, got, c.want)
		}
		if !errors.Is(got, c.err) {
			t.Errorf("%s: the cause is lost: %v", c.name, got)
		}
	}
}
