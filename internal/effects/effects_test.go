package effects_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/connector"
	"github.com/airlockhq/airlock/internal/connector/smtpconn"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

var ctx = context.Background()

// The outbox's conformance suite, each test on every backend (apptest.EachEffects).
func TestQueueUnderLease(t *testing.T) { apptest.EachEffects(t, testQueueUnderLease) }
func TestCompletionWaitsForEffects(t *testing.T) {
	apptest.EachEffects(t, testCompletionWaitsForEffects)
}
func TestDispatchOutcomes(t *testing.T)               { apptest.EachEffects(t, testDispatchOutcomes) }
func TestRetryCapFails(t *testing.T)                  { apptest.EachEffects(t, testRetryCapFails) }
func TestIdempotentProviderResent(t *testing.T)       { apptest.EachEffects(t, testIdempotentResent) }
func TestExpiredSendLeaseIsUnknown(t *testing.T)      { apptest.EachEffects(t, testExpiredSendLease) }
func TestKillSwitchHoldsQueuedAndLeased(t *testing.T) { apptest.EachEffects(t, testKillSwitch) }
func TestReconcile(t *testing.T)                      { apptest.EachEffects(t, testReconcile) }
func TestResolve(t *testing.T)                        { apptest.EachEffects(t, testResolve) }
func TestExternalWorker(t *testing.T)                 { apptest.EachEffects(t, testExternalWorker) }
func TestConcurrentDispatchersSendOnce(t *testing.T) {
	apptest.EachEffects(t, testConcurrentDispatchers)
}
func TestSMTPDispatch(t *testing.T) { apptest.EachEffects(t, testSMTPDispatch) }

func TestEnvOverrideStopsSends(t *testing.T) {
	storetest.Each(t, func(t *testing.T, b storetest.Backend) {
		for _, v := range []string{"false", "0", "no", ""} {
			e := apptest.NewEffectsEnv(t, b, v)
			if v == "" { // unset: the database decides (enabled on a fresh install)
				if ok, _ := e.Effects.Enabled(ctx, "note"); !ok {
					t.Fatal("unset AI_ACTIONS_ENABLED disabled sends")
				}
				continue
			}
			eff := e.Queue(t, "k-"+v, "note", "default", `{"n":1}`)
			e.Tick(t)
			apptest.Equal(t, "state with AI_ACTIONS_ENABLED="+v, e.EffectState(t, eff.ID), store.EffectPending)
			apptest.Equal(t, "requests", e.Provider.Total(), 0)
		}
	})
}

func testQueueUnderLease(t *testing.T, e *apptest.EffectsEnv) {
	r := e.ClaimRun(t, "k1")
	req := effects.QueueRequest{Key: "k1", Owner: r.LeaseOwner, Version: r.Version, ActionType: "note", Target: "default",
		Payload: json.RawMessage(`{"text":"hello","n":1}`)}
	first, created, run, err := e.Effects.Queue(ctx, req)
	if err != nil || !created {
		t.Fatalf("queue: %v %v", created, err)
	}
	apptest.Equal(t, "state", first.State, store.EffectPending)
	apptest.Equal(t, "run version unchanged", run.Version, r.Version)
	apptest.Equal(t, "derived effect id", first.EffectID, effects.DeriveEffectID("note", "default"))
	// The same effect again (keys reordered): the stored one, not a second.
	req.Payload = json.RawMessage(`{"n":1,"text":"hello"}`)
	again, created, _, err := e.Effects.Queue(ctx, req)
	if err != nil || created || again.ID != first.ID {
		t.Fatalf("requeue: created=%v id=%s err=%v", created, again.ID, err)
	}
	// A second effect of the run under the same lease, with its own id.
	req2 := req
	req2.EffectID, req2.Payload = "note-2", json.RawMessage(`{"text":"second"}`)
	if _, created, _, err := e.Effects.Queue(ctx, req2); err != nil || !created {
		t.Fatalf("second effect: %v %v", created, err)
	}
	refusals := []struct {
		name   string
		change func(r *effects.QueueRequest)
		want   error
	}{
		{"other payload", func(r *effects.QueueRequest) { r.Payload = json.RawMessage(`{"text":"changed"}`) }, effects.ErrEffectMismatch},
		{"unconfigured type", func(r *effects.QueueRequest) { r.ActionType = "wire_money" }, effects.ErrUnknownActionType},
		{"unconfigured target", func(r *effects.QueueRequest) { r.Target = "http://evil.example/" }, effects.ErrInvalidTarget},
		{"gated type", func(r *effects.QueueRequest) { r.ActionType = "email" }, effects.ErrApprovalRequired},
		{"stale version", func(r *effects.QueueRequest) { r.EffectID = "x"; r.Version++ }, runs.ErrVersionConflict},
		{"not the owner", func(r *effects.QueueRequest) { r.EffectID = "x"; r.Owner = "thief" }, runs.ErrLeaseLost},
	}
	for _, c := range refusals {
		r := req
		c.change(&r)
		_, _, _, err := e.Effects.Queue(ctx, r)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.name, err, c.want)
		}
	}
	list, _ := e.Effects.List(ctx, store.EffectListParams{RunKey: "k1"})
	apptest.Equal(t, "effects stored", len(list), 2)
	apptest.Equal(t, "events", e.Kinds(t, "k1"), []string{"claimed", "effect_queued", "effect_queued"})
	// After the lease expires nothing more can be queued.
	e.Clock.Advance(apptest.LeaseConfig.DefaultLease)
	req.EffectID = "late"
	if _, _, _, err := e.Effects.Queue(ctx, req); !errors.Is(err, runs.ErrLeaseLost) {
		t.Fatalf("queue after expiry: %v", err)
	}
}

