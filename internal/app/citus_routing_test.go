package app_test

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/airlockhq/airlock/internal/scale"
	"github.com/airlockhq/airlock/internal/store/postgres"
)

// citusHotOps are the operations of the request path whose every statement must be
// routed to one worker on Citus (one task in Citus's plan): a claim and its duplicate, a
// heartbeat, queueing effects, a transition.
var citusHotOps = map[string]bool{"claim": true, "duplicate claim": true, "heartbeat": true, "queue": true, "transition": true}

var citusTaskCount = regexp.MustCompile(`"Task Count": (\d+)`)

// citusFailing are the operations of hotOperations and citusOperations that fail on
// Citus 13.2 today, with why; docs/scaling.md ("What was tried") lists them with
// what would make them hold. TestCitusRouting fails when one of them passes (remove it
// here and there) or another operation fails.
var citusFailing = map[string]string{}

// citusUnplannable are the store methods whose statements Citus refuses to plan (so
// EXPLAIN fails): the causes of citusFailing.
var citusUnplannable = map[string]bool{}

// citusShardByShard are the store methods that take rows of any run on Citus in two
// steps (internal/store/postgres/citus.go): a multi-shard read without locks, then
// statements that each lock or change the rows of one shard. TestCitusRouting fails when
// one of their locking or changing statements runs more than one task.
var citusShardByShard = map[string]bool{
	"EffectLease": true, "EffectClaimUnknown": true, "EffectClaimRecheck": true, "AlertOutboxTake": true, "RunLockKeys": true,
}

var citusLocks = regexp.MustCompile(`(?is)\bFOR\s+UPDATE\b|^\s*(WITH\b.*\b)?(UPDATE|DELETE)\b`)

