package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/scale"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/postgres"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// citusWorkerCtl returns the ports of a Citus cluster's two workers and a function that
// stops or starts worker n (scripts/with-citus.sh's AIRLOCK_TEST_CITUS_CTL). It skips the
// test outside a Citus cluster, as the other Citus tests do.
func citusWorkerCtl(t *testing.T) (ports []int, ctl func(action string, n int)) {
	t.Helper()
	if os.Getenv("AIRLOCK_TEST_CITUS") != "1" {
		t.Skip("needs a Citus cluster: run under scripts/with-citus.sh")
	}
	cmd := os.Getenv("AIRLOCK_TEST_CITUS_CTL")
	if cmd == "" {
		t.Fatal("AIRLOCK_TEST_CITUS=1 without AIRLOCK_TEST_CITUS_CTL: run under scripts/with-citus.sh")
	}
	for _, f := range strings.Fields(os.Getenv("AIRLOCK_TEST_CITUS_WORKERS")) {
		p, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("AIRLOCK_TEST_CITUS_WORKERS: %v", err)
		}
		ports = append(ports, p)
	}
	if len(ports) != 2 {
		t.Fatalf("AIRLOCK_TEST_CITUS_WORKERS=%q: want two ports", os.Getenv("AIRLOCK_TEST_CITUS_WORKERS"))
	}
	return ports, func(action string, n int) {
		t.Helper()
		if out, err := exec.Command(cmd, action, strconv.Itoa(n)).CombinedOutput(); err != nil {
			t.Fatalf("%s %s %d: %v\n%s", cmd, action, n, err, out)
		}
	}
}

// citusKeysOn returns n keys of the form prefix-i whose workflow_runs shard is on the
// worker listening on port (and so their events and effects: co-located).
func citusKeysOn(t *testing.T, st *postgres.Store, prefix string, port, n int) []string {
	t.Helper()
	var keys []string
	for i := 0; len(keys) < n; i++ {
		if i > 10_000 {
			t.Fatalf("no %d keys %s-* on the worker at port %d", n, prefix, port)
		}
		key := fmt.Sprintf("%s-%d", prefix, i)
		var at int
		err := st.Pool().QueryRow(context.Background(), `SELECT nodeport FROM citus_shards
			WHERE shardid = get_shard_id_for_distribution_column('workflow_runs', $1::text)`, key).Scan(&at)
		if err != nil {
			t.Fatal(err)
		}
		if at == port {
			keys = append(keys, key)
		}
	}
	return keys
}

