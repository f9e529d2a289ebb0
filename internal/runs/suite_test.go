package runs_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

// The conformance suite of runs: every behaviour of runs the API promises, each test on
// every backend (apptest.EachEnv: subtests sqlite and postgres).
func TestClaimNewKey(t *testing.T)                      { apptest.EachEnv(t, testClaimNewKey) }
func TestDuplicateClaimCounted(t *testing.T)            { apptest.EachEnv(t, testDuplicateClaim) }
func TestPayloadMismatch(t *testing.T)                  { apptest.EachEnv(t, testPayloadMismatch) }
func TestCompletedKeyReturnsResult(t *testing.T)        { apptest.EachEnv(t, testCompletedKeyReturnsResult) }
func TestExpiredLeaseReclaim(t *testing.T)              { apptest.EachEnv(t, testExpiredLeaseReclaim) }
func TestFailedRetryableReclaim(t *testing.T)           { apptest.EachEnv(t, testFailedRetryableReclaim) }
func TestTerminalNeverReclaimed(t *testing.T)           { apptest.EachEnv(t, testTerminalNeverReclaimed) }
func TestReclaimAlert(t *testing.T)                     { apptest.EachEnv(t, testReclaimAlert) }
func TestHeartbeat(t *testing.T)                        { apptest.EachEnv(t, testHeartbeat) }
func TestLeaseLifetimeCap(t *testing.T)                 { apptest.EachEnv(t, testLeaseLifetimeCap) }
func TestTransitions(t *testing.T)                      { apptest.EachEnv(t, testTransitions) }
func TestLeaseLength(t *testing.T)                      { apptest.EachEnv(t, testLeaseLength) }
func TestEventsAppendOnlyAndPaged(t *testing.T)         { apptest.EachEnv(t, testEvents) }
func TestClaimEventsExact(t *testing.T)                 { apptest.EachEnv(t, testClaimEventsExact) }
func TestMigrateIsIdempotent(t *testing.T)              { apptest.EachEnv(t, testMigrateIdempotent) }
func TestConcurrentClaimsOneKey(t *testing.T)           { apptest.EachEnv(t, testConcurrentClaimsOneKey) }
func TestRefusalNeverReportsAClaimableRun(t *testing.T) { apptest.EachEnv(t, testRefusalNotClaimable) }
func TestConcurrentClaimsManyKeys(t *testing.T)         { apptest.EachEnv(t, testConcurrentClaimsManyKeys) }
func TestConcurrentReclaimOfExpiredLease(t *testing.T)  { apptest.EachEnv(t, testConcurrentReclaim) }
func TestWithinJoinsEveryStatement(t *testing.T)        { apptest.EachEnv(t, testWithin) }

var ctx = context.Background()

func testClaimNewKey(t *testing.T, e *apptest.Env) {
	res := e.Claim(t, "k1", "h1")
	r := res.Run
	apptest.Equal(t, "claimed", res.Claimed, true)
	apptest.Equal(t, "reclaimed", res.Reclaimed, false)
	apptest.Equal(t, "state", r.State, store.StateProcessing)
	apptest.Equal(t, "version", r.Version, 1)
	if r.LeaseOwner == "" {
		t.Fatal("no lease owner")
	}
	apptest.Equal(t, "lease expiry", r.LeaseExpiresAt.UTC(), e.Clock.Now().Add(apptest.LeaseConfig.DefaultLease))
	apptest.Equal(t, "events", e.Kinds(t, "k1"), []string{"claimed"})
}

func testDuplicateClaim(t *testing.T, e *apptest.Env) {
	first := e.Claim(t, "k1", "h1")
	for i := 1; i <= 3; i++ {
		res := e.Claim(t, "k1", "h1")
		apptest.Equal(t, "claimed", res.Claimed, false)
		apptest.Equal(t, "version", res.Run.Version, first.Run.Version)
		apptest.Equal(t, "duplicates", res.Run.Duplicates, i)
		if res.Run.LeaseOwner != first.Run.LeaseOwner {
			t.Fatal("a refused claim changed the owner")
		}
	}
	apptest.Equal(t, "events", e.Kinds(t, "k1"), []string{"claimed", "duplicate", "duplicate", "duplicate"})
}