func testCompletionWaitsForEffects(t *testing.T, e *apptest.EffectsEnv) {
	eff := e.Queue(t, "k1", "note", "default", `{"text":"hi"}`)
	r, _ := e.Runs.Get(ctx, "k1")
	_, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: apptest.Lease(r), To: store.StateCompleted})
	apptest.WantErr(t, err, runs.ErrEffectsOpen)
	e.Tick(t)
	got, _ := e.Effects.Get(ctx, eff.ID)
	apptest.Equal(t, "state", got.State, store.EffectCompleted)
	apptest.Equal(t, "provider id", got.ProviderID, "p-"+effects.ProviderKey(eff))
	if _, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: apptest.Lease(r), To: store.StateCompleted}); err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "events", e.Kinds(t, "k1"), []string{"claimed", "effect_queued", "effect_completed", "transition"})
}

func testDispatchOutcomes(t *testing.T, e *apptest.EffectsEnv) {
	block := make(chan struct{})
	t.Cleanup(func() { close(block) })
	e.Provider.Reply = func(w http.ResponseWriter, r *http.Request, n int) {
		var body struct{ Case string }
		_ = json.NewDecoder(r.Body).Decode(&body)
		switch body.Case {
		case "rate_limited":
			w.Header().Set("Retry-After", "120")
			w.WriteHeader(http.StatusTooManyRequests)
		case "unavailable":
			w.WriteHeader(http.StatusServiceUnavailable)
		case "bad_request":
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, "RESPONSE-SECRET internal.crm.local")
		case "server_error":
			w.WriteHeader(http.StatusInternalServerError)
		case "timeout":
			select {
			case <-block:
			case <-r.Context().Done():
			}
		default:
			w.WriteHeader(http.StatusOK)
			fmt.Fprint(w, `{"id":"n-1"}`)
		}
	}
	cases := []struct {
		name  string
		state store.EffectState
		class string
	}{
		{"ok", store.EffectCompleted, ""},
		{"rate_limited", store.EffectPending, "http_429"},
		{"unavailable", store.EffectPending, "http_503"},
		{"bad_request", store.EffectFailed, "http_400"},
		{"server_error", store.EffectUnknown, "http_500"},
		{"timeout", store.EffectUnknown, "timeout"},
	}
	ids := map[string]string{}
	for _, c := range cases {
		ids[c.name] = e.Queue(t, "k-"+c.name, "note", "default", `{"case":"`+c.name+`"}`).ID
	}
	e.Tick(t)
	for _, c := range cases {
		got, _ := e.Effects.Get(ctx, ids[c.name])
		if got.State != c.state || got.LastErrorClass != c.class {
			t.Errorf("%s: %s/%q, want %s/%q", c.name, got.State, got.LastErrorClass, c.state, c.class)
		}
		if c.name == "rate_limited" && !got.NotBefore.Equal(e.Clock.Now().Add(120*time.Second)) {
			t.Errorf("Retry-After not honoured: not_before %s", got.NotBefore)
		}
	}
	// Unknown outcomes are never resent: more rounds, no new requests.
	e.Clock.Advance(time.Hour)
	e.Tick(t)
	e.Tick(t)
	for _, c := range []string{"server_error", "timeout", "bad_request"} {
		eff, _ := e.Effects.Get(ctx, ids[c])
		apptest.Equal(t, c+" requests", e.Provider.Requests(effects.ProviderKey(eff)), 1)
	}
	// Connector errors reach events only as classes.
	evs, _ := e.Store.EventList(ctx, "k-bad_request", 0, 100)
	for _, ev := range evs {
		if strings.Contains(string(ev.Detail), "RESPONSE-SECRET") || strings.Contains(string(ev.Detail), "127.0.0.1") {
			t.Fatalf("event leaks the provider's response or address: %s", ev.Detail)
		}
	}
	alerts := strings.Join(e.Alerts.Kinds(), " ")
	for _, want := range []string{"effect_failed:k-bad_request", "effect_unknown:k-server_error", "effect_unknown:k-timeout"} {
		if !strings.Contains(alerts, want) {
			t.Errorf("alerts %q lack %s", alerts, want)
		}
	}
}

