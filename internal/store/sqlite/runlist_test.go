package sqlite_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/sqlite"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// TestRunListUsesIndexes asks SQLite's planner for the runs list's plan with each filter:
// the runs are read in the order of an index (stopping at the page's limit), never
// sorted in a temporary b-tree or read without an index; effects and approvals are
// looked up by the run's key. A key prefix is a range of the primary key, whose matches
// alone are sorted.
func TestRunListUsesIndexes(t *testing.T) {
	st := storetest.OpenSQLite(t, nil).(*sqlite.Store)
	old := time.Now()
	for _, p := range []store.RunListParams{
		{}, {State: store.StateCompleted}, {KeyPrefix: "ticket-"}, {OlderThan: &old},
		{ActionType: "refund"}, {State: store.StateAwaitingHuman, ActionType: "refund", After: store.Cursor{At: old, ID: "k"}},
		{After: store.Cursor{At: old, ID: "k"}},
	} {
		p.Limit = 50
		sql, args := sqlite.RunListSQLForTest(p)
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
		text := strings.Join(plan, "\n")
		for _, line := range plan {
			if (strings.Contains(line, "SCAN ") && !strings.Contains(line, "USING INDEX") && !strings.Contains(line, "USING COVERING INDEX")) ||
				(strings.Contains(line, "TEMP B-TREE") && p.KeyPrefix == "") {
				t.Errorf("%+v: %q in the plan\n%s\n%s", p, line, sql, text)
			}
		}
	}
}
