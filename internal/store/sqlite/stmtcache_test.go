package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/airlockhq/airlock/internal/store/sqlite"
)

func openDB(t *testing.T) *sql.DB {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "a.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st.DB()
}

func ints(t *testing.T, rows *sql.Rows, n int) []int {
	t.Helper()
	var out []int
	for len(out) < n && rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	return out
}

// A connection prepares a statement once and runs it again with other arguments; the
// same text run while its rows are still open gets a statement of its own, so neither
// reads the other's rows.
func TestStatementCache(t *testing.T) {
	db := openDB(t)
	ctx := context.Background()
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const q = `SELECT value FROM json_each(?) ORDER BY key`
	for i := range 50 {
		var v int
		if err := c.QueryRowContext(ctx, q, fmt.Sprintf("[%d]", i)).Scan(&v); err != nil || v != i {
			t.Fatalf("run %d: %d, %v", i, v, err)
		}
	}
	var kept int
	_ = c.Raw(func(dc any) error { kept = sqlite.CachedStatementsForTest(dc); return nil })
	if kept != 1 {
		t.Fatalf("the connection keeps %d statements after 50 runs of one, want 1", kept)
	}

	outer, err := c.QueryContext(ctx, q, `[1, 2, 3]`)
	if err != nil {
		t.Fatal(err)
	}
	first := ints(t, outer, 1)
	inner, err := c.QueryContext(ctx, q, `[7, 8]`)
	if err != nil {
		t.Fatal(err)
	}
	if got := ints(t, inner, 10); fmt.Sprint(got) != "[7 8]" {
		t.Fatalf("nested rows %v, want [7 8]", got)
	}
	inner.Close()
	if got := append(first, ints(t, outer, 10)...); fmt.Sprint(got) != "[1 2 3]" {
		t.Fatalf("outer rows %v, want [1 2 3]", got)
	}
	outer.Close()

	// Past the bound, the least recently used statements are closed; every text still
	// runs, with its own arguments.
	for round := range 2 {
		for i := range 300 {
			var v int
			if err := c.QueryRowContext(ctx, fmt.Sprintf(`SELECT ? + %d`, i), round).Scan(&v); err != nil || v != i+round {
				t.Fatalf("round %d, text %d: %d, %v", round, i, v, err)
			}
		}
	}
	_ = c.Raw(func(dc any) error { kept = sqlite.CachedStatementsForTest(dc); return nil })
	if kept > 128 {
		t.Fatalf("the connection keeps %d statements, bound 128", kept)
	}
	// An exec, and an error, leave the statement usable.
	if _, err := c.ExecContext(ctx, `CREATE TABLE t (v INTEGER PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		_, err := c.ExecContext(ctx, `INSERT INTO t (v) VALUES (?)`, 1)
		if (i == 0) != (err == nil) {
			t.Fatalf("insert %d: %v", i, err)
		}
	}
	var n int
	if err := c.QueryRowContext(ctx, `SELECT count(*) FROM t`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("count %d, %v", n, err)
	}
}
