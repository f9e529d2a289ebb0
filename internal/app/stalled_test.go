package app_test

import (
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/failures"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

// TestStalled* are issue 34's stalled runs on every backend: a run left processing
// after its lease lapsed is listed by the stalled filter, alerted once per stall however
// many sweepers race, alerted again after a reclaim stalls it anew, and re-driven by an
// operator only while it is stalled.
func TestStalledListedAlertedOnce(t *testing.T) { apptest.EachEffects(t, testStalledAlertedOnce) }
func TestStalledRedrive(t *testing.T)           { apptest.EachEffects(t, testRedrive) }
func TestStalledEffectsWaiting(t *testing.T)    { apptest.EachEffects(t, testEffectsWaiting) }

// stallAlerts counts the run_stalled alert events of key.
func stallAlerts(t *testing.T, e *apptest.EffectsEnv, key string) int {
	t.Helper()
	evs, err := e.Store.EventList(ctx, key, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ev := range evs {
		var d struct{ Alert string }
		if ev.Kind == string(store.EventAlert) && json.Unmarshal(ev.Detail, &d) == nil && d.Alert == "run_stalled" {
			n++
		}
	}
	return n
}

func stalledKeys(t *testing.T, e *apptest.EffectsEnv) []string {
	t.Helper()
	now := e.Clock.Now()
	rs, err := e.Store.RunList(ctx, store.RunListParams{StalledAt: &now, Limit: 50})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, r := range rs {
		keys = append(keys, r.Key)
	}
	return keys
}

func testStalledAlertedOnce(t *testing.T, e *apptest.EffectsEnv) {
	e.ClaimRun(t, "s-1")
	e.ClaimRun(t, "s-live")
	if got := stalledKeys(t, e); len(got) != 0 {
		t.Fatalf("stalled before any lease lapsed: %v", got)
	}
	if err := e.Runs.SweepStalled(ctx); err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "alerts while the lease is live", stallAlerts(t, e, "s-1"), 0)
	e.Clock.Advance(6 * time.Minute) // past the 5-minute default lease
	e.ClaimRun(t, "s-live")          // reclaimed: live again
	apptest.Equal(t, "stalled runs", stalledKeys(t, e), []string{"s-1"})
	// Eight sweepers at once, as eight instances would: one alert.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- e.Runs.SweepStalled(ctx) }()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	apptest.Equal(t, "alerts after racing sweeps", stallAlerts(t, e, "s-1"), 1)
	apptest.Equal(t, "alerts of the live run", stallAlerts(t, e, "s-live"), 0)
	if err := e.Runs.SweepStalled(ctx); err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "alerts after another sweep", stallAlerts(t, e, "s-1"), 1)
	// The mark changes neither version nor updated_at.
	before := e.Current(t, "s-1")
	apptest.Equal(t, "version after the alert", before.Version, int64(1))
	// A reclaim, then a second stall: alerted again, once.
	e.ClaimRun(t, "s-1")
	apptest.Equal(t, "stalled after the reclaim", len(stalledKeys(t, e)), 0)
	e.Clock.Advance(6 * time.Minute)
	for range 2 {
		if err := e.Runs.SweepStalled(ctx); err != nil {
			t.Fatal(err)
		}
	}
	apptest.Equal(t, "alerts after the second stall", stallAlerts(t, e, "s-1"), 2)
}

