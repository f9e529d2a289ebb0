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
// the report reads its window, the purge its candidates, through an index — for the
// statements whose partial index 0023 narrowed, that index (SQLite uses a partial index
// only when the query repeats its WHERE terms).
func TestSQLiteHotQueriesUseIndexes(t *testing.T) {
	st := storetest.OpenSQLite(t, nil).(*sqlite.Store)
	want := sqlite.HotStatementIndexesForTest()
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
		if index := want[sql]; index != "" && !regexp.MustCompile(`USING (COVERING )?INDEX `+index+`\b`).MatchString(strings.Join(plan, "\n")) {
			t.Errorf("does not read %s:\n%s\n%s", index, strings.TrimSpace(sql), strings.Join(plan, "\n"))
		}
		delete(want, sql)
	}
	if len(want) > 0 {
		t.Errorf("not explained: %v", want)
	}
}
