package sqlite_test

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/store/sqlite"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// bigTables grow with history; a SCAN of one (rather than a SEARCH through an index)
// costs more the more is kept.
var scan = regexp.MustCompile(`\bSCAN (workflow_runs|effects|events|validations|approvals)\b`)

// TestSQLiteHotQueriesUseIndexes asks SQLite's planner for each hot statement's plan:
// the report reads its window, the purge its candidates, through an index.
func TestSQLiteHotQueriesUseIndexes(t *testing.T) {
	st := storetest.OpenSQLite(t, nil).(*sqlite.Store)
	for sql, nargs := range sqlite.HotStatementsForTest() {
		args := make([]any, nargs)
		for i := range args {
			args[i] = int64(1)
		}
		rows, err := st.DB().QueryContext(context.Background(), "EXPLAIN QUERY PLAN "+sql, args...)
		if err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		var plan []string
		for rows.Next() {
			var id, parent, notused int
			var detail string
			if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		rows.Close()
		if m := scan.FindString(strings.Join(plan, "\n")); m != "" {
			t.Errorf("%s:\n%s\n%s", m, strings.TrimSpace(sql), strings.Join(plan, "\n"))
		}
	}
}