func testPayloadMismatch(t *testing.T, e *apptest.Env) {
	first := e.Claim(t, "k1", "h1")
	_, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: "k1", PayloadHash: "other", Actor: "test"})
	apptest.WantErr(t, err, runs.ErrPayloadMismatch)
	r, err := e.Runs.Get(ctx, "k1")
	if err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "version", r.Version, first.Run.Version)
	apptest.Equal(t, "duplicates", r.Duplicates, 0)
	apptest.Equal(t, "payload hash", r.PayloadHash, "h1")
	apptest.Equal(t, "owner unchanged", r.LeaseOwner == first.Run.LeaseOwner, true)
	// The mismatch is recorded and alerted: no delivery of k1 will act on the edited payload.
	apptest.Equal(t, "events", e.Kinds(t, "k1"), []string{"claimed", "payload_mismatch", "alert"})
	// Even an expired lease is not reclaimed under another payload.
	e.Clock.Advance(time.Hour)
	_, err = e.Runs.Claim(ctx, runs.ClaimRequest{Key: "k1", PayloadHash: "other", Actor: "test"})
	apptest.WantErr(t, err, runs.ErrPayloadMismatch)
}

func testCompletedKeyReturnsResult(t *testing.T, e *apptest.Env) {
	r := e.Claim(t, "k1", "h1").Run
	done, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: apptest.Lease(r), To: store.StateCompleted,
		Result: json.RawMessage(`{"ticket":"T-9"}`)})
	if err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "version", done.Version, 2)
	res := e.Claim(t, "k1", "h1")
	apptest.Equal(t, "claimed", res.Claimed, false)
	apptest.Equal(t, "state", res.Run.State, store.StateCompleted)
	var got map[string]string
	if err := json.Unmarshal(res.Run.Result, &got); err != nil || got["ticket"] != "T-9" {
		t.Fatalf("result = %s (%v)", res.Run.Result, err)
	}
}

func testExpiredLeaseReclaim(t *testing.T, e *apptest.Env) {
	old := e.Claim(t, "k1", "h1").Run
	e.Clock.Advance(apptest.LeaseConfig.DefaultLease - time.Second)
	apptest.Equal(t, "claimed before expiry", e.Claim(t, "k1", "h1").Claimed, false)
	e.Clock.Advance(time.Second)
	res := e.Claim(t, "k1", "h1")
	apptest.Equal(t, "claimed after expiry", res.Claimed, true)
	apptest.Equal(t, "reclaimed", res.Reclaimed, true)
	apptest.Equal(t, "version", res.Run.Version, old.Version+1)
	apptest.Equal(t, "reclaims", res.Run.Reclaims, 1)
	if res.Run.LeaseOwner == old.LeaseOwner {
		t.Fatal("reclaim kept the old owner")
	}
	// The old owner has lost: its heartbeat and its CAS are refused, with either version.
	for _, v := range []int64{old.Version, res.Run.Version} {
		lr := apptest.Lease(old)
		lr.Version = v
		_, err := e.Runs.Heartbeat(ctx, lr, 0)
		apptest.WantErr(t, err, runs.ErrLeaseLost)
		_, err = e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: lr, To: store.StateCompleted})
		apptest.WantErr(t, err, runs.ErrLeaseLost)
	}
	// The new owner proceeds.
	if _, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: apptest.Lease(res.Run), To: store.StateCompleted}); err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "events", e.Kinds(t, "k1"), []string{"claimed", "duplicate", "lease_reclaimed", "transition"})
}

