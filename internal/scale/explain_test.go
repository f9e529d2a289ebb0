package scale_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/airlockhq/airlock/internal/scale"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/postgres"
)

// sqlRecorder is a pgx tracer that keeps every statement the store sends while on.
type sqlRecorder struct {
	mu    sync.Mutex
	on    bool
	stmts []recordedSQL
	seen  map[string]bool
}

type recordedSQL struct {
	sql  string
	args []any
	op   string
}

func (r *sqlRecorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.on && !r.seen[d.SQL] {
		r.seen[d.SQL] = true
		r.stmts = append(r.stmts, recordedSQL{sql: d.SQL, args: d.Args, op: scale.OpName(ctx)})
	}
	return ctx
}

func (r *sqlRecorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// bigTables are those GenerateScale fills: a sequential scan of one is a cost that grows
// with history.
var bigTables = map[string]bool{"workflow_runs": true, "effects": true, "events": true, "validations": true, "approvals": true}

var seqScan = regexp.MustCompile(`Seq Scan on (\w+)`)

// TestHotQueriesUseIndexes runs every hot operation — claim, duplicate claim, queue,
// dispatch, worker claim, heartbeat, transition, explain, report, purge (dry and real),
// the effects-by-state count, the console's three lists — on PostgreSQL with generated history and fresh
// statistics, records every statement the store sent, and EXPLAINs each with the
// arguments it was sent with: none may read a big table sequentially.
func TestHotQueriesUseIndexes(t *testing.T) {
	rec := &sqlRecorder{seen: map[string]bool{}}
	st := scale.OpenTraced(t, rec)
	ctx := context.Background()
	e := scale.WithHistory(t, st, 20000, 100000)
	rec.mu.Lock()
	rec.on = true
	rec.mu.Unlock()
	op := func(name string, fn func(ctx context.Context) error) {
		t.Helper()
		if err := fn(context.WithValue(ctx, scale.OpKey{}, name)); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	scale.HotOperations(e, st, op)
	rec.mu.Lock()
	rec.on = false
	stmts := rec.stmts
	rec.mu.Unlock()

	explained, used, plans := explainNoSeqScan(t, st, stmts)
	if explained < 20 {
		t.Fatalf("only %d statements explained: the recorder missed the operations", explained)
	}
	t.Logf("%d statements explained", explained)
	for _, op := range slices.Sorted(maps.Keys(used)) {
		t.Logf("%s reads %s", op, strings.Join(slices.Sorted(maps.Keys(used[op])), ", "))
	}
	// The narrowed indexes of 0023 still serve the reads they were made for: the purge's
	// candidates, the report's details and gate waits, and "runs with an effect of this
	// type" (index-only through the unique key, which carries the type).
	for op, index := range map[string]string{
		"purge": "effects_purge_at", "report": "events_report_kind_at", "runs list": "effects_run_effect",
	} {
		if !used[op][index] {
			t.Errorf("%s does not read %s; it reads %v", op, index, slices.Sorted(maps.Keys(used[op])))
		}
	}
	// The runs list of every state (no state filter) reads one range of
	// workflow_runs_state_created per state, newest first, and merges them (0036 dropped
	// the (created_at, key) index it read before): never a sort of the table.
	// Without a key prefix the page's size is in the statement's text, so a prepared
	// statement takes its generic plan after five runs: that plan must be the same merge.
	merged, generic := 0, 0
	for _, p := range plans {
		if p.op != "runs list" || !strings.Contains(p.sql, "UNION ALL") {
			continue
		}
		merged++
		if err := mergedRunList(p.plan); err != nil {
			t.Errorf("runs list: %v:\n%s\n%s", err, strings.TrimSpace(p.sql), p.plan)
		}
		if !strings.Contains(p.sql, `COLLATE "C"`) {
			generic++
			if plan := explainGeneric(t, st, p.sql, p.args); mergedRunList(plan) != nil {
				t.Errorf("runs list, generic plan: %v:\n%s\n%s", mergedRunList(plan), strings.TrimSpace(p.sql), plan)
			}
		}
	}
	if merged < 6 || generic < 4 {
		t.Errorf("only %d runs list statements of every state explained, %d of them generic", merged, generic)
	}
	// The effects-by-state count reads each open state from the partial index that holds
	// exactly its rows, index-only (0038): nothing of the settled history.
	counted := 0
	for _, p := range plans {
		if !strings.Contains(p.sql, "FROM effects WHERE state = 'pending'") {
			continue
		}
		counted++
		for _, index := range []string{"effects_due", "effects_sending", "effects_unknown_due"} {
			if !strings.Contains(p.plan, "Index Only Scan using "+index+" on effects") {
				t.Errorf("the effect count does not read %s index-only:\n%s", index, p.plan)
			}
		}
		if n := strings.Count(p.plan, " on effects "); n != 3 {
			t.Errorf("the effect count reads effects %d times, want 3 (one partial index per open state):\n%s", n, p.plan)
		}
	}
	if counted != 1 {
		t.Errorf("%d effect count statements explained, want 1", counted)
	}
}

// explainGeneric EXPLAINs the generic plan of sql (plan_cache_mode =
// force_generic_plan): the one its prepared statement may take after five runs.
func explainGeneric(t testing.TB, st *postgres.Store, sql string, args []any) string {
	t.Helper()
	ctx := context.Background()
	tx, err := st.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	values := make([]string, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case string:
			values[i] = "'" + strings.ReplaceAll(v, "'", "''") + "'"
		case time.Time:
			values[i] = "'" + v.Format(time.RFC3339Nano) + "'"
		case int:
			values[i] = strconv.Itoa(v)
		default:
			t.Fatalf("explainGeneric: an argument of type %T", a)
		}
	}
	execute := "EXPLAIN EXECUTE airlock_generic"
	if len(values) > 0 {
		execute += "(" + strings.Join(values, ", ") + ")"
	}
	var plan []string
	for _, stmt := range []string{"SET LOCAL plan_cache_mode = force_generic_plan", "PREPARE airlock_generic AS " + sql,
		execute, "DEALLOCATE airlock_generic"} {
		// The simple protocol, as is: the statement's own $n are the prepared statement's.
		res, err := tx.Conn().PgConn().Exec(ctx, stmt).ReadAll()
		if err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
		if stmt == execute {
			for _, row := range res[0].Rows {
				plan = append(plan, string(row[0]))
			}
		}
	}
	return strings.Join(plan, "\n")
}

// mergedRunList checks the plan of a runs list of every state: a Merge Append under the
// page's Limit, each state's branch an ordered read of workflow_runs_state_created — or,
// for a key prefix the planner finds few of, that prefix's range of
// workflow_runs_key_bytes sorted — and no other sort.
func mergedRunList(plan string) error {
	lines := strings.Split(plan, "\n")
	merge := slices.IndexFunc(lines, func(l string) bool { return strings.Contains(l, "Merge Append") })
	if merge < 0 {
		return errors.New("no Merge Append")
	}
	for _, l := range lines[:merge] {
		if planNode.MatchString(l) && !strings.Contains(l, "Limit") {
			return fmt.Errorf("%q above the Merge Append", strings.TrimSpace(l))
		}
	}
	branches := 0
	for i, l := range lines {
		switch {
		case strings.Contains(l, "Index Scan Backward using workflow_runs_state_created"):
			branches++
		case sortNode.MatchString(l):
			var below []string
			for _, m := range lines[i+1:] {
				if planNode.MatchString(m) {
					if below = append(below, m); len(below) == 2 {
						break
					}
				}
			}
			if !strings.Contains(strings.Join(below, "\n"), "workflow_runs_key_bytes") {
				return fmt.Errorf("a sort of other than a key prefix's runs: %q", strings.Join(below, " / "))
			}
			branches++
		}
	}
	if branches != len(store.States) {
		return fmt.Errorf("%d branches read in order, want one per state (%d)", branches, len(store.States))
	}
	return nil
}

// planNode matches a plan node's line in EXPLAIN's text format (with costs), not its details.
var planNode = regexp.MustCompile(`\(cost=`)

var sortNode = regexp.MustCompile(`^\s*(->\s+)?(Incremental )?Sort\s+\(cost=`)

var indexScan = regexp.MustCompile(`(?:Index|Index Only|Bitmap Index) Scan (?:Backward )?(?:using|on) (\w+)`)

// explainedPlan is one recorded statement's plan.
type explainedPlan struct {
	op, sql, plan string
	args          []any
}

// explainNoSeqScan EXPLAINs each recorded query or data change with the arguments it was
// sent with and reports an error for each sequential scan of a big table; it returns how
// many it explained, the indexes each operation's plans read, and the plans.
func explainNoSeqScan(t testing.TB, st *postgres.Store, stmts []recordedSQL) (int, map[string]map[string]bool, []explainedPlan) {
	t.Helper()
	ctx := context.Background()
	explained := 0
	used := map[string]map[string]bool{}
	var plans []explainedPlan
	for _, s := range stmts {
		if !scale.DML.MatchString(s.sql) {
			continue
		}
		rows, err := st.Pool().Query(ctx, "EXPLAIN "+s.sql, s.args...)
		if err != nil {
			t.Fatalf("explain (%s) %s: %v", s.op, s.sql, err)
		}
		var plan []string
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, line)
		}
		rows.Close()
		explained++
		plans = append(plans, explainedPlan{s.op, s.sql, strings.Join(plan, "\n"), s.args})
		for _, m := range indexScan.FindAllStringSubmatch(strings.Join(plan, "\n"), -1) {
			if used[s.op] == nil {
				used[s.op] = map[string]bool{}
			}
			used[s.op][m[1]] = true
		}
		for _, m := range seqScan.FindAllStringSubmatch(strings.Join(plan, "\n"), -1) {
			if bigTables[m[1]] {
				t.Errorf("%s: a sequential scan of %s:\n%s\n%s", s.op, m[1], strings.TrimSpace(s.sql), strings.Join(plan, "\n"))
			}
		}
	}
	return explained, used, plans
}
