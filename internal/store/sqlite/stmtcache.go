package sqlite

import (
	"context"
	"database/sql/driver"
)

// Each connection keeps the statements it prepared, by their text, and runs a query or
// exec through the prepared statement when it has one. modernc's connection prepares a
// statement for every call and finalizes it after, and in the outbox's dispatch profile
// preparing was 38% of the CPU: the store's statements are a fixed set of texts (plus a
// few whose IN lists vary in length), so each connection prepares each of them once.
//
// database/sql uses a connection from one goroutine at a time, but rows may still be
// open while another statement runs on the same connection: a statement is lent to one
// call at a time (busy until its rows are closed), and a call that finds it busy
// prepares a statement of its own for that call alone, as the driver does.

// stmtCacheSize bounds the statements a connection keeps; past it, the least recently
// used idle one is closed.
const stmtCacheSize = 128

// stmtCacheMaxLen leaves long texts (migrations, scripts) to the driver's own path.
const stmtCacheMaxLen = 8 << 10

type cachedStmt struct {
	s    driver.Stmt
	busy bool
	used uint64
}

type stmtCache struct {
	m    map[string]*cachedStmt
	tick uint64
}

// take lends the prepared statement for query, preparing it if needed; nil (and no error)
// when the call should go through the driver's own path.
func (c *conn) take(ctx context.Context, query string) (*cachedStmt, error) {
	if len(query) > stmtCacheMaxLen {
		return nil, nil
	}
	if c.stmts.m == nil {
		c.stmts.m = map[string]*cachedStmt{}
	}
	c.stmts.tick++
	if cs := c.stmts.m[query]; cs != nil {
		if cs.busy {
			return nil, nil
		}
		cs.busy, cs.used = true, c.stmts.tick
		return cs, nil
	}
	s, err := c.in().PrepareContext(ctx, query)
	if err != nil {
		return nil, classify(err)
	}
	if len(c.stmts.m) >= stmtCacheSize {
		c.evict()
	}
	cs := &cachedStmt{s: s, busy: true, used: c.stmts.tick}
	c.stmts.m[query] = cs
	return cs, nil
}

// evict closes the least recently used idle statement.
func (c *conn) evict() {
	var oldest string
	var at uint64
	for q, cs := range c.stmts.m {
		if !cs.busy && (oldest == "" || cs.used < at) {
			oldest, at = q, cs.used
		}
	}
	if oldest != "" {
		_ = c.stmts.m[oldest].s.Close()
		delete(c.stmts.m, oldest)
	}
}

// closeStmts closes every kept statement (the connection is closing).
func (c *conn) closeStmts() {
	for q, cs := range c.stmts.m {
		_ = cs.s.Close()
		delete(c.stmts.m, q)
	}
}

// cachedRows gives the statement back when its rows are closed.
type cachedRows struct {
	rows
	cs *cachedStmt
}

func (r *cachedRows) Close() error {
	err := r.rows.Close()
	r.cs.busy = false
	return err
}