func testRedrive(t *testing.T, e *apptest.EffectsEnv) {
	e.ClaimRun(t, "r-1")
	// A live lease is no stall: refused, nothing changes.
	if _, err := e.Failures.Redrive(ctx, "r-1", store.StateFailedRetryable, "n8n died", "console:op"); !errors.Is(err, failures.ErrNotStalled) {
		t.Fatalf("re-drive of a live run: %v, want ErrNotStalled", err)
	}
	e.Clock.Advance(6 * time.Minute)
	if _, err := e.Failures.Redrive(ctx, "r-1", store.StateFailedRetryable, " ", "console:op"); err == nil {
		t.Fatal("re-drive without a reason was accepted")
	}
	if _, err := e.Failures.Redrive(ctx, "r-1", store.StateCompleted, "done", "console:op"); err == nil {
		t.Fatal("re-drive to completed was accepted")
	}
	if _, err := e.Failures.Redrive(ctx, "nope", store.StateFailedRetryable, "x", "console:op"); !errors.Is(err, runs.ErrNotFound) {
		t.Fatalf("re-drive of an unknown key: %v", err)
	}
	run, err := e.Failures.Redrive(ctx, "r-1", store.StateFailedRetryable, "n8n was killed mid-execution", "console:op")
	if err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "state after release", run.State, store.StateFailedRetryable)
	if _, err := e.Failures.Redrive(ctx, "r-1", store.StateFailedRetryable, "again", "console:op"); !errors.Is(err, failures.ErrNotStalled) {
		t.Fatalf("a second re-drive: %v, want ErrNotStalled", err)
	}
	evs, err := e.Store.EventList(ctx, "r-1", 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	last := evs[len(evs)-1]
	apptest.Equal(t, "event", last.Kind, string(store.EventRunRedriven))
	apptest.Equal(t, "actor", last.Actor, "console:op")
	// The next delivery claims it at once.
	res, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: "r-1", PayloadHash: "h-r-1", Actor: "test"})
	if err != nil || res.Run.State != store.StateProcessing {
		t.Fatalf("claim after release: %+v %v", res.Run, err)
	}
	// Given up: failed_terminal, its pending effects withdrawn.
	e.ClaimRun(t, "r-2")
	eff := e.Queue(t, "r-2", "task", "default", `{"n":1}`)
	e.Clock.Advance(6 * time.Minute)
	if _, err := e.Failures.Redrive(ctx, "r-2", store.StateFailedTerminal, "handled by hand", "console:op"); err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "state after giving up", e.Current(t, "r-2").State, store.StateFailedTerminal)
	apptest.Equal(t, "its pending effect", e.EffectState(t, eff.ID), store.EffectCancelled)
	// A re-drive racing a reclaim: exactly one wins.
	e.ClaimRun(t, "r-3")
	e.Clock.Advance(6 * time.Minute)
	var wg sync.WaitGroup
	var redriveErr, claimErr error
	var claimed runs.ClaimResult
	wg.Add(2)
	go func() {
		defer wg.Done()
		_, redriveErr = e.Failures.Redrive(ctx, "r-3", store.StateFailedTerminal, "gave up", "console:op")
	}()
	go func() {
		defer wg.Done()
		claimed, claimErr = e.Runs.Claim(ctx, runs.ClaimRequest{Key: "r-3", PayloadHash: "h-r-3", Actor: "test"})
	}()
	wg.Wait()
	final := e.Current(t, "r-3")
	switch {
	case redriveErr == nil:
		// Given up first: the claim came after and found a finished run.
		apptest.Equal(t, "state", final.State, store.StateFailedTerminal)
		if claimErr == nil && claimed.Run.State == store.StateProcessing {
			t.Fatalf("both the re-drive and the claim won: %+v", claimed.Run)
		}
	case errors.Is(redriveErr, failures.ErrNotStalled):
		apptest.Equal(t, "state", final.State, store.StateProcessing)
		if claimErr != nil {
			t.Fatalf("the claim lost too: %v", claimErr)
		}
	default:
		t.Fatalf("re-drive: %v", redriveErr)
	}
}

func testEffectsWaiting(t *testing.T, e *apptest.EffectsEnv) {
	e.ClaimRun(t, "w-1")
	old := e.Queue(t, "w-1", "task", "default", `{"n":1}`)
	e.Clock.Advance(15 * time.Minute)
	e.ClaimRun(t, "w-2")
	e.Queue(t, "w-2", "task", "default", `{"n":2}`)
	got, err := e.Store.EffectsWaiting(ctx, e.Clock.Now().Add(-10*time.Minute), 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].ID != old.ID {
		t.Fatalf("waiting for 10 minutes: %+v, want only %s", got, old.ID)
	}
}