func testFailedRetryableReclaim(t *testing.T, e *apptest.Env) {
	r := e.Claim(t, "k1", "h1").Run
	failed, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: apptest.Lease(r), To: store.StateFailedRetryable})
	if err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "state", failed.State, store.StateFailedRetryable)
	// A lease released by the transition cannot be used again.
	_, err = e.Runs.Heartbeat(ctx, apptest.Lease(failed), 0)
	apptest.WantErr(t, err, runs.ErrLeaseLost)
	res := e.Claim(t, "k1", "h1")
	apptest.Equal(t, "reclaimed", res.Reclaimed, true)
	apptest.Equal(t, "state", res.Run.State, store.StateProcessing)
	apptest.Equal(t, "version", res.Run.Version, 3)
}

func testTerminalNeverReclaimed(t *testing.T, e *apptest.Env) {
	for _, to := range []store.State{store.StateCompleted, store.StateFailedTerminal} {
		key := "k-" + string(to)
		r := e.Claim(t, key, "h1").Run
		if _, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: apptest.Lease(r), To: to}); err != nil {
			t.Fatal(err)
		}
		e.Clock.Advance(24 * time.Hour)
		res := e.Claim(t, key, "h1")
		apptest.Equal(t, "claimed "+key, res.Claimed, false)
		apptest.Equal(t, "state "+key, res.Run.State, to)
	}
}

func testReclaimAlert(t *testing.T, e *apptest.Env) {
	e.Claim(t, "k1", "h1")
	for i := 1; i <= 3; i++ {
		e.Clock.Advance(apptest.LeaseConfig.DefaultLease)
		res := e.Claim(t, "k1", "h1")
		apptest.Equal(t, "reclaims", res.Run.Reclaims, i)
	}
	// ReclaimAlertAfter is 2: the third reclaim alerts.
	apptest.Equal(t, "alerts", e.Alerts.Kinds(), []string{"lease_reclaims:k1"})
	apptest.Equal(t, "events", e.Kinds(t, "k1"), []string{"claimed", "lease_reclaimed", "lease_reclaimed", "lease_reclaimed", "alert"})
}

func testHeartbeat(t *testing.T, e *apptest.Env) {
	r := e.Claim(t, "k1", "h1").Run
	e.Clock.Advance(time.Minute)
	hb, err := e.Runs.Heartbeat(ctx, apptest.Lease(r), 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "version unchanged", hb.Version, r.Version)
	apptest.Equal(t, "expiry", hb.LeaseExpiresAt.UTC(), e.Clock.Now().Add(10*time.Minute))
	// Not the owner.
	bad := apptest.Lease(r)
	bad.Owner = "someone-else"
	_, err = e.Runs.Heartbeat(ctx, bad, 0)
	apptest.WantErr(t, err, runs.ErrLeaseLost)
	// Stale version.
	bad = apptest.Lease(r)
	bad.Version = r.Version + 1
	_, err = e.Runs.Heartbeat(ctx, bad, 0)
	apptest.WantErr(t, err, runs.ErrVersionConflict)
	// Unknown key.
	bad = apptest.Lease(r)
	bad.Key = "nope"
	_, err = e.Runs.Heartbeat(ctx, bad, 0)
	apptest.WantErr(t, err, runs.ErrNotFound)
	// After expiry nobody can renew, not even the owner.
	e.Clock.Advance(10 * time.Minute)
	_, err = e.Runs.Heartbeat(ctx, apptest.Lease(r), 0)
	apptest.WantErr(t, err, runs.ErrLeaseLost)
	apptest.Equal(t, "events", e.Kinds(t, "k1"), []string{"claimed", "heartbeat"})
}

