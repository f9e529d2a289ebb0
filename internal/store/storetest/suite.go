package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apikeys"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

// Env is one test's store, clock and service.
type Env struct {
	Store  store.Store
	Clock  *Clock
	Runs   *runs.Service
	Alerts *RecordingAlerter
}

// TestConfig is the lease configuration the suite assumes.
var TestConfig = runs.Config{
	DefaultLease:      5 * time.Minute,
	MaxLease:          time.Hour,
	MaxLeaseLifetime:  2 * time.Hour,
	ReclaimAlertAfter: 2,
}

// NewEnv opens a fresh store of backend b with a test clock (or the backend's clock when
// realClock) and a service over it.
func NewEnv(t testing.TB, b Backend, realClock bool) *Env {
	t.Helper()
	e := &Env{Alerts: &RecordingAlerter{}}
	var now func() time.Time
	if !realClock {
		e.Clock = NewClock()
		now = e.Clock.Now
	}
	e.Store = b.Open(t, e.Clock)
	e.Runs = runs.NewService(e.Store, TestConfig, e.Alerts, now)
	// Whatever a test did through airlock's own paths, every run's chain still verifies.
	t.Cleanup(func() {
		if !t.Failed() {
			VerifyChains(t, e.Store)
		}
	})
	return e
}

// RecordingAlerter keeps the alerts raised, and passes them on to Next if set.
type RecordingAlerter struct {
	mu    sync.Mutex
	kinds []string
	Next  runs.Alerter
}

func (a *RecordingAlerter) Alert(ctx context.Context, kind, key string, attrs ...slog.Attr) {
	a.mu.Lock()
	a.kinds = append(a.kinds, kind+":"+key)
	next := a.Next
	a.mu.Unlock()
	if next != nil {
		next.Alert(ctx, kind, key, attrs...)
	}
}

func (a *RecordingAlerter) Kinds() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.kinds...)
}

// Run is the conformance suite: every behaviour of runs the API promises, on backend b.
func Run(t *testing.T, b Backend) {
	tests := []struct {
		name string
		fn   func(t *testing.T, e *Env)
	}{
		{"ClaimNewKey", testClaimNewKey},
		{"DuplicateClaimCounted", testDuplicateClaim},
		{"PayloadMismatch", testPayloadMismatch},
		{"CompletedKeyReturnsResult", testCompletedKeyReturnsResult},
		{"ExpiredLeaseReclaim", testExpiredLeaseReclaim},
		{"FailedRetryableReclaim", testFailedRetryableReclaim},
		{"TerminalNeverReclaimed", testTerminalNeverReclaimed},
		{"ReclaimAlert", testReclaimAlert},
		{"Heartbeat", testHeartbeat},
		{"LeaseLifetimeCap", testLeaseLifetimeCap},
		{"Transitions", testTransitions},
		{"LeaseLength", testLeaseLength},
		{"EventsAppendOnlyAndPaged", testEvents},
		{"ClaimEventsExact", testClaimEventsExact},
		{"APIKeys", testAPIKeys},
		{"MigrateIsIdempotent", testMigrateIdempotent},
		{"ConcurrentClaimsOneKey", testConcurrentClaimsOneKey},
		{"RefusalNeverReportsAClaimableRun", testRefusalNotClaimable},
		{"ConcurrentClaimsManyKeys", testConcurrentClaimsManyKeys},
		{"ConcurrentReclaimOfExpiredLease", testConcurrentReclaim},
		{"WithinJoinsEveryStatement", testWithin},
		{"ReplayRecords", testReplayRecords},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.fn(t, NewEnv(t, b, false))
		})
	}
}

var ctx = context.Background()

func claim(t *testing.T, e *Env, key, hash string) runs.ClaimResult {
	t.Helper()
	res, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: key, PayloadHash: hash, Actor: "test"})
	if err != nil {
		t.Fatalf("claim %s: %v", key, err)
	}
	return res
}

