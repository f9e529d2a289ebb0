package scale_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/scale"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// walWrites counts, per relation of the store's schema, the heap and index records
// PostgreSQL wrote to its WAL between two positions: an index's count is the number of
// entries the operation inserted into it (a leaf insert, a posting-list insert or a
// leaf split each carry one new entry).
type walWrites map[string]int

var walRel = regexp.MustCompile(`rel \d+/\d+/(\d+)`)

// walCount reads pg_walinspect's records from start to now and counts those that insert
// an index entry or a heap tuple into a relation named in rels (relfilenode → name), the
// row locks and speculative-insert confirmations written to them, and under "WAL records"
// every record of the transactions that wrote to them (their commit records included;
// other tests' transactions in the same cluster are not counted).
func walCount(t *testing.T, pool *pgxpool.Pool, walinspect string, rels map[string]string, start string) walWrites {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT xid::text, resource_manager, record_type, coalesce(block_ref, '')
		FROM `+walinspect+`.pg_get_wal_records_info_till_end_of_wal($1::pg_lsn)`, start)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := walWrites{}
	perXid := map[string]int{}
	ours := map[string]bool{}
	for rows.Next() {
		var xid, rm, typ, ref string
		if err := rows.Scan(&xid, &rm, &typ, &ref); err != nil {
			t.Fatal(err)
		}
		perXid[xid]++
		m := walRel.FindStringSubmatch(ref)
		if m == nil || rels[m[1]] == "" {
			continue
		}
		ours[xid] = true
		switch {
		case rm == "Btree" && (typ == "INSERT_LEAF" || typ == "INSERT_POST" || typ == "SPLIT_L" || typ == "SPLIT_R"):
			out[rels[m[1]]]++
		case rm == "Heap" && (typ == "INSERT" || typ == "INSERT+INIT" || typ == "UPDATE" || typ == "UPDATE+INIT"):
			out[rels[m[1]]+" (row)"]++
		case rm == "Heap" && (typ == "HOT_UPDATE" || typ == "HOT_UPDATE+INIT"):
			out[rels[m[1]]+" (HOT row)"]++
		case rm == "Heap" && typ == "LOCK":
			out[rels[m[1]]+" (lock)"]++
		case rm == "Heap" && typ == "HEAP_CONFIRM":
			out[rels[m[1]]+" (confirm)"]++
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for xid := range ours {
		if xid != "0" {
			out["WAL records"] += perXid[xid]
		}
	}
	return out
}

func (w walWrites) String() string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(w)) {
		fmt.Fprintf(&b, "%s=%d ", k, w[k])
	}
	return strings.TrimSpace(b.String())
}

// TestIndexEntriesPerOperation reads PostgreSQL's WAL (pg_walinspect) around one claim
// and around one effect's life (queue, lease, begin-mark, outcome) and holds each to the
// index entries docs/benchmarks.md lists ("Index entries per claim and per effect"):
// an index added to the hot path, or a partial index widened, fails it. Every row
// version written into effects, workflow_runs or events is an entry in each of the
// table's indexes whose predicate it satisfies, unless the update is HOT.
func TestIndexEntriesPerOperation(t *testing.T) {
	ctx := context.Background()
	st := scale.OpenTraced(t, nil)
	pool := st.Pool()
	var available bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_available_extensions WHERE name = 'pg_walinspect')`).Scan(&available); err != nil {
		t.Fatal(err)
	}
	if !available {
		if os.Getenv("CI") != "" {
			t.Fatal("pg_walinspect is not installed (PostgreSQL's contrib modules)")
		}
		t.Skip("pg_walinspect is not installed (PostgreSQL's contrib modules)")
	}
	// The extension is the database's, in whichever schema made it first (a run on
	// another server may have put it in public): call it by that schema's name.
	if _, err := pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_walinspect SCHEMA public`); err != nil {
		t.Fatal(err)
	}
	var walinspect string
	if err := pool.QueryRow(ctx, `SELECT quote_ident(extnamespace::regnamespace::text) FROM pg_extension WHERE extname = 'pg_walinspect'`).Scan(&walinspect); err != nil {
		t.Fatal(err)
	}
	e := apptest.NewEffectsEnv(t, storetest.Backend{Name: "postgres", Open: func(testing.TB, *storetest.Clock) store.Store { return st }}, "")
	// A first run and effect, so that no count below includes a table's first page.
	e.Queue(t, "warm", "note", "default", `{"n":1}`)
	e.Tick(t)

	rels := map[string]string{}
	rows, err := pool.Query(ctx, `SELECT c.relfilenode::text, c.relname FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'i')`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var node, name string
		if err := rows.Scan(&node, &name); err != nil {
			t.Fatal(err)
		}
		rels[node] = name
	}
	rows.Close()
	lsn := func() string {
		var s string
		if err := pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}

	start := lsn()
	r := e.ClaimRun(t, "idx-1")
	claim := walCount(t, pool, walinspect, rels, start)

	start = lsn()
	eff := e.Queue(t, r.Key, "note", "default", `{"n":1}`)
	queue := walCount(t, pool, walinspect, rels, start)
	start = lsn()
	e.Tick(t)
	if s := e.EffectState(t, eff.ID); s != store.EffectCompleted {
		t.Fatalf("effect %s after a tick: %s", eff.ID, s)
	}
	send := walCount(t, pool, walinspect, rels, start)
	// An idempotent type's (crm): its lease is its begin-mark.
	folded := e.Queue(t, r.Key, "crm", "default", `{"n":2}`)
	start = lsn()
	e.Tick(t)
	if s := e.EffectState(t, folded.ID); s != store.EffectCompleted {
		t.Fatalf("effect %s after a tick: %s", folded.ID, s)
	}
	sendFolded := walCount(t, pool, walinspect, rels, start)
	t.Logf("claim: %s", claim)
	t.Logf("queue: %s", queue)
	t.Logf("lease + begin-mark + outcome: %s", send)
	t.Logf("lease that begins + outcome: %s", sendFolded)

	for _, c := range []struct {
		op        string
		got, want walWrites
	}{
		{"claim", claim, walWrites{
			"workflow_runs (row)": 1, "workflow_runs_pkey": 1,
			// The runs list of every state reads workflow_runs_state_created, one range
			// per state (0036 dropped workflow_runs_created).
			"workflow_runs_state_created": 1, "workflow_runs_key_bytes": 1,
			"events (row)": 1, "events_pkey": 1, "events_run_key_xid_id": 1, "events_at": 1,
			// The run's insert is speculative (ON CONFLICT: a reclaim updates it instead);
			// it carries the chain head, which the claim statement computes (0035).
			"workflow_runs (confirm)": 1, "WAL records": 10,
		}},
		{"queue", queue, walWrites{
			// No counter row: a pending effect is counted from effects_due (0038).
			"effects (row)": 1, "effects_pkey": 1, "effects_run_effect": 1, "effects_due": 1,
			"events (row)": 1, "events_pkey": 1, "events_run_key_xid_id": 1, "events_at": 1,
			// The run's row twice, HOT: its open-effect count and its chain head (0035).
			"workflow_runs (HOT row)": 2,
			// The run's row lock (the queue holds the run while it checks its state), the
			// effect's speculative insert (ON CONFLICT: a retried queue returns the first);
			// the chain head is updated without a lock record of its own (0034).
			"workflow_runs (lock)": 1, "effects (confirm)": 1, "WAL records": 13,
		}},
		// The lease and the outcome are full row versions, the begin-mark a HOT one.
		{"lease + begin-mark + outcome", send, walWrites{
			"effects (row)": 2, "effects (HOT row)": 1, "effects_pkey": 2, "effects_run_effect": 2,
			// One counter row, the outcome's settled state (0038: the lease's states and
			// the outcome's sending are counted from their partial indexes).
			"effects_sending": 1, "effects_purge_at": 1, "effect_count_deltas (row)": 1,
			"events (row)": 1, "events_pkey": 1, "events_run_key_xid_id": 1, "events_at": 1,
			"workflow_runs (HOT row)": 1, // the chain head, in the run's row (0035)
			// The outcome group's run lock and the effect's row lock; three transactions
			// (lease, begin-mark, outcome), three commit records.
			"workflow_runs (lock)": 1, "effects (lock)": 1, "WAL records": 20,
		}},
		// An idempotent type's lease writes its begin-mark in the same row version: no HOT
		// version, one transaction (and commit record) fewer.
		{"lease that begins + outcome", sendFolded, walWrites{
			"effects (row)": 2, "effects_pkey": 2, "effects_run_effect": 2,
			"effects_sending": 1, "effects_purge_at": 1, "effect_count_deltas (row)": 1,
			"events (row)": 1, "events_pkey": 1, "events_run_key_xid_id": 1, "events_at": 1,
			"workflow_runs (HOT row)": 1, "workflow_runs (lock)": 1, "effects (lock)": 1, "WAL records": 18,
		}},
	} {
		if c.got.String() != c.want.String() {
			t.Errorf("%s writes\n  %s\nwant\n  %s", c.op, c.got, c.want)
		}
	}
}