func testLeaseLifetimeCap(t *testing.T, e *apptest.Env) {
	res, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: "k1", PayloadHash: "h1", Lease: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	r := res.Run
	start := e.Clock.Now()
	limit := start.Add(apptest.LeaseConfig.MaxLeaseLifetime) // 2h
	// Renewing every 30 minutes with 1-hour leases reaches the cap at +60m.
	for _, want := range []time.Time{start.Add(90 * time.Minute), limit} {
		e.Clock.Advance(30 * time.Minute)
		hb, err := e.Runs.Heartbeat(ctx, apptest.Lease(r), time.Hour)
		if err != nil {
			t.Fatalf("at +%s: %v", e.Clock.Now().Sub(start), err)
		}
		apptest.Equal(t, "expiry", hb.LeaseExpiresAt.UTC(), want)
	}
	// At +90m the lease is live but cannot be renewed.
	e.Clock.Advance(30 * time.Minute)
	_, err = e.Runs.Heartbeat(ctx, apptest.Lease(r), time.Hour)
	apptest.WantErr(t, err, runs.ErrLeaseLifetimeExceeded)
	// The owner can still finish inside the lease.
	got, _ := e.Runs.Get(ctx, "k1")
	apptest.Equal(t, "live", got.LeaseLive(e.Clock.Now()), true)
	// At the cap it lapses; the owner claims again: a new lease with a new lifetime.
	e.Clock.Advance(30 * time.Minute)
	_, err = e.Runs.Heartbeat(ctx, apptest.Lease(r), time.Hour)
	apptest.WantErr(t, err, runs.ErrLeaseLost)
	res = e.Claim(t, "k1", "h1")
	apptest.Equal(t, "reclaimed", res.Reclaimed, true)
	apptest.Equal(t, "lease start", res.Run.LeaseStartedAt.UTC(), e.Clock.Now())
}

func testTransitions(t *testing.T, e *apptest.Env) {
	r := e.Claim(t, "k1", "h1").Run
	for _, to := range []store.State{store.StateAwaitingHuman, store.StateApproved, store.StateRejected, store.StateProcessing, "shipped"} {
		_, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: apptest.Lease(r), To: to})
		apptest.WantErr(t, err, runs.ErrInvalidTransition)
	}
	_, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: apptest.Lease(r), To: store.StateFailedRetryable, Result: json.RawMessage(`1`)})
	var fe *runs.FieldError
	if !errors.As(err, &fe) || fe.Field != "result" {
		t.Fatalf("result on a non-terminal state: err = %v", err)
	}
	stale := apptest.Lease(r)
	stale.Version = 0
	_, err = e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: stale, To: store.StateCompleted})
	apptest.WantErr(t, err, runs.ErrVersionConflict)
	stale.Key = "missing"
	_, err = e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: stale, To: store.StateCompleted})
	apptest.WantErr(t, err, runs.ErrNotFound)
	// Refused requests changed nothing.
	got, _ := e.Runs.Get(ctx, "k1")
	apptest.Equal(t, "version after refusals", got.Version, r.Version)
	apptest.Equal(t, "events after refusals", e.Kinds(t, "k1"), []string{"claimed"})

	done, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: apptest.Lease(r), To: store.StateFailedTerminal, Result: json.RawMessage(`{"why":"bad input"}`)})
	if err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "version", done.Version, r.Version+1)
	// The same request again: the version moved on, so it is a conflict, not a repeat.
	_, err = e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: apptest.Lease(r), To: store.StateFailedTerminal})
	apptest.WantErr(t, err, runs.ErrVersionConflict)
	// With the current version the lease is gone.
	_, err = e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: apptest.Lease(done), To: store.StateCompleted})
	apptest.WantErr(t, err, runs.ErrLeaseLost)
}

func testLeaseLength(t *testing.T, e *apptest.Env) {
	res, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: "k1", PayloadHash: "h", Lease: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "expiry", res.Run.LeaseExpiresAt.UTC(), e.Clock.Now().Add(30*time.Second))
	_, err = e.Runs.Claim(ctx, runs.ClaimRequest{Key: "k2", PayloadHash: "h", Lease: apptest.LeaseConfig.MaxLease + time.Second})
	var fe *runs.FieldError
	if !errors.As(err, &fe) || fe.Field != "lease_seconds" {
		t.Fatalf("over-long lease: err = %v", err)
	}
	if _, err := e.Runs.Get(ctx, "k2"); !errors.Is(err, runs.ErrNotFound) {
		t.Fatalf("a refused claim stored a run: %v", err)
	}
}

