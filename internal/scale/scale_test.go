package scale_test

// TestScale is the benchmark of cost as data grows: the hot operations on PostgreSQL
// holding generated history, beside the same operations on an empty database in the
// same run. Sizes come from the environment (the target is 10 M runs and 50 M events):
//
//	AIRLOCK_SCALE_RUNS=10000000 AIRLOCK_SCALE_EVENTS=50000000 bash scripts/bench-scale.sh
//
// It runs only when AIRLOCK_SCALE_RUNS is set. Each figure is a median over repeated
// calls (dispatch: effects/s over a batch); the ratio is the empty database's time over
// the big one's, so 1.00 is "as fast as empty" and the target is ≥ 0.80.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/retention"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/scale"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/postgres"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

func envInt(t testing.TB, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a count", name, v)
	}
	return n
}

// scaleFigures are one database's medians (seconds; dispatch in effects/s).
type scaleFigures map[string]float64

var scaleOps = []string{"claim", "duplicate claim", "heartbeat", "transition", "dispatch (effects/s)", "explain",
	"report (7d)", "effect counts (/metrics)", "purge, nothing to do", "purge, 10k expired events"}

func TestScale(t *testing.T) {
	if os.Getenv("AIRLOCK_SCALE_RUNS") == "" {
		t.Skip("AIRLOCK_SCALE_RUNS not set: the scale benchmark runs from scripts/bench-scale.sh")
	}
	runsN := envInt(t, "AIRLOCK_SCALE_RUNS", 1_000_000)
	eventsN := envInt(t, "AIRLOCK_SCALE_EVENTS", 5*runsN)
	iters := envInt(t, "AIRLOCK_SCALE_ITERATIONS", 200)

	empty, big := openScale(t, 0, 0), openScale(t, runsN, eventsN)
	// A third, empty database without the effect counters' triggers: what they cost.
	bare := openScale(t, 0, 0)
	if _, err := bare.st.Pool().Exec(context.Background(), `ALTER TABLE effects DISABLE TRIGGER USER`); err != nil {
		t.Fatal(err)
	}
	figs := measureScale(t, []*scaleEnv{empty, big, bare}, iters)
	emptyF, bigF, bareF := figs[0], figs[1], figs[2]

	fmt.Printf("\nscale benchmark: PostgreSQL, %d runs / %d events / %d effects of history vs an empty database (medians of %d)\n",
		runsN, eventsN, runsN, iters)
	fmt.Printf("%-28s %14s %14s %8s %18s\n", "operation", "empty", "history", "speed", "empty, no counters")
	worst := 10.0
	for _, op := range scaleOps {
		e, b := emptyF[op], bigF[op]
		ratio := e / b // time: empty / big
		unit := func(v float64) string { return fmt.Sprintf("%.3f ms", v*1000) }
		if op == "dispatch (effects/s)" {
			ratio = b / e
			unit = func(v float64) string { return fmt.Sprintf("%.0f /s", v) }
		}
		worst = min(worst, ratio)
		fmt.Printf("%-28s %14s %14s %7.2f× %18s\n", op, unit(e), unit(b), ratio, unit(bareF[op]))
	}
	fmt.Printf("worst speed ratio: %.2f× (target ≥ 0.80×)\n", worst)
}

type scaleEnv struct {
	e      *apptest.EffectsEnv
	st     *postgres.Store
	a      *audit.Service
	claims []store.Run
}

// openScale opens a fresh schema and generates history if asked.
func openScale(t testing.TB, runsN, eventsN int) *scaleEnv {
	return openScaleTraced(t, runsN, eventsN, nil)
}

// openScaleTraced is openScale with tracer (if not nil) seeing every statement sent.
func openScaleTraced(t testing.TB, runsN, eventsN int, tracer pgx.QueryTracer) *scaleEnv {
	ctx := context.Background()
	st := scale.OpenTraced(t, tracer)
	e := apptest.NewEffectsEnv(t, storetest.Backend{Name: "postgres", Open: func(testing.TB, *storetest.Clock) store.Store { return st }}, "")
	if runsN > 0 {
		start := time.Now()
		if err := storetest.GenerateScale(ctx, st.Pool(), storetest.Scale{Runs: runsN, Events: eventsN, End: e.Clock.Now().Add(-8 * 24 * time.Hour)},
			func(f string, a ...any) { fmt.Printf("  "+f+"\n", a...) }); err != nil {
			t.Fatal(err)
		}
		fmt.Printf("  history generated in %v\n", time.Since(start).Round(time.Second))
	}
	// Measure after the load's writes are on disk, not during their checkpoint.
	if _, err := st.Pool().Exec(ctx, `CHECKPOINT`); err != nil {
		t.Fatal(err)
	}
	return &scaleEnv{e: e, st: st, a: audit.New(st, e.Clock.Now)}
}

