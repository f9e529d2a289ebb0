package scale_test

// The cost suite (cost flat as data grows): counters that stay exact without counting,
// and a purge that works in batches. Each test runs on every backend.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/retention"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/postgres"
	"github.com/airlockhq/airlock/internal/store/sqlite"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

var ctx = context.Background()

func TestEffectCountsExact(t *testing.T)        { apptest.EachEffects(t, testEffectCountsExact) }
func TestEffectCountsReadNoEffect(t *testing.T) { apptest.EachEffects(t, testEffectCountsReadNoEffect) }
func TestEffectCountsConcurrent(t *testing.T)   { apptest.EachEffects(t, testEffectCountsConcurrent) }
func TestPurgeBatches(t *testing.T)             { apptest.EachEffects(t, testPurgeBatches) }
func TestPurgeLetsClaimsThrough(t *testing.T)   { apptest.EachEffects(t, testPurgeLetsClaimsThrough) }

// FullEffectCounts counts the effects table itself: the truth the counters must match.
func FullEffectCounts(t testing.TB, st store.Store) map[store.EffectState]int {
	t.Helper()
	out := map[store.EffectState]int{}
	add := func(state string, n int) { out[store.EffectState(state)] = n }
	const q = `SELECT state, count(*) FROM effects GROUP BY state`
	switch s := st.(type) {
	case *postgres.Store:
		rows, err := s.Pool().Query(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var state string
			var n int
			if err := rows.Scan(&state, &n); err != nil {
				t.Fatal(err)
			}
			add(state, n)
		}
	case *sqlite.Store:
		rows, err := s.DB().QueryContext(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var state string
			var n int
			if err := rows.Scan(&state, &n); err != nil {
				t.Fatal(err)
			}
			add(state, n)
		}
	default:
		t.Fatalf("no full count for a %T", st)
	}
	return out
}

func checkCounts(t *testing.T, st store.Store, when string) map[store.EffectState]int {
	t.Helper()
	got, err := st.EffectCountByState(ctx)
	if err != nil {
		t.Fatalf("%s: %v", when, err)
	}
	apptest.Equal(t, "effect counts "+when, got, FullEffectCounts(t, st))
	return got
}