func testEvents(t *testing.T, e *apptest.Env) {
	meta := &runs.Meta{WorkflowVersion: "wf@3", Model: &runs.Model{Provider: "local", Name: "qwen", Revision: "2.5"}}
	r, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: "k1", PayloadHash: "h1", Actor: "apikey:n8n", Meta: meta, TriggerSource: "webhook"})
	if err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "trigger source", r.Run.TriggerSource, "webhook")
	apptest.Equal(t, "workflow version from meta", r.Run.WorkflowVersion, "wf@3")
	for range 4 {
		e.Claim(t, "k1", "h1")
	}
	evs, err := e.Runs.Events(ctx, "k1", 0, 2)
	if err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "page size", len(evs), 2)
	apptest.Equal(t, "actor", evs[0].Actor, "apikey:n8n")
	var m runs.Meta
	if err := json.Unmarshal(evs[0].Meta, &m); err != nil || m.Model.Name != "qwen" {
		t.Fatalf("meta = %s (%v)", evs[0].Meta, err)
	}
	rest, err := e.Runs.Events(ctx, "k1", evs[1].ID, 100)
	if err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "rest", len(rest), 3)
	if rest[0].ID <= evs[1].ID {
		t.Fatal("events out of order")
	}
	if _, err := e.Runs.Events(ctx, "missing", 0, 10); !errors.Is(err, runs.ErrNotFound) {
		t.Fatalf("events of a missing run: %v", err)
	}
}

