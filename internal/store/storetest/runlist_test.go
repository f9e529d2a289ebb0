package storetest

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/postgres"
	"github.com/airlockhq/airlock/internal/store/sqlite"
)

// TestRunList holds RunList to the rows a filter and a sort in Go give over the same
// runs: every combination of the filters, each read in keyset pages of 1, 3 and 50. The
// runs share their creation times across states (ties broken by key), so pages end
// between runs of different states created at the same moment, and the runs list of every
// state, which PostgreSQL merges from one index range per state, must interleave them
// exactly as one sort would.
func TestRunList(t *testing.T) { each(t, testRunList) }

// TestRunStatesMatchTheSchema holds store.States to the run states the schema's CHECK
// constraint allows: PostgreSQL's runs list of every state reads one range per state of
// store.States, so a state missing from it would be missing from the list.
func TestRunStatesMatchTheSchema(t *testing.T) { each(t, testRunStatesMatchTheSchema) }

// listedRun is what the reference filter knows of a run.
type listedRun struct {
	key     string
	state   store.State
	created time.Time
	expires time.Time
	types   []string
}

func testRunList(t *testing.T, e *env) {
	start := e.Clock.Now()
	// Keys without punctuation, of one length: byte order is every collation's order.
	states := []store.State{store.StateProcessing, store.StateCompleted, store.StateAwaitingHuman, store.StateFailedTerminal, store.StateProcessing}
	var runs []listedRun
	for i := range 20 {
		prefix := "a"
		if i%3 == 0 {
			prefix = "b"
		}
		r := listedRun{
			key: fmt.Sprintf("%s%02d", prefix, (i*7)%20), state: states[i%len(states)],
			// Four moments, five runs each, of several states.
			created: start.Add(time.Duration(i/5) * time.Minute),
		}
		at := r.created
		got, err := e.Store.RunClaim(ctx, store.RunClaimParams{Key: r.key, PayloadHash: "h", Owner: "o", Lease: time.Duration(i+1) * time.Minute, Now: &at})
		if err != nil {
			t.Fatal(err)
		}
		r.created, r.expires = got.CreatedAt, *got.LeaseExpiresAt
		if r.state != store.StateProcessing {
			ExecRaw(t, e.Store, fmt.Sprintf(`UPDATE workflow_runs SET state = '%s' WHERE idempotency_key = '%s'`, r.state, r.key))
		}
		switch i % 4 {
		case 1:
			r.types = []string{"note"}
		case 2:
			r.types = []string{"note", "task"}
		case 3:
			r.types = []string{"refund"} // an approval's
		}
		for _, typ := range r.types {
			if typ == "refund" {
				if err := e.Store.ApprovalInsert(ctx, store.Approval{ID: "ap-" + r.key, RunKey: r.key, TokenHash: "th-" + r.key,
					Mode: "approve_before_act", AllowedDecisions: []string{"approve", "reject"}, ExpiresAt: start.Add(time.Hour),
					RequestedBy: "test", ApproverRoles: []string{"lead"}, ActionType: typ, Target: "default", EffectID: "e",
					Executor: "dispatcher", Payload: json.RawMessage(`{}`), PayloadHash: "h", CreatedAt: at}); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if _, _, err := e.Store.EffectInsert(ctx, store.Effect{ID: "ef-" + typ + "-" + r.key, RunKey: r.key, EffectID: typ,
				ActionType: typ, Target: "default", Executor: "dispatcher", Payload: json.RawMessage(`{}`), PayloadHash: "h",
				State: store.EffectPending, NotBefore: at, CreatedAt: at}); err != nil {
				t.Fatal(err)
			}
		}
		runs = append(runs, r)
	}
	// Newest first, the key breaking ties.
	slices.SortFunc(runs, func(a, b listedRun) int {
		if c := b.created.Compare(a.created); c != 0 {
			return c
		}
		return strings.Compare(b.key, a.key)
	})

	older, stalled := start.Add(time.Minute), start.Add(3*time.Minute)
	cases := 0
	for _, state := range []store.State{"", store.StateProcessing, store.StateCompleted} {
		for _, typ := range []string{"", "note", "refund"} {
			for _, olderThan := range []*time.Time{nil, &older} {
				for _, prefix := range []string{"", "a"} {
					for _, stalledAt := range []*time.Time{nil, &stalled} {
						p := store.RunListParams{State: state, ActionType: typ, OlderThan: olderThan, KeyPrefix: prefix, StalledAt: stalledAt}
						var want []string
						for _, r := range runs {
							if (state == "" || r.state == state) && (typ == "" || slices.Contains(r.types, typ)) &&
								(olderThan == nil || !r.created.After(*olderThan)) && strings.HasPrefix(r.key, prefix) &&
								(stalledAt == nil || r.state == store.StateProcessing && !r.expires.After(*stalledAt)) {
								want = append(want, r.key)
							}
						}
						for _, limit := range []int{1, 3, 50} {
							p.Limit, p.After = limit, store.Cursor{}
							var got []string
							for page := 0; ; page++ {
								if page > len(runs) {
									t.Fatalf("%+v: more pages than runs", p)
								}
								rs, err := e.Store.RunList(ctx, p)
								if err != nil {
									t.Fatalf("%+v: %v", p, err)
								}
								for _, r := range rs {
									got = append(got, r.Key)
								}
								if len(rs) < limit {
									break
								}
								last := rs[len(rs)-1]
								p.After = store.Cursor{At: last.CreatedAt, ID: last.Key}
							}
							if !slices.Equal(got, want) {
								t.Errorf("state %q, action type %q, older than %v, prefix %q, stalled at %v, pages of %d:\n got %v\nwant %v",
									state, typ, olderThan != nil, prefix, stalledAt != nil, limit, got, want)
							}
							cases++
						}
					}
				}
			}
		}
	}
	t.Logf("%d filter combinations and page sizes listed", cases)
}

var checkedStates = regexp.MustCompile(`state\)?\s+IN\s*\(([^)\]]*)[)\]]`)

func testRunStatesMatchTheSchema(t *testing.T, e *env) {
	// The runs' CHECK constraint (PostgreSQL writes it "state = ANY (ARRAY[…])"),
	// or SQLite's table definition, whose first "state IN (…)" is the runs'.
	var def string
	var err error
	switch s := e.Store.(type) {
	case *postgres.Store:
		err = s.Pool().QueryRow(ctx, `SELECT replace(pg_get_constraintdef(c.oid), 'state = ANY (ARRAY[', 'state IN (') FROM pg_constraint c
			WHERE c.conrelid = 'workflow_runs'::regclass AND c.contype = 'c' AND pg_get_constraintdef(c.oid) LIKE '%state%'`).Scan(&def)
	case *sqlite.Store:
		err = s.DB().QueryRowContext(ctx, `SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'workflow_runs'`).Scan(&def)
	}
	if err != nil {
		t.Fatal(err)
	}
	m := checkedStates.FindStringSubmatch(def)
	if m == nil {
		t.Fatalf("no state IN (…) in the runs table's definition: %s", def)
	}
	var schema []string
	for _, s := range regexp.MustCompile(`'([a-z_]+)'`).FindAllStringSubmatch(m[1], -1) {
		schema = append(schema, s[1])
	}
	var ours []string
	for _, s := range store.States {
		ours = append(ours, string(s))
	}
	slices.Sort(schema)
	slices.Sort(ours)
	if !slices.Equal(schema, ours) {
		t.Fatalf("the schema's run states %v, store.States %v", schema, ours)
	}
}