func testRetryCapFails(t *testing.T, e *apptest.EffectsEnv) {
	e.Provider.Reply = func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(http.StatusServiceUnavailable) }
	eff := e.Queue(t, "k1", "note", "default", `{"x":1}`)
	for range 3 { // max_attempts: 3
		e.Tick(t)
		e.Clock.Advance(time.Minute)
	}
	got, _ := e.Effects.Get(ctx, eff.ID)
	apptest.Equal(t, "state", got.State, store.EffectFailed)
	apptest.Equal(t, "attempts", got.Attempts, 3)
	apptest.Equal(t, "requests", e.Provider.Requests(effects.ProviderKey(eff)), 3)
	apptest.Equal(t, "events", e.Kinds(t, "k1"), []string{"claimed", "effect_queued", "effect_retry_scheduled", "effect_retry_scheduled", "effect_failed", "alert"})
}

func testIdempotentResent(t *testing.T, e *apptest.EffectsEnv) {
	e.Provider.Reply = func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			w.WriteHeader(http.StatusBadGateway) // ambiguous
			return
		}
		w.WriteHeader(http.StatusOK)
		fmt.Fprint(w, `{"id":"crm-1"}`)
	}
	eff := e.Queue(t, "k1", "crm", "default", `{"x":1}`)
	e.Tick(t)
	apptest.Equal(t, "after an ambiguous send", e.EffectState(t, eff.ID), store.EffectPending)
	e.Clock.Advance(time.Minute)
	e.Tick(t)
	got, _ := e.Effects.Get(ctx, eff.ID)
	apptest.Equal(t, "state", got.State, store.EffectCompleted)
	apptest.Equal(t, "provider id", got.ProviderID, "crm-1")
	apptest.Equal(t, "requests under one key", e.Provider.Requests(effects.ProviderKey(eff)), 2)
}

func testExpiredSendLease(t *testing.T, e *apptest.EffectsEnv) {
	note := e.Queue(t, "k1", "note", "default", `{"x":1}`)
	crm := e.Queue(t, "k2", "crm", "default", `{"x":1}`)
	// A dispatcher leases both and dies before sending.
	var leased []store.Effect
	err := e.Store.Transact(ctx, func(q store.Queries) error {
		var err error
		now := e.Clock.Now()
		leased, err = q.EffectLease(ctx, store.EffectLeaseParams{Executor: store.ExecutorDispatcher, Caps: apptest.AllTypes(e.Policy), Owner: "dead", Lease: time.Minute, Limit: 10, Now: &now})
		return err
	})
	if err != nil || len(leased) != 2 {
		t.Fatalf("lease: %d %v", len(leased), err)
	}
	e.Tick(t) // before expiry: untouched
	apptest.Equal(t, "sending", e.EffectState(t, note.ID), store.EffectSending)
	e.Clock.Advance(time.Minute)
	if err := e.Effects.SweepExpired(ctx); err != nil {
		t.Fatal(err)
	}
	// It never began sending: both are queued again, their attempt not counted.
	for _, id := range []string{note.ID, crm.ID} {
		got, _ := e.Effects.Get(ctx, id)
		apptest.Equal(t, "requeued", got.State, store.EffectPending)
		apptest.Equal(t, "attempts", got.Attempts, 0)
	}
	apptest.Equal(t, "events", e.Kinds(t, "k1"), []string{"claimed", "effect_queued", "effect_requeued"})

	// A sender that began the send and died: unknown for a plain provider, queued again
	// with the same key for an idempotent one.
	err = e.Store.Transact(ctx, func(q store.Queries) error {
		now := e.Clock.Now()
		leased, err = q.EffectLease(ctx, store.EffectLeaseParams{Executor: store.ExecutorDispatcher, Caps: apptest.AllTypes(e.Policy), Owner: "dead2", Lease: time.Minute, Limit: 10, Now: &now})
		for _, l := range leased {
			if _, err := q.EffectUpdate(ctx, store.EffectUpdateParams{ID: l.ID, From: []store.EffectState{store.EffectSending},
				Owner: "dead2", To: store.EffectSending, Started: true, Now: &now}); err != nil {
				return err
			}
		}
		return err
	})
	if err != nil || len(leased) != 2 {
		t.Fatalf("lease: %d %v", len(leased), err)
	}
	e.Clock.Advance(time.Minute)
	if err := e.Effects.SweepExpired(ctx); err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "plain provider", e.EffectState(t, note.ID), store.EffectUnknown)
	apptest.Equal(t, "idempotent provider", e.EffectState(t, crm.ID), store.EffectPending)
	apptest.Equal(t, "nothing was sent", e.Provider.Total(), 0)
}