// TestStoppedWorkerClaims: with one Citus worker stopped, the runs on the other worker
// are served — a claim takes the run (with its claimed event), a duplicate is refused,
// a heartbeat, an effect queued and a transition go through — while the runs on the
// stopped worker answer store.ErrUnavailable (a retryable 503); once the worker is back,
// those are claimed too. It stops a worker of the shared cluster: run it alone
// (docs/testing.md), as TestVerifyCitusWorkerDown.
func TestStoppedWorkerClaims(t *testing.T) {
	ports, worker := citusWorkerCtl(t)
	st := scale.OpenTraced(t, nil)
	e := apptest.NewEffectsEnv(t, storetest.Backend{Name: "postgres", Open: func(testing.TB, *storetest.Clock) store.Store { return st }}, "")
	ctx := context.Background()
	down := citusKeysOn(t, st, "down", ports[0], 3) // on worker 1, stopped below
	up := citusKeysOn(t, st, "up", ports[1], 3)     // on worker 2
	held := citusKeysOn(t, st, "held", ports[1], 2) // claimed before, on worker 2
	heldDown := citusKeysOn(t, st, "held-down", ports[0], 1)

	claim := func(key string) (runs.ClaimResult, error) {
		return e.Runs.Claim(ctx, runs.ClaimRequest{Key: key, PayloadHash: "h-" + key, Actor: "test"})
	}
	claimed := map[string]store.Run{}
	for _, k := range append(held, heldDown...) {
		res, err := claim(k)
		if err != nil || !res.Claimed {
			t.Fatalf("claim %s with both workers up: %+v, %v", k, res, err)
		}
		claimed[k] = res.Run
	}
	claimedEvents := func(key string) int {
		t.Helper()
		var n int
		if err := st.Pool().QueryRow(ctx, `SELECT count(*) FROM events WHERE run_key = $1 AND kind = 'claimed'`, key).Scan(&n); err != nil {
			t.Fatalf("count %s's claimed events: %v", key, err)
		}
		return n
	}
	unavailable := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("%s with its worker stopped: %v, want store.ErrUnavailable", what, err)
		}
	}

	worker("stop", 1)
	started := false
	t.Cleanup(func() {
		if !started {
			worker("start", 1)
		}
	})

	for _, k := range up {
		res, err := claim(k)
		if err != nil || !res.Claimed {
			t.Errorf("claim %s (worker 2) with worker 1 stopped: %+v, %v", k, res, err)
			continue
		}
		if n := claimedEvents(k); n != 1 {
			t.Errorf("%s: %d claimed events, want 1", k, n)
		}
		res, err = claim(k)
		if err != nil || res.Claimed || res.Run.Duplicates != 1 {
			t.Errorf("duplicate claim of %s (worker 2) with worker 1 stopped: %+v, %v", k, res, err)
		}
	}
	r := claimed[held[0]]
	if _, err := e.Runs.Heartbeat(ctx, runs.LeaseRequest{Key: r.Key, Owner: r.LeaseOwner, Version: r.Version, Actor: "test"}, 0); err != nil {
		t.Errorf("heartbeat of %s (worker 2) with worker 1 stopped: %v", r.Key, err)
	}
	if _, created, _, err := e.Effects.Queue(ctx, effects.QueueRequest{Key: r.Key, Owner: r.LeaseOwner, Version: r.Version,
		ActionType: "note", Target: "default", Payload: json.RawMessage(`{"n":1}`), Actor: "test"}); err != nil || !created {
		t.Errorf("queue an effect on %s (worker 2) with worker 1 stopped: created %v, %v", r.Key, created, err)
	}
	r = claimed[held[1]]
	if _, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: runs.LeaseRequest{Key: r.Key, Owner: r.LeaseOwner,
		Version: r.Version, Actor: "test"}, To: store.StateCompleted}); err != nil {
		t.Errorf("transition of %s (worker 2) with worker 1 stopped: %v", r.Key, err)
	}

	for _, k := range down {
		_, err := claim(k)
		unavailable("claim "+k+" (worker 1)", err)
	}
	r = claimed[heldDown[0]]
	_, err := e.Runs.Heartbeat(ctx, runs.LeaseRequest{Key: r.Key, Owner: r.LeaseOwner, Version: r.Version, Actor: "test"}, 0)
	unavailable("heartbeat of "+r.Key+" (worker 1)", err)
	// An instance (re)started meanwhile migrates first (serve --migrate, the default): on
	// a schema already placed that must not need every worker (the harness found it).
	if err := st.Migrate(ctx); err != nil {
		t.Errorf("migrate an up-to-date schema with worker 1 stopped: %v", err)
	}

	worker("start", 1)
	started = true
	for _, k := range down {
		res, err := claim(k)
		if err != nil || !res.Claimed {
			t.Errorf("claim %s (worker 1) once it is back: %+v, %v", k, res, err)
			continue
		}
		if n := claimedEvents(k); n != 1 {
			t.Errorf("%s: %d claimed events, want 1", k, n)
		}
	}
}