func lease(r store.Run) runs.LeaseRequest {
	return runs.LeaseRequest{Key: r.Key, Owner: r.LeaseOwner, Version: r.Version, Actor: "test"}
}

func kinds(t *testing.T, e *Env, key string) []string {
	t.Helper()
	evs, err := e.Store.EventList(ctx, key, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ev := range evs {
		out = append(out, ev.Kind)
	}
	return out
}

func equal(t *testing.T, what string, got, want any) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s = %v, want %v", what, got, want)
	}
}

func wantErr(t *testing.T, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("err = %v, want %v", err, want)
	}
}

func testClaimNewKey(t *testing.T, e *Env) {
	res := claim(t, e, "k1", "h1")
	r := res.Run
	equal(t, "claimed", res.Claimed, true)
	equal(t, "reclaimed", res.Reclaimed, false)
	equal(t, "state", r.State, store.StateProcessing)
	equal(t, "version", r.Version, 1)
	if r.LeaseOwner == "" {
		t.Fatal("no lease owner")
	}
	equal(t, "lease expiry", r.LeaseExpiresAt.UTC(), e.Clock.Now().Add(TestConfig.DefaultLease))
	equal(t, "events", kinds(t, e, "k1"), []string{"claimed"})
}

func testDuplicateClaim(t *testing.T, e *Env) {
	first := claim(t, e, "k1", "h1")
	for i := 1; i <= 3; i++ {
		res := claim(t, e, "k1", "h1")
		equal(t, "claimed", res.Claimed, false)
		equal(t, "version", res.Run.Version, first.Run.Version)
		equal(t, "duplicates", res.Run.Duplicates, i)
		if res.Run.LeaseOwner != first.Run.LeaseOwner {
			t.Fatal("a refused claim changed the owner")
		}
	}
	equal(t, "events", kinds(t, e, "k1"), []string{"claimed", "duplicate", "duplicate", "duplicate"})
}

func testPayloadMismatch(t *testing.T, e *Env) {
	first := claim(t, e, "k1", "h1")
	_, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: "k1", PayloadHash: "other", Actor: "test"})
	wantErr(t, err, runs.ErrPayloadMismatch)
	r, err := e.Runs.Get(ctx, "k1")
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "version", r.Version, first.Run.Version)
	equal(t, "duplicates", r.Duplicates, 0)
	equal(t, "payload hash", r.PayloadHash, "h1")
	equal(t, "owner unchanged", r.LeaseOwner == first.Run.LeaseOwner, true)
	equal(t, "events", kinds(t, e, "k1"), []string{"claimed", "payload_mismatch"})
	// Even an expired lease is not reclaimed under another payload.
	e.Clock.Advance(time.Hour)
	_, err = e.Runs.Claim(ctx, runs.ClaimRequest{Key: "k1", PayloadHash: "other", Actor: "test"})
	wantErr(t, err, runs.ErrPayloadMismatch)
}

func testCompletedKeyReturnsResult(t *testing.T, e *Env) {
	r := claim(t, e, "k1", "h1").Run
	done, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: lease(r), To: store.StateCompleted,
		Result: json.RawMessage(`{"ticket":"T-9"}`)})
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "version", done.Version, 2)
	res := claim(t, e, "k1", "h1")
	equal(t, "claimed", res.Claimed, false)
	equal(t, "state", res.Run.State, store.StateCompleted)
	var got map[string]string
	if err := json.Unmarshal(res.Run.Result, &got); err != nil || got["ticket"] != "T-9" {
		t.Fatalf("result = %s (%v)", res.Run.Result, err)
	}
}