func testKillSwitch(t *testing.T, e *apptest.EffectsEnv) {
	if ok, _ := e.Effects.Enabled(ctx, "note"); !ok {
		t.Fatal("a fresh install must start enabled")
	}
	if err := e.Effects.SetKillSwitch(ctx, effects.GlobalScope, false, "incident 42", "apikey:ops"); err != nil {
		t.Fatal(err)
	}
	queued := e.Queue(t, "k1", "note", "default", `{"x":1}`)
	e.Tick(t)
	got, _ := e.Effects.Get(ctx, queued.ID)
	apptest.Equal(t, "queued effect held", got.State, store.EffectPending)
	apptest.Equal(t, "attempts not spent", got.Attempts, 0)
	apptest.Equal(t, "blocked", got.LastErrorClass, "actions_disabled")
	apptest.Equal(t, "requests", e.Provider.Total(), 0)
	apptest.Equal(t, "events", e.Kinds(t, "k1"), []string{"claimed", "effect_queued", "send_blocked"})
	// The change itself is audited.
	evs, _ := e.Store.EventList(ctx, effects.SystemKey, 0, 10)
	if len(evs) != 1 || evs[0].Actor != "apikey:ops" || !strings.Contains(string(evs[0].Detail), "incident 42") {
		t.Fatalf("kill switch events: %+v", evs)
	}
	// Workers are refused too.
	e.Queue(t, "k2", "task", "anything", `{"x":1}`)
	if _, _, err := e.Effects.WorkerClaim(ctx, []string{"task"}, time.Minute, "w"); !errors.Is(err, effects.ErrActionsDisabled) {
		t.Fatalf("worker claim while disabled: %v", err)
	}
	// Enabled globally but disabled for one type.
	if err := e.Effects.SetKillSwitch(ctx, effects.GlobalScope, true, "resolved", "apikey:ops"); err != nil {
		t.Fatal(err)
	}
	if err := e.Effects.SetKillSwitch(ctx, effects.ActionScope("note"), false, "bad notes", "apikey:ops"); err != nil {
		t.Fatal(err)
	}
	other := e.Queue(t, "k3", "crm", "default", `{"x":1}`)
	e.Clock.Advance(time.Minute)
	e.Tick(t)
	apptest.Equal(t, "note held", e.EffectState(t, queued.ID), store.EffectPending)
	apptest.Equal(t, "crm sent", e.EffectState(t, other.ID), store.EffectCompleted)
	if err := e.Effects.SetKillSwitch(ctx, effects.ActionScope("note"), true, "fixed", "apikey:ops"); err != nil {
		t.Fatal(err)
	}
	e.Clock.Advance(time.Minute)
	e.Tick(t)
	apptest.Equal(t, "note sent after enable", e.EffectState(t, queued.ID), store.EffectCompleted)
	apptest.Equal(t, "sent once", e.Provider.Requests(effects.ProviderKey(queued)), 1)
	if err := e.Effects.SetKillSwitch(ctx, "action:nope", false, "x", "a"); !errors.Is(err, effects.ErrUnknownActionType) {
		t.Fatalf("unknown scope: %v", err)
	}
	if err := e.Effects.SetKillSwitch(ctx, effects.GlobalScope, false, " ", "a"); err == nil {
		t.Fatal("a change without a reason was accepted")
	}
}