// testClaimEventsExact pins every event a claim writes — kind, version, actor, meta,
// time and detail — so a backend's single-statement claim cannot drift from
// store.ClaimSequence.
func testClaimEventsExact(t *testing.T, e *apptest.Env) {
	type want struct {
		kind    string
		version int64
		actor   string
		meta    string // JSON, "" for none
		detail  string // JSON
	}
	check := func(key string, from int, ws ...want) {
		t.Helper()
		evs, err := e.Store.EventList(ctx, key, 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) != from+len(ws) {
			t.Fatalf("%s: %d events, want %d", key, len(evs), from+len(ws))
		}
		for i, w := range ws {
			ev := evs[from+i]
			if ev.Kind != w.kind || ev.Version != w.version || ev.Actor != w.actor || !ev.At.Equal(e.Clock.Now()) {
				t.Fatalf("%s event %d = %s v%d by %q at %s; want %s v%d by %q at %s", key, from+i,
					ev.Kind, ev.Version, ev.Actor, ev.At, w.kind, w.version, w.actor, e.Clock.Now())
			}
			if !jsonEqual(ev.Detail, w.detail) {
				t.Fatalf("%s %s detail = %s, want %s", key, w.kind, ev.Detail, w.detail)
			}
			if (w.meta == "") != (ev.Meta == nil) || (w.meta != "" && !jsonEqual(ev.Meta, w.meta)) {
				t.Fatalf("%s %s meta = %s, want %s", key, w.kind, ev.Meta, w.meta)
			}
		}
	}
	meta := &runs.Meta{WorkflowVersion: "wf@3", TriggerSource: "zendesk"}
	const metaJSON = `{"workflow_version":"wf@3","trigger_source":"zendesk"}`
	req := func(key, hash string) runs.ClaimRequest {
		return runs.ClaimRequest{Key: key, PayloadHash: hash, Actor: "apikey:n8n", Meta: meta}
	}
	// A time with a fraction: events spell it like encoding/json does for UTC.
	e.Clock.Advance(1500 * time.Millisecond)
	leaseUntil := func() string {
		return e.Clock.Now().Add(apptest.LeaseConfig.DefaultLease).UTC().Format(time.RFC3339Nano)
	}
	if _, err := e.Runs.Claim(ctx, req("k1", "h1")); err != nil {
		t.Fatal(err)
	}
	check("k1", 0, want{"claimed", 1, "apikey:n8n", metaJSON, `{"payload_hash":"h1","lease_expires_at":"2026-11-30T09:05:01.5Z"}`})
	if res, err := e.Runs.Claim(ctx, req("k1", "h1")); err != nil || res.Claimed {
		t.Fatalf("duplicate: %+v %v", res, err)
	}
	check("k1", 1, want{"duplicate", 0, "apikey:n8n", metaJSON, `{"state":"processing","duplicates":1}`})
	_, err := e.Runs.Claim(ctx, req("k1", "h2"))
	apptest.WantErr(t, err, runs.ErrPayloadMismatch)
	check("k1", 2, want{"payload_mismatch", 0, "apikey:n8n", metaJSON, `{"payload_hash":"h2","stored_payload_hash":"h1"}`},
		want{"alert", 1, "airlock", "", `{"alert":"payload_mismatch","payload_hash":"h2","state":"processing"}`})
	// Three reclaims; ReclaimAlertAfter is 2, so the third also writes an alert.
	for n := 1; n <= 3; n++ {
		e.Clock.Advance(apptest.LeaseConfig.DefaultLease + 500*time.Millisecond)
		res, err := e.Runs.Claim(ctx, req("k1", "h1"))
		if err != nil || !res.Reclaimed {
			t.Fatalf("reclaim %d: %+v %v", n, res, err)
		}
		ws := []want{{"lease_reclaimed", int64(n + 1), "apikey:n8n", metaJSON,
			fmt.Sprintf(`{"payload_hash":"h1","lease_expires_at":%q,"reclaims":%d}`, leaseUntil(), n)}}
		if n == 3 {
			ws = append(ws, want{"alert", 4, "airlock", "", `{"alert":"lease_reclaims","reclaims":3,"threshold":2}`})
		}
		check("k1", 3+n, ws...)
	}
	// A failed_retryable run is reclaimed too (no alert below the threshold).
	r := e.Claim(t, "k2", "h1").Run
	if _, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: apptest.Lease(r), To: store.StateFailedRetryable}); err != nil {
		t.Fatal(err)
	}
	res2, err := e.Runs.Claim(ctx, req("k2", "h1"))
	if err != nil || !res2.Reclaimed {
		t.Fatalf("reclaim of failed_retryable: %+v %v", res2, err)
	}
	r2 := res2.Run
	check("k2", 2, want{"lease_reclaimed", 3, "apikey:n8n", metaJSON,
		fmt.Sprintf(`{"payload_hash":"h1","lease_expires_at":%q,"reclaims":1}`, leaseUntil())})
	// A duplicate of a finished run reports its state.
	done, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: apptest.Lease(r2), To: store.StateCompleted})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: "k2", PayloadHash: "h1", Actor: "x"}); err != nil || res.Claimed || res.Run.Version != done.Version {
		t.Fatalf("claim of a completed run: %+v %v", res, err)
	}
	check("k2", 4, want{"duplicate", 0, "x", "", `{"state":"completed","duplicates":1}`})
	// The new key of a replacement carries the link to the run it replaces.
	if err := e.Store.ReplacementInsert(ctx, store.Replacement{OldKey: "k2", NewKey: "k3", Reason: "fix",
		Actor: "ops", ProviderIDs: []string{"crm-1", "mail-2"}, CreatedAt: e.Clock.Now()}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: "k3", PayloadHash: "h9", Actor: "apikey:n8n"}); err != nil {
		t.Fatal(err)
	}
	check("k3", 0, want{"claimed", 1, "apikey:n8n", "",
		fmt.Sprintf(`{"payload_hash":"h9","lease_expires_at":%q,"replaces":"k2","provider_ids":["crm-1","mail-2"]}`, leaseUntil())})
}