// measureScale measures each operation on every env, alternating between them call by
// call (and which goes first), so the disk's swings in fsync rate fall on all alike.
func measureScale(t *testing.T, envs []*scaleEnv, iters int) []scaleFigures {
	ctx := context.Background()
	out := make([]scaleFigures, len(envs))
	for i := range out {
		out[i] = scaleFigures{}
		envs[i].claims = make([]store.Run, iters)
	}
	must := func(err error) {
		if err != nil {
			t.Helper()
			t.Fatal(err)
		}
	}
	median := func(op string, n int, fn func(s *scaleEnv, i int)) {
		for i := range min(n/10, 20) { // warm-up: connections, statement caches
			for _, s := range envs {
				fn(s, -1-i)
			}
		}
		d := make([][]float64, len(envs))
		for i := range n {
			for k := range envs {
				k = (k + i) % len(envs)
				start := time.Now()
				fn(envs[k], i)
				d[k] = append(d[k], time.Since(start).Seconds())
			}
		}
		for k := range envs {
			slices.Sort(d[k])
			out[k][op] = d[k][n/2]
		}
	}
	median("claim", iters, func(s *scaleEnv, i int) {
		res, err := s.e.Runs.Claim(ctx, runs.ClaimRequest{Key: fmt.Sprintf("bench-%d", i), PayloadHash: "h", Actor: "bench"})
		must(err)
		if i >= 0 {
			s.claims[i] = res.Run
		}
	})
	median("duplicate claim", iters, func(s *scaleEnv, i int) {
		_, err := s.e.Runs.Claim(ctx, runs.ClaimRequest{Key: fmt.Sprintf("bench-%d", max(i, 0)), PayloadHash: "h", Actor: "bench"})
		must(err)
	})
	median("heartbeat", iters, func(s *scaleEnv, i int) {
		r := s.claims[max(i, 0)]
		_, err := s.e.Runs.Heartbeat(ctx, runs.LeaseRequest{Key: r.Key, Owner: r.LeaseOwner, Version: r.Version, Actor: "bench"}, time.Minute)
		must(err)
	})
	// Dispatch: one effect per claimed run, sent by one dispatcher to the local provider;
	// the envs take turns, a tick each.
	for _, s := range envs {
		for _, r := range s.claims {
			_, _, _, err := s.e.Effects.Queue(ctx, effects.QueueRequest{Key: r.Key, Owner: r.LeaseOwner, Version: r.Version,
				ActionType: "note", Target: "default", Payload: json.RawMessage(`{"n":1}`), Actor: "bench"})
			must(err)
		}
	}
	took, sent := make([]time.Duration, len(envs)), make([]int, len(envs))
	for busy := true; busy; {
		busy = false
		for k, s := range envs {
			if sent[k] >= iters {
				continue
			}
			busy = true
			start := time.Now()
			n, err := s.e.Dispatcher.Tick(ctx)
			must(err)
			took[k] += time.Since(start)
			if n == 0 {
				t.Fatalf("dispatch stalled after %d of %d", sent[k], iters)
			}
			sent[k] += n
		}
	}
	for k := range envs {
		out[k]["dispatch (effects/s)"] = float64(iters) / took[k].Seconds()
	}
	median("transition", iters, func(s *scaleEnv, i int) {
		if i < 0 {
			return
		}
		r := s.claims[i]
		_, err := s.e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: runs.LeaseRequest{Key: r.Key, Owner: r.LeaseOwner,
			Version: r.Version, Actor: "bench"}, To: store.StateCompleted, Result: json.RawMessage(`{"ok":true}`)})
		must(err)
	})
	median("explain", max(iters/4, 10), func(s *scaleEnv, i int) {
		_, err := s.a.Explain(ctx, fmt.Sprintf("bench-%d", max(i, 0)))
		must(err)
	})
	median("report (7d)", max(iters/20, 5), func(s *scaleEnv, _ int) {
		_, err := s.a.ReportLast(ctx, 7*24*time.Hour)
		must(err)
	})
	median("effect counts (/metrics)", iters, func(s *scaleEnv, _ int) {
		_, err := s.st.EffectCountByState(ctx)
		must(err)
	})
	median("purge, nothing to do", max(iters/20, 5), func(s *scaleEnv, _ int) {
		_, err := retention.Purge(ctx, s.st, s.e.Policy, s.e.Clock.Now(), false)
		must(err)
	})
	// Purge of 10k expired events, planted before each timed purge; batches without the
	// pause between them (the pause is for other writers, not work).
	purges := make([][]float64, len(envs))
	for range 11 {
		for k, s := range envs {
			now := s.e.Clock.Now()
			PlantEvents(t, s.st, 10_000, now.Add(-500*24*time.Hour))
			start := time.Now()
			c, err := s.st.Purge(ctx, store.PurgeParams{PayloadsBefore: now.Add(-30 * 24 * time.Hour), EventsBefore: now.Add(-400 * 24 * time.Hour),
				Now: now, Yield: func(context.Context, time.Duration) error { return nil }})
			must(err)
			purges[k] = append(purges[k], time.Since(start).Seconds())
			if c["events"] != 10_000 {
				t.Fatalf("purged %d events, want 10000", c["events"])
			}
		}
	}
	for k := range envs {
		slices.Sort(purges[k])
		out[k]["purge, 10k expired events"] = purges[k][len(purges[k])/2]
	}
	return out
}