// scriptedReplies answers by the run key: 201, or the status named for the run.
func scriptedReplies(status map[string]int) func(w http.ResponseWriter, r *http.Request, n int) {
	return func(w http.ResponseWriter, r *http.Request, n int) {
		key := r.Header.Get("Idempotency-Key")
		if code, ok := status[strings.SplitN(key, "/", 2)[0]]; ok {
			w.WriteHeader(code)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"p-%s"}`, key)
	}
}

// testEffectCountsExact walks effects through every state the outbox gives them and
// compares the counters with a full count after each step, then after retention.
func testEffectCountsExact(t *testing.T, e *apptest.EffectsEnv) {
	checkCounts(t, e.Store, "on a fresh database")
	e.Provider.Reply = scriptedReplies(map[string]int{"retry": http.StatusServiceUnavailable,
		"refused": http.StatusBadRequest, "unsure": http.StatusInternalServerError})
	for _, k := range []string{"sent-1", "sent-2", "retry", "refused", "unsure"} {
		e.Queue(t, k, "note", "default", `{"k":"`+k+`"}`)
	}
	worker := e.Queue(t, "worker", "task", "default", `{"k":"w"}`)
	cancelled := e.Queue(t, "cancel", "task", "default", `{"k":"c"}`)
	got := checkCounts(t, e.Store, "after queueing")
	apptest.Equal(t, "pending", got[store.EffectPending], 7)

	e.Tick(t)
	got = checkCounts(t, e.Store, "after a dispatch")
	apptest.Equal(t, "completed / pending / failed / unknown", []int{got[store.EffectCompleted], got[store.EffectPending],
		got[store.EffectFailed], got[store.EffectUnknown]}, []int{2, 3, 1, 1})

	// Its run ends failed_terminal: the pending effect is cancelled with it.
	if _, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: apptest.Lease(e.Current(t, "cancel")), To: store.StateFailedTerminal}); err != nil {
		t.Fatal(err)
	}
	if got := e.EffectState(t, cancelled.ID); got != store.EffectCancelled {
		t.Fatalf("effect of the failed run: %s", got)
	}
	checkCounts(t, e.Store, "after a cancel")
	if eff, ok, err := e.Effects.WorkerClaim(ctx, []string{"task"}, time.Minute, "worker"); err != nil || !ok || eff.ID != worker.ID {
		t.Fatalf("worker claim: %v %v %v", eff.ID, ok, err)
	}
	checkCounts(t, e.Store, "after a worker's claim")

	// Retry until the cap: the retried effect ends failed.
	for range 4 {
		e.Clock.Advance(10 * time.Second)
		e.Tick(t)
		checkCounts(t, e.Store, "after a retry")
	}
	// Retention clears payloads and events; no effect changes state.
	e.Clock.Advance(500 * 24 * time.Hour)
	if _, err := retention.Purge(ctx, e.Store, e.Policy, e.Clock.Now(), false); err != nil {
		t.Fatal(err)
	}
	got = checkCounts(t, e.Store, "after retention")
	total := 0
	for _, n := range got {
		total += n
	}
	apptest.Equal(t, "effects counted", total, 7)
}

// testEffectCountsReadNoEffect: counting reads the counters, not the effects they count,
// so its cost does not grow with history. With those effects hidden (inside a
// transaction that is rolled back: SQLite's effects table renamed away; PostgreSQL's
// settled effects deleted without their triggers — its open states are counted from
// their partial indexes, TestHotQueriesUseIndexes), the counts still answer, and right.
func testEffectCountsReadNoEffect(t *testing.T, e *apptest.EffectsEnv) {
	for i := range 5 {
		e.Queue(t, fmt.Sprintf("k-%d", i), "note", "default", `{"n":1}`)
	}
	e.Tick(t)
	e.Queue(t, "open", "note", "default", `{"n":1}`)
	want := FullEffectCounts(t, e.Store)
	apptest.Equal(t, "completed and pending before", []int{want[store.EffectCompleted], want[store.EffectPending]}, []int{5, 1})
	st, ok := e.Store.(interface {
		HideCountedEffectsForTest(ctx context.Context, q store.Queries) error
	})
	if !ok {
		t.Fatalf("%T cannot hide its effects", e.Store)
	}
	// No t.Fatal inside the transaction: it would leave the connection taken and the
	// store's Close (a cleanup) waiting for it.
	var got map[store.EffectState]int
	errRollback := errors.New("roll back")
	err := e.Store.Transact(ctx, func(q store.Queries) error {
		if err := st.HideCountedEffectsForTest(ctx, q); err != nil {
			return err
		}
		var err error
		if got, err = q.EffectCountByState(ctx); err != nil {
			return fmt.Errorf("counts without the counted effects: %w", err)
		}
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatal(err)
	}
	apptest.Equal(t, "counts", got, want)
	checkCounts(t, e.Store, "after the rollback")
}

// testEffectCountsConcurrent queues, dispatches and counts at once from two instances;
// the counters end equal to a full count.
func testEffectCountsConcurrent(t *testing.T, e *apptest.EffectsEnv) {
	const writers, perWriter = 4, 25
	e.Provider.Reply = func(w http.ResponseWriter, r *http.Request, n int) {
		switch strings.SplitN(r.Header.Get("Idempotency-Key"), "/", 2)[0][len("k-0-"):] {
		case "3", "13":
			w.WriteHeader(http.StatusBadRequest)
		case "7", "17":
			w.WriteHeader(http.StatusInternalServerError)
		default:
			w.WriteHeader(http.StatusCreated)
			fmt.Fprint(w, `{"id":"p"}`)
		}
	}
	other := storetest.Reopen(t, e.Store, e.Clock)
	svc := e.NewService(other, e.Clock.Now)
	var done atomic.Bool
	var wg sync.WaitGroup
	// Two scrapers, one per instance, compacting as they read.
	for _, st := range []store.Store{e.Store, other} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !done.Load() {
				if _, err := st.EffectCountByState(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	// Two dispatchers, one per instance.
	for _, d := range []*effects.Dispatcher{e.Dispatcher, {Service: svc, BatchSize: 8, Lease: 2 * time.Minute}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !done.Load() {
				n, err := d.Tick(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				if n == 0 {
					time.Sleep(2 * time.Millisecond)
				}
			}
		}()
	}
	var writersWG sync.WaitGroup
	for w := range writers {
		writersWG.Add(1)
		go func() {
			defer writersWG.Done()
			for i := range perWriter {
				key := fmt.Sprintf("k-%d-%d", w, i)
				res, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: key, PayloadHash: "h", Actor: "test"})
				if err != nil {
					t.Error(err)
					return
				}
				if _, _, _, err := e.Effects.Queue(ctx, effects.QueueRequest{Key: key, Owner: res.Run.LeaseOwner, Version: res.Run.Version,
					ActionType: "note", Target: "default", Payload: json.RawMessage(`{"n":1}`), Actor: "test"}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	writersWG.Wait()
	// Let the dispatchers drain what is due.
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if FullEffectCounts(t, e.Store)[store.EffectPending] == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	done.Store(true)
	wg.Wait()
	got := checkCounts(t, e.Store, "after concurrent changes")
	checkCounts(t, other, "from the other instance")
	total := 0
	for _, n := range got {
		total += n
	}
	apptest.Equal(t, "effects counted", total, writers*perWriter)
	if got[store.EffectCompleted] == 0 || got[store.EffectFailed] == 0 || got[store.EffectUnknown] == 0 {
		t.Fatalf("the scenario should end in several states: %v", got)
	}
}

// testPurgeBatches: a purge removes what expired in batches of p.Batch, each its own
// transaction, yielding between them; other writers get through meanwhile, and what has
// not expired stays.
func testPurgeBatches(t *testing.T, e *apptest.EffectsEnv) {
	const expired, kept, batch = 2500, 30, 200
	PlantEvents(t, e.Store, expired, e.Clock.Now().Add(-500*24*time.Hour))
	PlantEvents(t, e.Store, kept, e.Clock.Now())
	now := e.Clock.Now()
	var yields int
	var slowest time.Duration
	counts, err := e.Store.Purge(ctx, store.PurgeParams{
		PayloadsBefore: now.Add(-30 * 24 * time.Hour), EventsBefore: now.Add(-400 * 24 * time.Hour), Now: now,
		Batch: batch,
		Yield: func(ctx context.Context, took time.Duration) error {
			yields++
			// Between two batches no lock is held: a claim goes through at once.
			start := time.Now()
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if _, err := e.Runs.Claim(cctx, runs.ClaimRequest{Key: fmt.Sprintf("during-%d", yields), PayloadHash: "h", Actor: "test"}); err != nil {
				return err
			}
			slowest = max(slowest, time.Since(start))
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "events purged", counts["events"], int64(expired))
	apptest.Equal(t, "yields between batches", yields, expired/batch) // the last full batch is followed by an empty one
	if slowest > 2*time.Second {
		t.Fatalf("a claim between two batches took %v", slowest)
	}
	// The planted events that have not expired, and the claims' own events, stay.
	counts, err = e.Store.Purge(ctx, store.PurgeParams{PayloadsBefore: now.Add(-30 * 24 * time.Hour),
		EventsBefore: now.Add(time.Second), Now: now, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "events left", counts["events"], int64(kept+yields))
}

// PurgeLargeEvents is how many expired events testPurgeLetsClaimsThrough purges: enough
// that one statement removing them all holds SQLite's write lock for seconds here.
var PurgeLargeEvents = 100_000

// testPurgeLetsClaimsThrough purges many expired events with the default batches and
// pauses while claims go on: every claim succeeds, none waits for more than a quarter of
// the purge. (With one statement, SQLite's write lock is held for the whole purge and
// claims wait for it, or fail with SQLITE_BUSY past the busy timeout.)
func testPurgeLetsClaimsThrough(t *testing.T, e *apptest.EffectsEnv) {
	PlantEvents(t, e.Store, PurgeLargeEvents, e.Clock.Now().Add(-500*24*time.Hour))
	now := e.Clock.Now()
	done := make(chan store.PurgeCounts, 1)
	errc := make(chan error, 1)
	start := time.Now()
	var purgeTook time.Duration
	go func() {
		c, err := e.Store.Purge(ctx, store.PurgeParams{PayloadsBefore: now.Add(-30 * 24 * time.Hour),
			EventsBefore: now.Add(-400 * 24 * time.Hour), Now: now})
		purgeTook = time.Since(start)
		errc <- err
		done <- c
	}()
	var slowest time.Duration
	claims := 0
	for {
		select {
		case err := <-errc:
			if err != nil {
				t.Fatal(err)
			}
			c := <-done
			apptest.Equal(t, "events purged", c["events"], int64(PurgeLargeEvents))
			t.Logf("purge of %d events took %v; %d claims meanwhile, the slowest %v", PurgeLargeEvents, purgeTook, claims, slowest)
			if claims < 3 {
				t.Fatalf("only %d claims went through during a purge of %v", claims, purgeTook)
			}
			// Relative, not a wall-clock bound, so a loaded machine slows both alike:
			// with batches a claim waits for one batch at most (about 1% of the
			// purge); with one statement it waits for nearly the whole purge.
			if slowest > purgeTook/4 {
				t.Fatalf("a claim during the purge took %v of its %v", slowest, purgeTook)
			}
			return
		default:
		}
		time.Sleep(5 * time.Millisecond) // a busy API's pace: 200 claims/s at most
		claimStart := time.Now()
		if _, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: fmt.Sprintf("during-%d", claims), PayloadHash: "h", Actor: "test"}); err != nil {
			t.Fatalf("a claim during the purge: %v", err)
		}
		slowest = max(slowest, time.Since(claimStart))
		claims++
	}
}

// PlantEvents inserts n events of kind "planted" at the given time, in one statement.
// plantedDetail is a planted event's detail, the size of a real event's (a few hundred
// bytes). A tiny row would fit into the slack that every page of generated history keeps,
// so 10,000 planted rows would land on 10,000 pages, one each: deleting them then dirties
// (and, after a checkpoint, logs a full image of) 10,000 pages instead of ~200 — 83 MB of
// WAL instead of 1.6 MB — which is not how expired events lie (they were appended in time
// order, many to a page).
var plantedDetail = `{"note": "` + strings.Repeat("x", 300) + `"}`

func PlantEvents(t testing.TB, st store.Store, n int, at time.Time) {
	t.Helper()
	switch st.(type) {
	case *postgres.Store:
		storetest.ExecRaw(t, st, `INSERT INTO events (run_key, at, kind, detail)
			SELECT 'planted-' || i, $1::timestamptz, 'planted', $3::jsonb FROM generate_series(1, $2::int) i`, at, n, plantedDetail)
	default:
		storetest.ExecRaw(t, st, `WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < ?2)
			INSERT INTO events (run_key, at, kind, detail) SELECT 'planted-' || i, ?1, 'planted', ?3 FROM s`, at.UnixMicro(), n, plantedDetail)
	}
}