// jsonEqual compares a stored document with the expected one, ignoring key order and
// spacing.
func jsonEqual(got json.RawMessage, want string) bool {
	var g, w any
	if json.Unmarshal(got, &g) != nil || json.Unmarshal([]byte(want), &w) != nil {
		return false
	}
	return fmt.Sprint(g) == fmt.Sprint(w)
}

func testMigrateIdempotent(t *testing.T, e *apptest.Env) {
	e.Claim(t, "k1", "h1")
	if err := e.Store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.Store.SchemaCurrent(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Runs.Get(ctx, "k1"); err != nil {
		t.Fatal(err)
	}
}

func testConcurrentClaimsOneKey(t *testing.T, e *apptest.Env) {
	var claimed, refused atomic.Int64
	var owners sync.Map
	apptest.Race(10, func(int) {
		res, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: "hot", PayloadHash: "h"})
		if err != nil {
			t.Error(err)
			return
		}
		if res.Claimed {
			claimed.Add(1)
			owners.Store(res.Run.LeaseOwner, true)
		} else {
			refused.Add(1)
		}
	})
	apptest.Equal(t, "claimed", claimed.Load(), 1)
	apptest.Equal(t, "refused", refused.Load(), 9)
	r, _ := e.Runs.Get(ctx, "hot")
	apptest.Equal(t, "duplicates recorded", r.Duplicates, 9)
	if _, ok := owners.Load(r.LeaseOwner); !ok {
		t.Fatal("the stored owner is not the one that was told it claimed")
	}
	counts := map[string]int{}
	for _, k := range e.Kinds(t, "hot") {
		counts[k]++
	}
	apptest.Equal(t, "events", counts, map[string]int{"claimed": 1, "duplicate": 9})
}

func testConcurrentClaimsManyKeys(t *testing.T, e *apptest.Env) {
	const keys, deliveries, workers = 500, 10, 40
	// Every key delivered 10 times, in random order, to 40 racing workers.
	jobs := make([]int, 0, keys*deliveries)
	for k := range keys {
		for range deliveries {
			jobs = append(jobs, k)
		}
	}
	rand.Shuffle(len(jobs), func(i, j int) { jobs[i], jobs[j] = jobs[j], jobs[i] })
	var next atomic.Int64
	wins := make([]atomic.Int64, keys)
	apptest.Race(workers, func(int) {
		for {
			n := next.Add(1) - 1
			if n >= int64(len(jobs)) {
				return
			}
			k := jobs[n]
			res, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: fmt.Sprintf("key-%d", k), PayloadHash: "h"})
			if err != nil {
				t.Error(err)
				return
			}
			if res.Claimed {
				wins[k].Add(1)
			}
		}
	})
	for k := range wins {
		if n := wins[k].Load(); n != 1 {
			t.Fatalf("key-%d was claimed %d times; want exactly one live owner", k, n)
		}
		// Every refused delivery was counted, and every delivery has its event.
		key := fmt.Sprintf("key-%d", k)
		r, err := e.Runs.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		apptest.Equal(t, key+" duplicates", r.Duplicates, deliveries-1)
		apptest.Equal(t, key+" events", len(e.Kinds(t, key)), deliveries)
	}
}

func testConcurrentReclaim(t *testing.T, e *apptest.Env) {
	e.Claim(t, "k1", "h1")
	e.Clock.Advance(time.Hour)
	var claimed atomic.Int64
	apptest.Race(10, func(int) {
		res, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: "k1", PayloadHash: "h1"})
		if err != nil {
			t.Error(err)
			return
		}
		if res.Claimed {
			claimed.Add(1)
		}
	})
	apptest.Equal(t, "reclaims won", claimed.Load(), 1)
	r, _ := e.Runs.Get(ctx, "k1")
	apptest.Equal(t, "version", r.Version, 2)
}

