package sqlite

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"reflect"

	msqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/airlockhq/airlock/internal/store"
)

// unavailable reports whether err, from SQLite, says the database cannot serve now: the
// disk is full (SQLITE_FULL), I/O failed (SQLITE_IOERR: a failing disk, a file system
// remounted read-only), the file cannot be opened (SQLITE_CANTOPEN: its directory gone,
// out of file descriptors), it is read-only (SQLITE_READONLY: permissions, a read-only
// mount), memory ran out (SQLITE_NOMEM), or another process held the write lock past
// busy_timeout (SQLITE_BUSY). The same request may succeed once that passes.
func unavailable(err error) bool {
	var se *msqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff { // extended codes (SQLITE_IOERR_WRITE…) keep the primary in the low byte
		case sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_READONLY,
			sqlite3.SQLITE_NOMEM, sqlite3.SQLITE_BUSY:
			return true
		}
		return false
	}
	// The caller's deadline passed while SQLite waited (never a client gone: Canceled).
	return errors.Is(err, context.DeadlineExceeded)
}

func classify(err error) error {
	if err == nil || !unavailable(err) {
		return err
	}
	return store.Unavailable(err)
}

// The store opens its database through classifying, a database/sql driver around
// modernc's that classifies every error SQLite returns — from a statement, a row, a
// commit, opening a connection — at the one boundary they all cross. Errors that
// database/sql itself interprets (driver.ErrSkip, driver.ErrBadConn, io.EOF at the end
// of rows) are not SQLite's and pass unchanged.

type connector struct {
	dsn string
	drv *msqlite.Driver
}

func (c connector) Connect(context.Context) (driver.Conn, error) {
	cn, err := c.drv.Open(c.dsn)
	if err != nil {
		return nil, classify(err)
	}
	if _, ok := cn.(inner); !ok {
		cn.Close()
		return nil, fmt.Errorf("sqlite: the driver's connection (%T) lacks a method the store needs", cn)
	}
	return &conn{Conn: cn}, nil
}

func (c connector) Driver() driver.Driver { return c.drv }

// inner is what modernc's connection implements (checked at each Connect).
type inner interface {
	driver.Conn
	driver.ConnBeginTx
	driver.ConnPrepareContext
	driver.ExecerContext
	driver.QueryerContext
	driver.Pinger
	driver.SessionResetter
	driver.Validator
}

type conn struct {
	driver.Conn
	stmts stmtCache // stmtcache.go
}

func (c *conn) Close() error {
	c.closeStmts()
	return c.Conn.Close()
}

func (c *conn) in() inner { return c.Conn.(inner) }

func (c *conn) Prepare(query string) (driver.Stmt, error) {
	s, err := c.Conn.Prepare(query)
	if err != nil {
		return nil, classify(err)
	}
	return stmt{s}, nil
}

func (c *conn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	t, err := c.in().BeginTx(ctx, opts)
	if err != nil {
		return nil, classify(err)
	}
	return tx{t}, nil
}

func (c *conn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	s, err := c.in().PrepareContext(ctx, query)
	if err != nil {
		return nil, classify(err)
	}
	return stmt{s}, nil
}

func (c *conn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	cs, err := c.take(ctx, query)
	if err != nil {
		return nil, err
	}
	if cs == nil {
		r, err := c.in().ExecContext(ctx, query, args)
		return r, classify(err)
	}
	defer func() { cs.busy = false }()
	r, err := cs.s.(driver.StmtExecContext).ExecContext(ctx, args)
	return r, classify(err)
}

func (c *conn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	cs, err := c.take(ctx, query)
	if err != nil {
		return nil, err
	}
	if cs == nil {
		r, err := c.in().QueryContext(ctx, query, args)
		if err != nil {
			return nil, classify(err)
		}
		return rows{r}, nil
	}
	r, err := cs.s.(driver.StmtQueryContext).QueryContext(ctx, args)
	if err != nil {
		cs.busy = false
		return nil, classify(err)
	}
	return &cachedRows{rows: rows{r}, cs: cs}, nil
}

func (c *conn) Ping(ctx context.Context) error         { return classify(c.in().Ping(ctx)) }
func (c *conn) ResetSession(ctx context.Context) error { return c.in().ResetSession(ctx) }
func (c *conn) IsValid() bool                          { return c.in().IsValid() }

type tx struct{ driver.Tx }

func (t tx) Commit() error   { return classify(t.Tx.Commit()) }
func (t tx) Rollback() error { return classify(t.Tx.Rollback()) }

type stmt struct{ driver.Stmt }

// Exec and Query are driver.Stmt's own methods: database/sql calls them only when the
// driver's statement lacks the context variants, and the wrapper must pass them on.
func (s stmt) Exec(args []driver.Value) (driver.Result, error) {
	//lint:ignore SA1019 the wrapped interface requires it
	r, err := s.Stmt.Exec(args)
	return r, classify(err)
}

func (s stmt) Query(args []driver.Value) (driver.Rows, error) {
	//lint:ignore SA1019 the wrapped interface requires it
	r, err := s.Stmt.Query(args)
	if err != nil {
		return nil, classify(err)
	}
	return rows{r}, nil
}

func (s stmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	r, err := s.Stmt.(driver.StmtExecContext).ExecContext(ctx, args)
	return r, classify(err)
}

func (s stmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	r, err := s.Stmt.(driver.StmtQueryContext).QueryContext(ctx, args)
	if err != nil {
		return nil, classify(err)
	}
	return rows{r}, nil
}

type rows struct{ driver.Rows }

func (r rows) Next(dest []driver.Value) error { return classify(r.Rows.Next(dest)) }

// The column type methods database/sql looks for on rows: modernc's rows have them all.
func (r rows) ColumnTypeDatabaseTypeName(i int) string {
	return r.Rows.(driver.RowsColumnTypeDatabaseTypeName).ColumnTypeDatabaseTypeName(i)
}

func (r rows) ColumnTypeLength(i int) (int64, bool) {
	return r.Rows.(driver.RowsColumnTypeLength).ColumnTypeLength(i)
}

func (r rows) ColumnTypeNullable(i int) (bool, bool) {
	return r.Rows.(driver.RowsColumnTypeNullable).ColumnTypeNullable(i)
}

func (r rows) ColumnTypePrecisionScale(i int) (int64, int64, bool) {
	return r.Rows.(driver.RowsColumnTypePrecisionScale).ColumnTypePrecisionScale(i)
}

func (r rows) ColumnTypeScanType(i int) reflect.Type {
	return r.Rows.(driver.RowsColumnTypeScanType).ColumnTypeScanType(i)
}