func testExpiredLeaseReclaim(t *testing.T, e *Env) {
	old := claim(t, e, "k1", "h1").Run
	e.Clock.Advance(TestConfig.DefaultLease - time.Second)
	equal(t, "claimed before expiry", claim(t, e, "k1", "h1").Claimed, false)
	e.Clock.Advance(time.Second)
	res := claim(t, e, "k1", "h1")
	equal(t, "claimed after expiry", res.Claimed, true)
	equal(t, "reclaimed", res.Reclaimed, true)
	equal(t, "version", res.Run.Version, old.Version+1)
	equal(t, "reclaims", res.Run.Reclaims, 1)
	if res.Run.LeaseOwner == old.LeaseOwner {
		t.Fatal("reclaim kept the old owner")
	}
	// The old owner has lost: its heartbeat and its CAS are refused, with either version.
	for _, v := range []int64{old.Version, res.Run.Version} {
		lr := lease(old)
		lr.Version = v
		_, err := e.Runs.Heartbeat(ctx, lr, 0)
		wantErr(t, err, runs.ErrLeaseLost)
		_, err = e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: lr, To: store.StateCompleted})
		wantErr(t, err, runs.ErrLeaseLost)
	}
	// The new owner proceeds.
	if _, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: lease(res.Run), To: store.StateCompleted}); err != nil {
		t.Fatal(err)
	}
	equal(t, "events", kinds(t, e, "k1"), []string{"claimed", "duplicate", "lease_reclaimed", "transition"})
}

func testFailedRetryableReclaim(t *testing.T, e *Env) {
	r := claim(t, e, "k1", "h1").Run
	failed, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: lease(r), To: store.StateFailedRetryable})
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "state", failed.State, store.StateFailedRetryable)
	// A lease released by the transition cannot be used again.
	_, err = e.Runs.Heartbeat(ctx, lease(failed), 0)
	wantErr(t, err, runs.ErrLeaseLost)
	res := claim(t, e, "k1", "h1")
	equal(t, "reclaimed", res.Reclaimed, true)
	equal(t, "state", res.Run.State, store.StateProcessing)
	equal(t, "version", res.Run.Version, 3)
}

func testTerminalNeverReclaimed(t *testing.T, e *Env) {
	for _, to := range []store.State{store.StateCompleted, store.StateFailedTerminal} {
		key := "k-" + string(to)
		r := claim(t, e, key, "h1").Run
		if _, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: lease(r), To: to}); err != nil {
			t.Fatal(err)
		}
		e.Clock.Advance(24 * time.Hour)
		res := claim(t, e, key, "h1")
		equal(t, "claimed "+key, res.Claimed, false)
		equal(t, "state "+key, res.Run.State, to)
	}
}

func testReclaimAlert(t *testing.T, e *Env) {
	claim(t, e, "k1", "h1")
	for i := 1; i <= 3; i++ {
		e.Clock.Advance(TestConfig.DefaultLease)
		res := claim(t, e, "k1", "h1")
		equal(t, "reclaims", res.Run.Reclaims, i)
	}
	// ReclaimAlertAfter is 2: the third reclaim alerts.
	equal(t, "alerts", e.Alerts.Kinds(), []string{"lease_reclaims:k1"})
	equal(t, "events", kinds(t, e, "k1"), []string{"claimed", "lease_reclaimed", "lease_reclaimed", "lease_reclaimed", "alert"})
}

func testHeartbeat(t *testing.T, e *Env) {
	r := claim(t, e, "k1", "h1").Run
	e.Clock.Advance(time.Minute)
	hb, err := e.Runs.Heartbeat(ctx, lease(r), 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "version unchanged", hb.Version, r.Version)
	equal(t, "expiry", hb.LeaseExpiresAt.UTC(), e.Clock.Now().Add(10*time.Minute))
	// Not the owner.
	bad := lease(r)
	bad.Owner = "someone-else"
	_, err = e.Runs.Heartbeat(ctx, bad, 0)
	wantErr(t, err, runs.ErrLeaseLost)
	// Stale version.
	bad = lease(r)
	bad.Version = r.Version + 1
	_, err = e.Runs.Heartbeat(ctx, bad, 0)
	wantErr(t, err, runs.ErrVersionConflict)
	// Unknown key.
	bad = lease(r)
	bad.Key = "nope"
	_, err = e.Runs.Heartbeat(ctx, bad, 0)
	wantErr(t, err, runs.ErrNotFound)
	// After expiry nobody can renew, not even the owner.
	e.Clock.Advance(10 * time.Minute)
	_, err = e.Runs.Heartbeat(ctx, lease(r), 0)
	wantErr(t, err, runs.ErrLeaseLost)
	equal(t, "events", kinds(t, e, "k1"), []string{"claimed", "heartbeat"})
}