// A delivery's claim is refused while the holder gives the run back (failed_retryable)
// between the claim statement and the refusal's record: the answer must be a reclaim, or
// a refusal that reports the run as it was when refused — never "refused" beside a state
// in which the claim had to be granted. Found by the fault-injecting harness.
func testRefusalNotClaimable(t *testing.T, e *apptest.Env) {
	first := e.Claim(t, "k1", "h1")
	done := make(chan error, 1)
	e.Runs.Hook = func(p string) {
		if p != "claim_refusing" {
			return
		}
		e.Runs.Hook = nil
		go func() {
			_, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: apptest.Lease(first.Run), To: store.StateFailedRetryable})
			done <- err
		}()
		select { // SQLite's claim holds the write lock: the transition waits for it
		case err := <-done:
			done <- err
		case <-time.After(300 * time.Millisecond):
		}
	}
	second := e.Claim(t, "k1", "h1")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !second.Claimed && second.Run.State == store.StateFailedRetryable {
		t.Fatalf("refused while reporting %s at version %d", second.Run.State, second.Run.Version)
	}
}

// Within: every statement made with its ctx joins its transaction — the one-statement
// claim, Store methods, and Transact as a savepoint — and nothing is seen outside before
// it commits.
func testWithin(t *testing.T, e *apptest.Env) {
	boom := errors.New("boom")
	key := store.APIKey{ID: "key-w", Name: "w", Hash: "hash-w", Scopes: []string{"runs"}, CreatedAt: e.Clock.Now()}
	err := e.Store.Within(ctx, func(ctx context.Context) error {
		if _, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: "w1", PayloadHash: "h", Actor: "test"}); err != nil {
			return err
		}
		if err := e.Store.APIKeyInsert(ctx, key); err != nil {
			return err
		}
		// A failing Transact inside rolls back its own writes only.
		err := e.Store.Transact(ctx, func(q store.Queries) error {
			if _, err := q.EventInsert(ctx, store.EventInsertParams{RunKey: "w1", Kind: "lost", Actor: "t"}); err != nil {
				return err
			}
			return boom
		})
		apptest.WantErr(t, err, boom)
		if err := e.Store.Transact(ctx, func(q store.Queries) error {
			_, err := q.EventInsert(ctx, store.EventInsertParams{RunKey: "w1", Kind: "kept", Actor: "t"})
			return err
		}); err != nil {
			return err
		}
		// Inside, the writes are visible; outside (another ctx) they are not yet.
		if _, err := e.Store.RunGet(ctx, "w1"); err != nil {
			return err
		}
		done := make(chan error, 1)
		go func() {
			_, err := e.Store.RunGet(context.Background(), "w1")
			done <- err
		}()
		select {
		case err := <-done:
			apptest.WantErr(t, err, store.ErrNotFound)
		case <-time.After(5 * time.Second):
			t.Error("a read outside waited for the transaction")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "events", e.Kinds(t, "w1"), []string{"claimed", "kept"})
	if _, err := e.Store.APIKeyByHash(ctx, "hash-w"); err != nil {
		t.Fatal(err)
	}

	// An error from fn rolls every joined write back, the one-statement claim's included.
	err = e.Store.Within(ctx, func(ctx context.Context) error {
		if _, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: "w2", PayloadHash: "h", Actor: "test"}); err != nil {
			return err
		}
		if _, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: "w1", PayloadHash: "h", Actor: "test"}); err != nil {
			return err // a duplicate: counted, then rolled back
		}
		return boom
	})
	apptest.WantErr(t, err, boom)
	_, err = e.Store.RunGet(ctx, "w2")
	apptest.WantErr(t, err, store.ErrNotFound)
	r, err := e.Store.RunGet(ctx, "w1")
	if err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "duplicates after rollback", r.Duplicates, 0)
	apptest.Equal(t, "events", e.Kinds(t, "w1"), []string{"claimed", "kept"})
}