// TestCitusRouting runs the operations TestCitusPlan runs on a real Citus cluster (a
// coordinator and two workers: scripts/with-citus.sh) and EXPLAINs every statement the
// store sent with its arguments: Citus's plan says how many tasks (shard queries) the
// statement runs. It fails when a statement of a hot operation (citusHotOps) runs more
// than one task, and when a store method's statement runs several tasks while the plan's
// cross-shard table (docs/scaling.md) does not list the method. It logs, per store
// method, the most tasks one of its statements ran: the cross-shard statements measured.
func TestCitusRouting(t *testing.T) {
	if os.Getenv("AIRLOCK_TEST_CITUS") != "1" {
		t.Skip("needs a Citus cluster: run under scripts/with-citus.sh")
	}
	plan := readCitusPlan(t, "../../docs/scaling.md")
	rec := &citusRecorder{open: map[*pgx.Conn]int{}}
	st := scale.OpenTraced(t, rec)
	ctx := context.Background()
	d, r, err := st.CitusPlacement(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d != len(postgres.CitusDistributed) || r != len(postgres.CitusReference) {
		t.Fatalf("after migrate: %d distributed and %d reference tables, want %d and %d", d, r, len(postgres.CitusDistributed), len(postgres.CitusReference))
	}
	e := scale.WithHistory(t, st, 200, 1000)
	rec.set(true)
	failed := map[string]bool{}
	op := func(name string, fn func(ctx context.Context) error) {
		t.Helper()
		err := fn(context.WithValue(ctx, opKey{}, name))
		switch why, known := citusFailing[name]; {
		case err != nil && known:
			failed[name] = true
			t.Logf("known to fail on Citus: %s (%s): %v", name, why, err)
		case err != nil:
			t.Errorf("%s on Citus: %v", name, err)
		case known:
			t.Errorf("%s now passes on Citus: remove it from citusFailing and the docs", name)
		}
	}
	hotOperations(e, st, op)
	citusOperations(t, e, st, op)
	rec.set(false)

	most := map[string]int{}            // store method → most tasks of one statement
	ops := map[string]map[string]bool{} // store method → operations that sent it
	explained := map[string]int{}
	hotSeen := 0
	byShardSeen := map[string]int{}
	for _, s := range rec.stmts {
		if s.method == "" || !dml.MatchString(s.sql) {
			continue
		}
		key := s.sql + "\x00" + fmt.Sprint(s.args)
		tasks, ok := explained[key]
		if !ok {
			tasks, err = citusTasks(ctx, st, s)
			if err != nil && citusUnplannable[s.method] {
				t.Logf("known: Citus does not plan %s (%s): %v", s.method, s.op, err)
				continue
			}
			if err != nil {
				t.Errorf("%s (%s): EXPLAIN on Citus: %v\n%s", s.method, s.op, err, oneLine(s.sql))
				continue
			}
			explained[key] = tasks
		}
		if ops[s.method] == nil {
			ops[s.method] = map[string]bool{}
		}
		ops[s.method][s.op] = true
		most[s.method] = max(most[s.method], tasks)
		if citusHotOps[s.op] {
			hotSeen++
			if tasks > 1 {
				t.Errorf("hot operation %q: %s runs %d tasks on Citus (not routed to one worker):\n%s", s.op, s.method, tasks, oneLine(s.sql))
			}
		}
		if tasks > 1 && plan.cross[s.method] == nil {
			t.Errorf("%s (%s) runs %d tasks on Citus, and the plan's cross-shard table does not list it:\n%s", s.method, s.op, tasks, oneLine(s.sql))
		}
		if citusShardByShard[s.method] && citusLocks.MatchString(s.sql) {
			byShardSeen[s.method]++
			if tasks != 1 {
				t.Errorf("%s (%s) locks or changes rows in a statement of %d tasks on Citus: it must take them shard by shard:\n%s", s.method, s.op, tasks, oneLine(s.sql))
			}
		}
	}
	if hotSeen == 0 {
		t.Fatal("no statement of a hot operation was recorded")
	}
	// The dispatcher records a group of outcomes run by run on Citus (store.RunSharded):
	// no transaction locks the runs of two keys (it would commit with two-phase commit,
	// whose window EventList's horizon cannot see).
	runsLocked := map[int]map[string]bool{}
	for _, s := range rec.stmts {
		if s.method != "RunLockKeys" || s.txn < 0 || len(s.args) == 0 || !strings.HasPrefix(rec.txns[s.txn], "effects.") {
			continue
		}
		if runsLocked[s.txn] == nil {
			runsLocked[s.txn] = map[string]bool{}
		}
		runsLocked[s.txn][fmt.Sprint(s.args[0])] = true
	}
	if len(runsLocked) == 0 {
		t.Error("no transaction of the dispatcher locked a run: the check above saw nothing")
	}
	for txn, keys := range runsLocked {
		if len(keys) > 1 {
			t.Errorf("a transaction begun by %s locked the runs of %d keys on Citus: record run by run", rec.txns[txn], len(keys))
		}
	}
	// The claims of the reconciler find no candidate here (no effect is unknown): the
	// effects suite on Citus runs them (docs/testing.md).
	for _, m := range []string{"EffectLease", "AlertOutboxTake", "RunLockKeys"} {
		if byShardSeen[m] == 0 {
			t.Errorf("%s sent no statement that locks or changes rows: the operations no longer exercise it on Citus", m)
		}
	}
	// The check must be able to fail: an approval link's lookup by token hash alone
	// reaches every shard.
	if most["ApprovalByTokenHash"] < 2 {
		t.Errorf("ApprovalByTokenHash ran %d tasks: a lookup without the run key should reach every shard; is the cluster distributing?", most["ApprovalByTokenHash"])
	}
	// Event ids come from the coordinator's identity sequence (Citus evaluates it there
	// before routing an insert), so they keep today's order within a run; a worker's own
	// sequence range would start at its node id << 48.
	var maxID int64
	if err := st.Pool().QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM events`).Scan(&maxID); err != nil {
		t.Fatal(err)
	}
	if maxID <= 0 || maxID >= 1<<48 {
		t.Errorf("largest event id %d: not from the coordinator's sequence", maxID)
	}
	methods := make([]string, 0, len(most))
	for m := range most {
		methods = append(methods, m)
	}
	sort.Strings(methods)
	var b strings.Builder
	for _, m := range methods {
		names := make([]string, 0, len(ops[m]))
		for o := range ops[m] {
			names = append(names, o)
		}
		sort.Strings(names)
		fmt.Fprintf(&b, "\n  %-28s %3d task(s)  (%s)", m, most[m], strings.Join(names, ", "))
	}
	t.Logf("most tasks per statement on Citus, by store method:%s", b.String())
}

// citusTasks EXPLAINs s with its arguments on the coordinator and returns the most tasks
// one Citus job of its plan runs (0: no distributed table, it runs on the coordinator).
func citusTasks(ctx context.Context, st *postgres.Store, s citusStmt) (int, error) {
	tx, err := st.Pool().Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	rows, err := tx.Query(ctx, "EXPLAIN (FORMAT JSON) "+s.sql, s.args...)
	if err != nil {
		return 0, err
	}
	var out strings.Builder
	for rows.Next() {
		var raw []byte
		if err := rows.Scan(&raw); err != nil {
			rows.Close()
			return 0, err
		}
		out.Write(raw)
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	n := 0
	for _, m := range citusTaskCount.FindAllStringSubmatch(out.String(), -1) {
		v, _ := strconv.Atoi(m[1])
		n = max(n, v)
	}
	return n, nil
}
