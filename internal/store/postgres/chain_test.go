package postgres_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/postgres"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// migrationFunction returns the CREATE [OR REPLACE] FUNCTION events_chain() statement of
// a migration file, as CREATE OR REPLACE.
func migrationFunction(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile("migrations/" + file)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	start := strings.Index(s, "FUNCTION events_chain()")
	end := strings.Index(s[max(start, 0):], "END $$;")
	if start < 0 || end < 0 {
		t.Fatalf("%s: no events_chain function", file)
	}
	return "CREATE OR REPLACE " + s[start:start+end] + "END $$;"
}

// verifyChain recomputes every link of key's chain with store.ChainHash, checks the
// head is the last of them, and returns the chain's events.
func verifyChain(t *testing.T, st *postgres.Store, key string) []store.ChainEvent {
	t.Helper()
	ctx := context.Background()
	evs, err := st.ChainEvents(ctx, key, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	head, err := st.ChainHeadGet(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	prev := ""
	for i, e := range evs {
		if e.Seq == nil || *e.Seq != int64(i+1) || e.Hash == nil {
			t.Fatalf("%s: event %d (%s) is not link %d (seq %v, hash %v)", key, e.ID, e.Kind, i+1, deref(e.Seq), deref(e.Hash))
		}
		if want := store.ChainHash(prev, e); *e.Hash != want {
			t.Fatalf("%s: event %d (%s, link %d) holds %s, store.ChainHash says %s", key, e.ID, e.Kind, i+1, *e.Hash, want)
		}
		prev = *e.Hash
	}
	if head.Seq != int64(len(evs)) || head.Head != prev {
		t.Fatalf("%s: head %+v after %d links ending %s", key, head, len(evs), prev)
	}
	return evs
}
func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// TestChainAcrossTheMigration writes a run's events with 0015's trigger function, then
// with 0024's, then with 0034's (the one migrations leave in place), in single-row and multi-row
// statements: the links of both verify as one chain with store.ChainHash, so chains begun
// before 0024 continue after it and the Go verifier needs no version.
func TestChainAcrossTheMigration(t *testing.T) {
	ctx := context.Background()
	st := migratedOnePostgres(t)
	metas := []json.RawMessage{nil, json.RawMessage(`{"trace_id":"t","n":1.50}`), json.RawMessage(`[]`)}
	details := []json.RawMessage{json.RawMessage(`{"b": "ü – 12", "a": {"y": 1, "x": [true, null, 1e3]}}`), nil,
		json.RawMessage(`"a\"b\\c\n"`), json.RawMessage(`{"": ""}`)}
	write := func(phase string) {
		for i := range 4 {
			if _, err := st.EventInsert(ctx, store.EventInsertParams{RunKey: "x", Kind: fmt.Sprintf("%s-%d", phase, i),
				Version: int64(i * 7), Actor: "user:ann ☃", Meta: metas[i%len(metas)], Detail: details[i%len(details)]}); err != nil {
				t.Fatal(err)
			}
		}
		// One statement, several rows of two runs (as a group's outcomes are written),
		// one of them new.
		storetest.ExecRaw(t, st, `INSERT INTO events (run_key, at, kind, version, actor, meta, detail)
			SELECT k, now(), $1 || '-multi', n, '', CASE WHEN n % 2 = 0 THEN NULL ELSE jsonb_build_object('n', n) END, '{"z": [1, 2]}'
			FROM unnest(ARRAY['x', 'y-' || $1, 'x', 'y-' || $1]) WITH ORDINALITY AS v(k, n)`, phase)
	}
	storetest.ExecRaw(t, st, migrationFunction(t, "0015_chain.sql"))
	write("old")
	storetest.ExecRaw(t, st, migrationFunction(t, "0024_chain_cost.sql"))
	write("new")
	storetest.ExecRaw(t, st, migrationFunction(t, "0034_chain_update_first.sql"))
	// Runs too: under 0034 a run's head is a row of event_chains.
	claim := func(key string) {
		if _, err := st.Claim(ctx, store.ClaimParams{RunClaimParams: store.RunClaimParams{Key: key, PayloadHash: "h", Owner: "o", Lease: time.Minute}, Actor: "api", AlertAfter: 100}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.RunClaim(ctx, store.RunClaimParams{Key: "run-0034", PayloadHash: "h", Owner: "o", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.EventInsert(ctx, store.EventInsertParams{RunKey: "run-0034", Kind: "claimed"}); err != nil {
		t.Fatal(err)
	}
	write("newest")
	// 0035 (the one migrations leave in place): a run chained before it keeps its head in
	// event_chains; a new run's claim links its own first event and keeps the head in its
	// row; a run taken by the plain claim statement gets its first link from the trigger.
	storetest.ExecRaw(t, st, migrationFunction(t, "0035_chain_head_in_run.sql"))
	claim("run-0035")
	if _, err := st.RunClaim(ctx, store.RunClaimParams{Key: "run-plain", PayloadHash: "h", Owner: "o", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"run-0034", "run-0035", "run-plain"} {
		for i := range 3 {
			if _, err := st.EventInsert(ctx, store.EventInsertParams{RunKey: key, Kind: fmt.Sprintf("after-%d", i),
				Meta: metas[i%len(metas)], Detail: details[i%len(details)]}); err != nil {
				t.Fatal(err)
			}
		}
		storetest.ExecRaw(t, st, `INSERT INTO events (run_key, at, kind, version, actor, detail)
			SELECT $1, now(), 'multi', n, '', '{"z": 1}' FROM generate_series(1, 2) n`, key)
		claim(key) // a duplicate: its event too
	}
	write("last")
	var inRuns, inChains []string
	rows, err := st.Pool().Query(ctx, `SELECT idempotency_key FROM workflow_runs WHERE chain_seq IS NOT NULL ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	if inRuns, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	rows, err = st.Pool().Query(ctx, `SELECT run_key FROM event_chains ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	if inChains, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(inRuns) != "[run-0035 run-plain]" || fmt.Sprint(inChains) != "[run-0034 x y-last y-new y-newest y-old]" {
		t.Fatalf("heads in runs' rows %v, in event_chains %v", inRuns, inChains)
	}
	heads, err := st.ChainHeads(ctx, "", 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(heads) != 8 {
		t.Fatalf("ChainHeads listed %d heads, want 8: %+v", len(heads), heads)
	}
	for i, h := range heads[1:] {
		if heads[i].RunKey >= h.RunKey {
			t.Fatalf("ChainHeads out of order: %q before %q", heads[i].RunKey, h.RunKey)
		}
	}
	for _, key := range []string{"x", "y-old", "y-new", "y-newest", "y-last", "run-0034", "run-0035", "run-plain"} {
		evs := verifyChain(t, st, key)
		want := map[string]int{"x": 24, "y-old": 2, "y-new": 2, "y-newest": 2, "y-last": 2,
			"run-0034": 7, "run-0035": 7, "run-plain": 6}[key]
		if len(evs) != want {
			t.Fatalf("%s: %d links, want %d", key, len(evs), want)
		}
	}
}

// TestChainMigrationKeepsTheCitusPin applies 0034's and 0035's function (each with the
// statements around it that keep its settings) to a schema whose chain function has a
// pinned search_path, as the Citus placement leaves it (citus.go): CREATE OR REPLACE
// drops a function's SET clauses, and each migration must set the pin again. Without a
// pin (one PostgreSQL) it must add none: a SET clause costs every event a settings save
// and restore.
func TestChainMigrationKeepsTheCitusPin(t *testing.T) {
	ctx := context.Background()
	st := migratedOnePostgres(t)
	config := func() string {
		var c string
		if err := st.Pool().QueryRow(ctx, `SELECT coalesce(array_to_string(proconfig, ';'), '')
			FROM pg_proc WHERE oid = to_regprocedure('events_chain()')`).Scan(&c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	var schema string
	if err := st.Pool().QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	if c := config(); c != "" {
		t.Fatalf("after the migrations on one PostgreSQL the chain function has settings %q", c)
	}
	for _, file := range []string{"0034_chain_update_first.sql", "0035_chain_head_in_run.sql"} {
		b, err := os.ReadFile("migrations/" + file)
		if err != nil {
			t.Fatal(err)
		}
		// From the settings' save to the end: the function and its settings, not the
		// migration's other changes (0035's columns exist already).
		part := string(b)[strings.Index(string(b), "SELECT set_config('airlock.events_chain_config'"):]
		storetest.ExecRaw(t, st, `ALTER FUNCTION events_chain() RESET ALL`)
		storetest.ExecRaw(t, st, part)
		if c := config(); c != "" {
			t.Fatalf("%s without a pin left settings %q", file, c)
		}
		storetest.ExecRaw(t, st, `ALTER FUNCTION events_chain() SET search_path = `+schema)
		storetest.ExecRaw(t, st, part)
		if c, want := config(), "search_path="+schema; c != want {
			t.Fatalf("%s over a pinned function left settings %q, want %q", file, c, want)
		}
		// The chain still links under the re-pinned function.
		key := "pinned-" + file[:4]
		if _, err := st.EventInsert(ctx, store.EventInsertParams{RunKey: key, Kind: "note"}); err != nil {
			t.Fatal(err)
		}
		if h, err := st.ChainHeadGet(ctx, key); err != nil || h.Seq != 1 {
			t.Fatalf("%s: head after an event under the pinned function: %+v, %v", file, h, err)
		}
	}
}

// TestChainTriggerWhenAfterPlacement applies 0039 to a schema migrated, and on Citus
// placed, without it — the upgrade of a running deployment, where events is already
// distributed and a trigger on it reaches its shards only with citus.enable_unsafe_triggers
// (which the migration sets for its transaction). The trigger is then declared WHEN
// (NEW.chain_seq IS NULL), the chain function keeps its settings (on Citus the pinned
// search_path), and events written through the trigger still link.
func TestChainTriggerWhenAfterPlacement(t *testing.T) {
	ctx := context.Background()
	st, ms := migratedBefore(t, 39)
	read := func() (when bool, config string) {
		if err := st.Pool().QueryRow(ctx, `SELECT pg_get_triggerdef(t.oid) LIKE '%WHEN ((new.chain_seq IS NULL))%',
			  coalesce((SELECT array_to_string(proconfig, ';') FROM pg_proc WHERE oid = t.tgfoid), '')
			FROM pg_trigger t WHERE t.tgrelid = 'events'::regclass AND t.tgname = 'events_chain'`).Scan(&when, &config); err != nil {
			t.Fatal(err)
		}
		return when, config
	}
	if when, _ := read(); when {
		t.Fatal("the trigger has its WHEN clause before 0039")
	}
	_, config := read()
	done, err := st.ApplyMigrationList(ctx, ms, store.MigrateParams{})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(done) != "[0039_outcome_links_own_events.sql]" {
		t.Fatalf("applied %v", done)
	}
	if when, c := read(); !when || c != config {
		t.Fatalf("after 0039: WHEN clause %v, the function's settings %q (before: %q)", when, c, config)
	}
	// On Citus every shard of events has the new trigger too.
	if citus, err := st.IsCitus(ctx); err != nil {
		t.Fatal(err)
	} else if citus {
		var shards, without int
		if err := st.Pool().QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE NOT success OR result <> 't')
			FROM run_command_on_shards('events', $c$SELECT EXISTS (SELECT FROM pg_trigger WHERE tgrelid = '%s'::regclass
			  AND pg_get_triggerdef(oid) LIKE '%%WHEN ((new.chain_seq IS NULL))%%')$c$)`).Scan(&shards, &without); err != nil {
			t.Fatal(err)
		}
		if shards == 0 || without != 0 {
			t.Fatalf("%d of %d shards of events lack the trigger's WHEN clause", without, shards)
		}
	}
	for i := range 3 {
		if _, err := st.EventInsert(ctx, store.EventInsertParams{RunKey: "after-0039", Kind: fmt.Sprintf("k%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	if h, err := st.ChainHeadGet(ctx, "after-0039"); err != nil || h.Seq != 3 {
		t.Fatalf("head after three events through the trigger: %+v, %v", h, err)
	}
}