func testLeaseLifetimeCap(t *testing.T, e *Env) {
	res, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: "k1", PayloadHash: "h1", Lease: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	r := res.Run
	start := e.Clock.Now()
	limit := start.Add(TestConfig.MaxLeaseLifetime) // 2h
	// Renewing every 30 minutes with 1-hour leases reaches the cap at +60m.
	for _, want := range []time.Time{start.Add(90 * time.Minute), limit} {
		e.Clock.Advance(30 * time.Minute)
		hb, err := e.Runs.Heartbeat(ctx, lease(r), time.Hour)
		if err != nil {
			t.Fatalf("at +%s: %v", e.Clock.Now().Sub(start), err)
		}
		equal(t, "expiry", hb.LeaseExpiresAt.UTC(), want)
	}
	// At +90m the lease is live but cannot be renewed.
	e.Clock.Advance(30 * time.Minute)
	_, err = e.Runs.Heartbeat(ctx, lease(r), time.Hour)
	wantErr(t, err, runs.ErrLeaseLifetimeExceeded)
	// The owner can still finish inside the lease.
	got, _ := e.Runs.Get(ctx, "k1")
	equal(t, "live", got.LeaseLive(e.Clock.Now()), true)
	// At the cap it lapses; the owner claims again: a new lease with a new lifetime.
	e.Clock.Advance(30 * time.Minute)
	_, err = e.Runs.Heartbeat(ctx, lease(r), time.Hour)
	wantErr(t, err, runs.ErrLeaseLost)
	res = claim(t, e, "k1", "h1")
	equal(t, "reclaimed", res.Reclaimed, true)
	equal(t, "lease start", res.Run.LeaseStartedAt.UTC(), e.Clock.Now())
}

func testTransitions(t *testing.T, e *Env) {
	r := claim(t, e, "k1", "h1").Run
	for _, to := range []store.State{store.StateAwaitingHuman, store.StateApproved, store.StateRejected, store.StateProcessing, "shipped"} {
		_, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: lease(r), To: to})
		wantErr(t, err, runs.ErrInvalidTransition)
	}
	_, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: lease(r), To: store.StateFailedRetryable, Result: json.RawMessage(`1`)})
	var fe *runs.FieldError
	if !errors.As(err, &fe) || fe.Field != "result" {
		t.Fatalf("result on a non-terminal state: err = %v", err)
	}
	stale := lease(r)
	stale.Version = 0
	_, err = e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: stale, To: store.StateCompleted})
	wantErr(t, err, runs.ErrVersionConflict)
	stale.Key = "missing"
	_, err = e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: stale, To: store.StateCompleted})
	wantErr(t, err, runs.ErrNotFound)
	// Refused requests changed nothing.
	got, _ := e.Runs.Get(ctx, "k1")
	equal(t, "version after refusals", got.Version, r.Version)
	equal(t, "events after refusals", kinds(t, e, "k1"), []string{"claimed"})

	done, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: lease(r), To: store.StateFailedTerminal, Result: json.RawMessage(`{"why":"bad input"}`)})
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "version", done.Version, r.Version+1)
	// The same request again: the version moved on, so it is a conflict, not a repeat.
	_, err = e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: lease(r), To: store.StateFailedTerminal})
	wantErr(t, err, runs.ErrVersionConflict)
	// With the current version the lease is gone.
	_, err = e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: lease(done), To: store.StateCompleted})
	wantErr(t, err, runs.ErrLeaseLost)
}