func testReconcile(t *testing.T, e *apptest.EffectsEnv) {
	e.Provider.Reply = func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(http.StatusBadGateway) }
	one := e.Queue(t, "k-one", "note", "default", `{"x":1}`)
	none := e.Queue(t, "k-none", "note", "default", `{"x":2}`)
	several := e.Queue(t, "k-several", "note", "default", `{"x":3}`)
	e.Tick(t)
	for _, id := range []string{one.ID, none.ID, several.ID} {
		apptest.Equal(t, "unknown", e.EffectState(t, id), store.EffectUnknown)
	}
	e.Provider.Store(effects.ProviderKey(one), "rec-1")
	e.Provider.Store(effects.ProviderKey(several), "rec-2")
	e.Provider.Store(effects.ProviderKey(several), "rec-3")
	for range 2 {
		if err := e.Effects.Reconcile(ctx); err != nil {
			t.Fatal(err)
		}
	}
	got, _ := e.Effects.Get(ctx, one.ID)
	apptest.Equal(t, "one found", got.State, store.EffectCompleted)
	apptest.Equal(t, "its receipt", got.ProviderID, "rec-1")
	apptest.Equal(t, "none found, lookup not authoritative", e.EffectState(t, none.ID), store.EffectUnknown)
	apptest.Equal(t, "several found", e.EffectState(t, several.ID), store.EffectUnknown)
	apptest.Equal(t, "alerted once", strings.Count(strings.Join(e.Alerts.Kinds(), " "), "reconcile_several:k-several"), 1)
	// An authoritative lookup that finds nothing proves it was not sent: queued again.
	e.Provider.Reply = func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		w.WriteHeader(http.StatusOK)
	}
	crm := e.Queue(t, "k-crm", "crm", "default", `{"x":4}`)
	for range 5 { // idempotent: ambiguous sends are retried, up to max_attempts (5)
		e.Tick(t)
		e.Clock.Advance(time.Hour)
	}
	apptest.Equal(t, "idempotent resent", e.EffectState(t, crm.ID), store.EffectCompleted)
}

func testResolve(t *testing.T, e *apptest.EffectsEnv) {
	e.Provider.Reply = func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(http.StatusBadGateway) }
	a := e.Queue(t, "k-a", "note", "default", `{"x":1}`)
	b := e.Queue(t, "k-b", "note", "default", `{"x":2}`)
	c := e.Queue(t, "k-c", "note", "default", `{"x":3}`)
	d := e.Queue(t, "k-d", "note", "default", `{"x":5}`)
	pending := e.Queue(t, "k-p", "task", "t", `{"x":4}`)
	e.Tick(t)
	// "sent" needs the provider's id or the explicit "it gave none": an id left empty by
	// accident was answered as a receipt-less confirmation for good.
	for _, r := range []effects.Resolution{
		{Outcome: "sent", Note: "x"},
		{Outcome: "sent", ProviderID: "p-1", NoProviderID: true, Note: "x"},
		{Outcome: "not_sent", NoProviderID: true, Note: "x"},
	} {
		var fe *runs.FieldError
		if _, err := e.Effects.Resolve(ctx, d.ID, r, "cli:ana"); !errors.As(err, &fe) {
			t.Fatalf("resolve %+v: %v, want a field error", r, err)
		}
	}
	if _, err := e.Effects.Resolve(ctx, d.ID, effects.Resolution{Outcome: "sent", NoProviderID: true, Note: "the provider shows it, without an id"}, "cli:ana"); err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "sent without an id", e.EffectState(t, d.ID), store.EffectCompleted)
	evs, _ := e.Store.EventList(ctx, "k-d", 0, 100)
	var resolved struct {
		Absent bool `json:"provider_id_absent"`
	}
	if err := json.Unmarshal(evs[len(evs)-1].Detail, &resolved); err != nil || !resolved.Absent {
		t.Fatalf("resolve event without an id: %s %v", evs[len(evs)-1].Detail, err)
	}
	if _, err := e.Effects.Resolve(ctx, a.ID, effects.Resolution{Outcome: "sent", ProviderID: "crm-77", Note: "found it in the CRM"}, "cli:ana"); err != nil {
		t.Fatal(err)
	}
	got, _ := e.Effects.Get(ctx, a.ID)
	apptest.Equal(t, "sent", got.State, store.EffectCompleted)
	apptest.Equal(t, "receipt", got.ProviderID, "crm-77")
	if _, err := e.Effects.Resolve(ctx, b.ID, effects.Resolution{Outcome: "not_sent", ProviderID: "", Note: "not in the CRM"}, "cli:ana"); err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "not sent → queued", e.EffectState(t, b.ID), store.EffectPending)
	if _, err := e.Effects.Resolve(ctx, c.ID, effects.Resolution{Outcome: "abandon", ProviderID: "", Note: "customer handled by phone"}, "cli:ana"); err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "abandoned", e.EffectState(t, c.ID), store.EffectCancelled)
	if _, err := e.Effects.Resolve(ctx, pending.ID, effects.Resolution{Outcome: "sent", NoProviderID: true, Note: "x"}, "cli:ana"); !errors.Is(err, effects.ErrNotResolvable) {
		t.Fatalf("resolve a pending effect: %v", err)
	}
	if _, err := e.Effects.Resolve(ctx, c.ID, effects.Resolution{Outcome: "sent", NoProviderID: true, Note: ""}, "cli:ana"); err == nil {
		t.Fatal("resolve without a note")
	}
	if _, err := e.Effects.Resolve(ctx, "nope", effects.Resolution{Outcome: "sent", NoProviderID: true, Note: "x"}, "cli:ana"); !errors.Is(err, effects.ErrNotFound) {
		t.Fatalf("resolve a missing effect: %v", err)
	}
	evs, _ = e.Store.EventList(ctx, "k-a", 0, 100)
	last := evs[len(evs)-1]
	if last.Kind != "effect_resolved" || last.Actor != "cli:ana" || !strings.Contains(string(last.Detail), "found it in the CRM") {
		t.Fatalf("resolution not audited: %+v", last)
	}
}

