package storetest

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/postgres"
	"github.com/airlockhq/airlock/internal/store/sqlite"
)

// DumpAll renders every row of every table as text, for tests that search the whole
// database for something that must not be there.
func DumpAll(t testing.TB, st store.Store) string {
	t.Helper()
	ctx := context.Background()
	var b strings.Builder
	switch s := st.(type) {
	case *postgres.Store:
		rows, err := s.Pool().Query(ctx, `SELECT table_name FROM information_schema.tables
			WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' ORDER BY table_name`)
		if err != nil {
			t.Fatal(err)
		}
		var tables []string
		for rows.Next() {
			var name string
			if err := rows.Scan(&name); err != nil {
				t.Fatal(err)
			}
			tables = append(tables, name)
		}
		rows.Close()
		for _, table := range tables {
			// Ordered: a distributed table (Citus) returns its shards' rows in the order
			// they arrive, so two dumps of the same rows would differ.
			rows, err := s.Pool().Query(ctx, `SELECT row_to_json(t)::text FROM `+table+` t ORDER BY 1`)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var line string
				if err := rows.Scan(&line); err != nil {
					t.Fatal(err)
				}
				fmt.Fprintf(&b, "%s: %s\n", table, line)
			}
			rows.Close()
		}
	case *sqlite.Store:
		rows, err := s.DB().QueryContext(ctx, `SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name`)
		if err != nil {
			t.Fatal(err)
		}
		var tables []string
		for rows.Next() {
			var name string
			if err := rows.Scan(&name); err != nil {
				t.Fatal(err)
			}
			tables = append(tables, name)
		}
		rows.Close()
		for _, table := range tables {
			rows, err := s.DB().QueryContext(ctx, `SELECT * FROM "`+table+`"`)
			if err != nil {
				t.Fatal(err)
			}
			cols, _ := rows.Columns()
			for rows.Next() {
				vals := make([]any, len(cols))
				ptrs := make([]any, len(cols))
				for i := range vals {
					ptrs[i] = &vals[i]
				}
				if err := rows.Scan(ptrs...); err != nil {
					t.Fatal(err)
				}
				fmt.Fprintf(&b, "%s:", table)
				for _, v := range vals {
					if bs, ok := v.([]byte); ok {
						v = string(bs)
					}
					fmt.Fprintf(&b, " %v", v)
				}
				b.WriteString("\n")
			}
			rows.Close()
		}
	default:
		t.Fatalf("DumpAll: unknown store %T", st)
	}
	return b.String()
}

// ExecRaw runs one statement on st's database, for tests that plant rows.
func ExecRaw(t testing.TB, st store.Store, sql string, args ...any) {
	t.Helper()
	var err error
	switch s := st.(type) {
	case *postgres.Store:
		_, err = s.Pool().Exec(context.Background(), sql, args...)
	case *sqlite.Store:
		_, err = s.DB().ExecContext(context.Background(), sql, args...)
	default:
		t.Fatalf("no raw exec for a %T", st)
	}
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}