func testLeaseLength(t *testing.T, e *Env) {
	res, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: "k1", PayloadHash: "h", Lease: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "expiry", res.Run.LeaseExpiresAt.UTC(), e.Clock.Now().Add(30*time.Second))
	_, err = e.Runs.Claim(ctx, runs.ClaimRequest{Key: "k2", PayloadHash: "h", Lease: TestConfig.MaxLease + time.Second})
	var fe *runs.FieldError
	if !errors.As(err, &fe) || fe.Field != "lease_seconds" {
		t.Fatalf("over-long lease: err = %v", err)
	}
	if _, err := e.Runs.Get(ctx, "k2"); !errors.Is(err, runs.ErrNotFound) {
		t.Fatalf("a refused claim stored a run: %v", err)
	}
}

func testEvents(t *testing.T, e *Env) {
	meta := &runs.Meta{WorkflowVersion: "wf@3", Model: &runs.Model{Provider: "local", Name: "qwen", Revision: "2.5"}}
	r, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: "k1", PayloadHash: "h1", Actor: "apikey:n8n", Meta: meta, TriggerSource: "webhook"})
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "trigger source", r.Run.TriggerSource, "webhook")
	equal(t, "workflow version from meta", r.Run.WorkflowVersion, "wf@3")
	for range 4 {
		claim(t, e, "k1", "h1")
	}
	evs, err := e.Runs.Events(ctx, "k1", 0, 2)
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "page size", len(evs), 2)
	equal(t, "actor", evs[0].Actor, "apikey:n8n")
	var m runs.Meta
	if err := json.Unmarshal(evs[0].Meta, &m); err != nil || m.Model.Name != "qwen" {
		t.Fatalf("meta = %s (%v)", evs[0].Meta, err)
	}
	rest, err := e.Runs.Events(ctx, "k1", evs[1].ID, 100)
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "rest", len(rest), 3)
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
func testClaimEventsExact(t *testing.T, e *Env) {
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
		return e.Clock.Now().Add(TestConfig.DefaultLease).UTC().Format(time.RFC3339Nano)
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
	wantErr(t, err, runs.ErrPayloadMismatch)
	check("k1", 2, want{"payload_mismatch", 0, "apikey:n8n", metaJSON, `{"payload_hash":"h2","stored_payload_hash":"h1"}`})
	// Three reclaims; ReclaimAlertAfter is 2, so the third also writes an alert.
	for n := 1; n <= 3; n++ {
		e.Clock.Advance(TestConfig.DefaultLease + 500*time.Millisecond)
		res, err := e.Runs.Claim(ctx, req("k1", "h1"))
		if err != nil || !res.Reclaimed {
			t.Fatalf("reclaim %d: %+v %v", n, res, err)
		}
		ws := []want{{"lease_reclaimed", int64(n + 1), "apikey:n8n", metaJSON,
			fmt.Sprintf(`{"payload_hash":"h1","lease_expires_at":%q,"reclaims":%d}`, leaseUntil(), n)}}
		if n == 3 {
			ws = append(ws, want{"alert", 4, "airlock", "", `{"alert":"lease_reclaims","reclaims":3,"threshold":2}`})
		}
		check("k1", 2+n, ws...)
	}
	// A failed_retryable run is reclaimed too (no alert below the threshold).
	r := claim(t, e, "k2", "h1").Run
	if _, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: lease(r), To: store.StateFailedRetryable}); err != nil {
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
	done, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: lease(r2), To: store.StateCompleted})
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