func testExternalWorker(t *testing.T, e *apptest.EffectsEnv) {
	eff := e.Queue(t, "k1", "task", "slack", `{"msg":"hi"}`)
	e.Tick(t) // the dispatcher never touches worker effects
	apptest.Equal(t, "pending", e.EffectState(t, eff.ID), store.EffectPending)
	if _, _, err := e.Effects.WorkerClaim(ctx, []string{"note"}, time.Minute, "w"); !errors.Is(err, effects.ErrUnknownActionType) {
		t.Fatalf("claim of a dispatcher type: %v", err)
	}
	got, ok, err := e.Effects.WorkerClaim(ctx, []string{"task"}, time.Minute, "apikey:n8n")
	if err != nil || !ok || got.ID != eff.ID || got.State != store.EffectSending {
		t.Fatalf("claim: %v %v %+v", ok, err, got)
	}
	if _, ok, _ := e.Effects.WorkerClaim(ctx, []string{"task"}, time.Minute, "w"); ok {
		t.Fatal("a leased effect was claimed twice")
	}
	if _, err := e.Effects.WorkerReport(ctx, eff.ID, "not-me", connector.Result{Outcome: connector.Sent}, "w"); !errors.Is(err, effects.ErrEffectLeaseLost) {
		t.Fatalf("report by another worker: %v", err)
	}
	done, err := e.Effects.WorkerReport(ctx, eff.ID, got.LeaseOwner, connector.Result{Outcome: connector.Sent, ProviderID: "slack-ts-1"}, "apikey:n8n")
	if err != nil || done.State != store.EffectCompleted || done.ProviderID != "slack-ts-1" {
		t.Fatalf("complete: %+v %v", done, err)
	}
	// A worker that dies: its lease expires and the effect becomes unknown.
	lost := e.Queue(t, "k2", "task", "slack", `{"msg":"again"}`)
	if _, ok, _ := e.Effects.WorkerClaim(ctx, []string{"task"}, time.Minute, "w"); !ok {
		t.Fatal("claim")
	}
	e.Clock.Advance(time.Minute)
	e.Tick(t)
	apptest.Equal(t, "worker lease expired", e.EffectState(t, lost.ID), store.EffectUnknown)
	// A definite retryable failure goes back to pending.
	retry := e.Queue(t, "k3", "task", "slack", `{"msg":"third"}`)
	c, _, _ := e.Effects.WorkerClaim(ctx, []string{"task"}, time.Minute, "w")
	if c.ID != retry.ID {
		t.Fatalf("claimed %s, want %s", c.ID, retry.ID)
	}
	if _, err := e.Effects.WorkerReport(ctx, retry.ID, c.LeaseOwner, connector.Result{Outcome: connector.Retryable, Class: "slack_rate_limited"}, "w"); err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "retry", e.EffectState(t, retry.ID), store.EffectPending)
}