// TestStoppedWorkerUnderLoad: four clients claim new keys and queue an effect on each
// while worker 1 is stopped for three seconds, the test clock moving past a lease meanwhile,
// and started again. Every failure is store.ErrUnavailable; claims are acknowledged
// during the outage (the runs on worker 2) and some fail (those on worker 1); every
// acknowledged claim and queued effect is in the database afterwards, and after the
// outage each client reclaims its first run, whose lease lapsed meanwhile. It stops a
// worker of the shared cluster: run it alone (docs/testing.md).
func TestStoppedWorkerUnderLoad(t *testing.T) {
	_, worker := citusWorkerCtl(t)
	st := scale.OpenTraced(t, nil)
	e := apptest.NewEffectsEnv(t, storetest.Backend{Name: "postgres", Open: func(testing.TB, *storetest.Clock) store.Store { return st }}, "")
	ctx := context.Background()

	type acked struct {
		key    string
		effect string // "" when the queue was not acknowledged
	}
	var (
		mu           sync.Mutex
		phase        = "before" // before, down, after
		okIn, failIn = map[string]int{}, map[string]int{}
		unexpected   []error
		done         = make(chan struct{})
		wg           sync.WaitGroup
		acks         = make([][]acked, 4)
		claimsIn     = map[string]int{} // acknowledged claims by phase
	)
	note := func(err error) bool {
		mu.Lock()
		defer mu.Unlock()
		if err == nil {
			okIn[phase]++
			return true
		}
		failIn[phase]++
		if !errors.Is(err, store.ErrUnavailable) {
			unexpected = append(unexpected, err)
		}
		return false
	}
	for c := range acks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				key := fmt.Sprintf("load-%d-%d", c, i)
				res, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: key, PayloadHash: "h", Actor: "test"})
				if !note(err) {
					continue
				}
				if !res.Claimed {
					note(fmt.Errorf("new key %s not claimed: %+v", key, res))
					continue
				}
				mu.Lock()
				claimsIn[phase]++
				mu.Unlock()
				a := acked{key: key}
				eff, _, _, err := e.Effects.Queue(ctx, effects.QueueRequest{Key: key, Owner: res.Run.LeaseOwner, Version: res.Run.Version,
					ActionType: "note", Target: "default", Payload: json.RawMessage(`{"n":1}`), Actor: "test"})
				if errors.Is(err, runs.ErrLeaseLost) && res.Run.LeaseExpiresAt.Before(e.Clock.Now()) {
					err = nil // the clock moved past the lease between the claim and the queue
				} else if note(err) {
					a.effect = eff.ID
				}
				acks[c] = append(acks[c], a)
			}
		}()
	}
	setPhase := func(p string) { mu.Lock(); phase = p; mu.Unlock() }
	time.Sleep(500 * time.Millisecond)
	setPhase("down")
	worker("stop", 1)
	started := false
	t.Cleanup(func() {
		if !started {
			worker("start", 1)
		}
	})
	time.Sleep(1500 * time.Millisecond)
	e.Clock.Advance(apptest.LeaseConfig.DefaultLease + time.Second) // every lease taken so far lapses
	time.Sleep(1500 * time.Millisecond)
	worker("start", 1)
	started = true
	setPhase("after")
	time.Sleep(2 * time.Second)
	close(done)
	wg.Wait()

	t.Logf("before/down/after worker 1 stopped: claims acknowledged %d/%d/%d; claims and queues acknowledged %d/%d/%d, failed %d/%d/%d",
		claimsIn["before"], claimsIn["down"], claimsIn["after"], okIn["before"], okIn["down"], okIn["after"], failIn["before"], failIn["down"], failIn["after"])
	for _, err := range unexpected {
		t.Errorf("a failure other than store.ErrUnavailable: %v", err)
	}
	if claimsIn["down"] == 0 || failIn["down"] == 0 {
		t.Errorf("with worker 1 stopped: %d claims acknowledged, %d failed; want both (the runs of worker 2 served, those of worker 1 not)", claimsIn["down"], failIn["down"])
	}
	if claimsIn["after"] == 0 {
		t.Error("nothing acknowledged after worker 1 was started again")
	}
	n := 0
	for c, as := range acks {
		for _, a := range as {
			n++
			if _, err := e.Runs.Get(ctx, a.key); err != nil {
				t.Errorf("acknowledged claim of %s: %v", a.key, err)
				continue
			}
			var claims int
			if err := st.Pool().QueryRow(ctx, `SELECT count(*) FROM events WHERE run_key = $1 AND kind = 'claimed'`, a.key).Scan(&claims); err != nil || claims != 1 {
				t.Errorf("acknowledged claim of %s: %d claimed events (%v), want 1", a.key, claims, err)
			}
			if a.effect != "" {
				if eff, err := st.EffectGet(ctx, a.effect); err != nil || eff.RunKey != a.key {
					t.Errorf("acknowledged queue of %s's effect %s: %+v, %v", a.key, a.effect, eff, err)
				}
			}
		}
		if len(as) == 0 {
			t.Errorf("client %d had no claim acknowledged", c)
			continue
		}
		// Its first run's lease lapsed during the outage: it is reclaimed now.
		res, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: as[0].key, PayloadHash: "h", Actor: "test"})
		if err != nil || !res.Claimed || !res.Reclaimed {
			t.Errorf("reclaim %s after the outage: %+v, %v", as[0].key, res, err)
		}
	}
	t.Logf("%d acknowledged claims checked", n)
}