func testAPIKeys(t *testing.T, e *Env) {
	k, raw, err := apikeys.Create(ctx, e.Store, "n8n", []string{apikeys.ScopeRuns}, e.Clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	if k.Hash == raw || k.Hash != apikeys.Hash(raw) {
		t.Fatal("the stored hash is not the key's SHA-256")
	}
	got, err := apikeys.Authenticate(ctx, e.Store, raw)
	if err != nil || got.ID != k.ID || got.Scopes[0] != apikeys.ScopeRuns {
		t.Fatalf("authenticate: %+v, %v", got, err)
	}
	if _, err := apikeys.Authenticate(ctx, e.Store, raw+"x"); !errors.Is(err, apikeys.ErrInvalid) {
		t.Fatalf("a wrong key: %v", err)
	}
	list, err := e.Store.APIKeyList(ctx)
	if err != nil || len(list) != 1 {
		t.Fatalf("list: %v, %v", list, err)
	}
	if err := e.Store.APIKeyRevoke(ctx, k.ID, e.Clock.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := apikeys.Authenticate(ctx, e.Store, raw); !errors.Is(err, apikeys.ErrRevoked) {
		t.Fatalf("a revoked key: %v", err)
	}
	if err := e.Store.APIKeyRevoke(ctx, k.ID, e.Clock.Now()); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("revoke twice: %v", err)
	}
}

func testMigrateIdempotent(t *testing.T, e *Env) {
	claim(t, e, "k1", "h1")
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

// race runs n goroutines released at once.
func race(n int, fn func(i int)) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			fn(i)
		}()
	}
	close(start)
	wg.Wait()
}

func testConcurrentClaimsOneKey(t *testing.T, e *Env) {
	var claimed, refused atomic.Int64
	var owners sync.Map
	race(10, func(int) {
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
	equal(t, "claimed", claimed.Load(), 1)
	equal(t, "refused", refused.Load(), 9)
	r, _ := e.Runs.Get(ctx, "hot")
	equal(t, "duplicates recorded", r.Duplicates, 9)
	if _, ok := owners.Load(r.LeaseOwner); !ok {
		t.Fatal("the stored owner is not the one that was told it claimed")
	}
	counts := map[string]int{}
	for _, k := range kinds(t, e, "hot") {
		counts[k]++
	}
	equal(t, "events", counts, map[string]int{"claimed": 1, "duplicate": 9})
}

func testConcurrentClaimsManyKeys(t *testing.T, e *Env) {
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
	race(workers, func(int) {
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
		equal(t, key+" duplicates", r.Duplicates, deliveries-1)
		equal(t, key+" events", len(kinds(t, e, key)), deliveries)
	}
}

func testConcurrentReclaim(t *testing.T, e *Env) {
	claim(t, e, "k1", "h1")
	e.Clock.Advance(time.Hour)
	var claimed atomic.Int64
	race(10, func(int) {
		res, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: "k1", PayloadHash: "h1"})
		if err != nil {
			t.Error(err)
			return
		}
		if res.Claimed {
			claimed.Add(1)
		}
	})
	equal(t, "reclaims won", claimed.Load(), 1)
	r, _ := e.Runs.Get(ctx, "k1")
	equal(t, "version", r.Version, 2)
}

// A delivery's claim is refused while the holder gives the run back (failed_retryable)
// between the claim statement and the refusal's record: the answer must be a reclaim, or
// a refusal that reports the run as it was when refused — never "refused" beside a state
// in which the claim had to be granted. Found by the fault-injecting harness.
func testRefusalNotClaimable(t *testing.T, e *Env) {
	first := claim(t, e, "k1", "h1")
	done := make(chan error, 1)
	e.Runs.Hook = func(p string) {
		if p != "claim_refusing" {
			return
		}
		e.Runs.Hook = nil
		go func() {
			_, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: lease(first.Run), To: store.StateFailedRetryable})
			done <- err
		}()
		select { // SQLite's claim holds the write lock: the transition waits for it
		case err := <-done:
			done <- err
		case <-time.After(300 * time.Millisecond):
		}
	}
	second := claim(t, e, "k1", "h1")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !second.Claimed && second.Run.State == store.StateFailedRetryable {
		t.Fatalf("refused while reporting %s at version %d", second.Run.State, second.Run.Version)
	}
}