func testConcurrentDispatchers(t *testing.T, e *apptest.EffectsEnv) {
	const n = 200
	var ids []string
	for i := range n {
		ids = append(ids, effects.ProviderKey(e.Queue(t, fmt.Sprintf("k-%d", i), "note", "default", fmt.Sprintf(`{"i":%d}`, i))))
	}
	var rounds atomic.Int64
	apptest.Race(4, func(int) {
		d := &effects.Dispatcher{Service: e.Effects, BatchSize: 8, Lease: 2 * time.Minute}
		for {
			got, err := d.Tick(context.Background())
			if err != nil {
				t.Error(err)
				return
			}
			rounds.Add(1)
			if got == 0 {
				return
			}
		}
	})
	for _, id := range ids {
		if c := e.Provider.Requests(id); c != 1 {
			t.Fatalf("effect %s sent %d times", id, c)
		}
	}
	counts, err := e.Store.EffectCountByState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "completed", counts[store.EffectCompleted], n)
}

// testSMTPDispatch sends effects through the SMTP connector to a real SMTP server.
func testSMTPDispatch(t *testing.T, e *apptest.EffectsEnv) {
	ms := apptest.NewMailServer(t)
	pol, err := policy.Parse([]byte(fmt.Sprintf(`
actions:
  customer_email:
    connector: smtp
    gate: none
    smtp: {host: 127.0.0.1, port: %d, from: support@example.com, tls: none, timeout: 5s}
`, ms.Port)), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	m := pol.Action("customer_email").Section.(*smtpconn.Section)
	c, err := smtpconn.New(smtpconn.Config{Host: m.Host, Port: m.Port, From: m.From, TLS: m.TLS, Timeout: m.Timeout.D()})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := effects.New(runs.Base{Store: e.Store, Policy: pol, Clock: runs.Clock{Now: e.Clock.Now}, Alerts: e.Alerts},
		effects.Config{Connectors: map[string]connector.Connector{"customer_email": c}})
	if err != nil {
		t.Fatal(err)
	}
	d := &effects.Dispatcher{Service: svc, BatchSize: 16, Lease: time.Minute}
	r := e.ClaimRun(t, "ticket-9")
	ok, _, _, err := svc.Queue(ctx, effects.QueueRequest{Key: "ticket-9", Owner: r.LeaseOwner, Version: r.Version,
		ActionType: "customer_email", Target: "ana@example.com",
		Payload: json.RawMessage(`{"to":"ana@example.com","subject":"Your refund","text":"It is on its way."}`)})
	if err != nil {
		t.Fatal(err)
	}
	bounce, _, _, err := svc.Queue(ctx, effects.QueueRequest{Key: "ticket-9", Owner: r.LeaseOwner, Version: r.Version,
		ActionType: "customer_email", Target: "bounce@example.com",
		Payload: json.RawMessage(`{"to":"bounce@example.com","subject":"x","text":"y"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	sent, _ := svc.Get(ctx, ok.ID)
	apptest.Equal(t, "sent", sent.State, store.EffectCompleted)
	msgs := ms.Messages()
	if len(msgs) != 1 || !strings.Contains(msgs[0], "Subject: Your refund") || !strings.Contains(msgs[0], "<"+sent.ProviderID+">") {
		t.Fatalf("received %d messages; provider id %q:\n%s", len(msgs), sent.ProviderID, strings.Join(msgs, "\n---\n"))
	}
	if strings.Contains(msgs[0], "ticket-9") {
		t.Fatal("the run key reached the recipient")
	}
	failed, _ := svc.Get(ctx, bounce.ID)
	apptest.Equal(t, "permanent refusal", failed.State, store.EffectFailed)
	apptest.Equal(t, "class", failed.LastErrorClass, "smtp_550")
	// Nothing is sent twice on later rounds.
	e.Clock.Advance(time.Hour)
	if _, err := d.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "messages", len(ms.Messages()), 1)
}
