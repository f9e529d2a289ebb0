package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/connector"
	"github.com/airlockhq/airlock/internal/connector/httpconn"
	"github.com/airlockhq/airlock/internal/connector/smtpconn"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/failures"
	"github.com/airlockhq/airlock/internal/ledger"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

// Provider is a real HTTP provider for tests: it records every request by
// Idempotency-Key and answers with whatever Reply returns.
type Provider struct {
	*httptest.Server
	mu    sync.Mutex
	byKey map[string]int
	// Reply decides the answer for one request; nil answers 201 {"id": "p-<key>"}.
	Reply func(w http.ResponseWriter, r *http.Request, n int)
	// Found is what the lookup endpoint returns per effect id (ids of records).
	Found map[string][]string
	// Lookup, when set, is called with each lookup's key after its answer was read and
	// before it is written: a test holds an answer there to make it stale.
	Lookup  func(key string)
	lookups int
}

func NewProvider(t testing.TB) *Provider {
	p := &Provider{byKey: map[string]int{}, Found: map[string][]string{}}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet { // lookup
			p.mu.Lock()
			ids := slices.Clone(p.Found[r.URL.Query().Get("key")])
			p.lookups++
			hold := p.Lookup
			p.mu.Unlock()
			if hold != nil {
				hold(r.URL.Query().Get("key"))
			}
			recs := []map[string]string{}
			for _, id := range ids {
				recs = append(recs, map[string]string{"id": id})
			}
			_ = json.NewEncoder(w).Encode(recs)
			return
		}
		key := r.Header.Get("Idempotency-Key")
		p.mu.Lock()
		p.byKey[key]++
		n := p.byKey[key]
		reply := p.Reply
		p.mu.Unlock()
		if reply != nil {
			reply(w, r, n)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"p-%s"}`, key)
	}))
	t.Cleanup(p.Close)
	return p
}

// Requests returns how many requests carried this idempotency key.
func (p *Provider) Requests(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.byKey[key]
}

// Lookups returns the number of lookups received.
func (p *Provider) Lookups() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lookups
}

// Store records a send under key: the lookup finds it from then on.
func (p *Provider) Store(key, id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.Found[key] = append(p.Found[key], id)
}

// Stored returns how many records the provider holds for key.
func (p *Provider) Stored(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.Found[key])
}

// Total returns the number of send requests received.
func (p *Provider) Total() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, c := range p.byKey {
		n += c
	}
	return n
}

// EffectsEnv is Env plus an outbox whose action types send to a test provider.
type EffectsEnv struct {
	*Env
	Provider    *Provider
	Policy      *policy.Policy
	Effects     *effects.Service
	Failures    *failures.Service
	Approvals   *approvals.Service
	Ledger      *ledger.Service
	Dispatcher  *effects.Dispatcher
	Conns       map[string]connector.Connector
	envOverride string
}

// NewService is another outbox service over st (a second instance, or a store with faults
// injected), with its own clock.
func (e *EffectsEnv) NewService(st store.Store, now func() time.Time) *effects.Service {
	return effects.NewService(effects.Options{Store: st, Policy: e.Policy, Connectors: e.Conns, Alerts: e.Alerts,
		Now: now, AIActionsEnabled: e.envOverride, AIActionsEnabledSet: e.envOverride != "", Budgets: e.Failures.Budget})
}

// PolicyYAML is the test policy: note (http, not idempotent, lookup), invoice (http, not
// idempotent, authoritative lookup), crm (http, idempotent, authoritative lookup), task (worker), email (gated); console operators have the role
// ops, admins sre.
func PolicyYAML(providerURL string) string {
	return fmt.Sprintf(`
console:
  operators: {roles: [ops]}
  admins: {roles: [sre]}
actions:
  note:
    connector: http
    gate: none
    http: {url: %[1]s/notes, timeout: 2s, lookup_url: "%[1]s/notes?key={effect_id}"}
    retry: {max_attempts: 3, backoff: 1s, max_backoff: 4s}
  invoice:
    connector: http
    gate: none
    http: {url: %[1]s/invoice, timeout: 2s, lookup_url: "%[1]s/invoice?key={effect_id}", lookup_authoritative: true}
  crm:
    connector: http
    gate: none
    http: {url: %[1]s/crm, idempotent: true, timeout: 2s, lookup_url: "%[1]s/crm?key={effect_id}", lookup_authoritative: true}
  task:
    connector: worker
    gate: none
  ping:
    connector: http
    gate: none
    http: {url: %[1]s/ping, timeout: 2s}
    rate: 2
  email:
    connector: http
    http: {url: %[1]s/mail}
    approvers: {roles: [support-lead]}
    approval_ttl: 1h
  digest:
    connector: http
    gate: act_with_window
    reversible: true
    window: 10m
    approvers: {roles: [support-lead]}
    http: {url: %[1]s/digest}
  triage:
    connector: http
    gate: approve_by_exception
    reversible: true
    http: {url: %[1]s/triage}
    schema:
      type: object
      required: [label]
      properties:
        label: {enum: [duplicate, spam, other]}
        confidence: {type: number}
    rule: 'output.label in ["duplicate", "spam"] && evidence["classifier"]["score"] >= 0.95'
    evidence_sources: [classifier]
    sample_rate: 1
    approvers: {roles: [support-lead]}
  create_internal_draft:
    connector: worker
    gate: none
  share_publicly:
    connector: worker
    approvers: {roles: [support-lead]}
  reply:
    connector: http
    gate: none
    http: {url: %[1]s/reply}
    schema:
      type: object
      required: [label, text]
      additionalProperties: false
      properties:
        label: {enum: [refund, other]}
        text: {type: string, maxLength: 40}
    budgets: {max_model_calls: 4, run_deadline: 10m}
retry:
  server_error: {retry: business, max_attempts: 2, backoff: 1s, max_backoff: 2s}
validation: {max_repairs: 2}
input_schemas:
  zendesk: {type: object, required: [ticket], properties: {ticket: {type: integer}}}
`, providerURL)
}

// NewEffectsEnv opens a fresh store with an outbox over a test provider. It wires the
// services as internal/app does (budgets, Settle and Queued), but by hand: app sits above
// httpapi, and the store's suite must not import upwards.
func NewEffectsEnv(t testing.TB, b Backend, envOverride string) *EffectsEnv {
	t.Helper()
	e := &EffectsEnv{Env: NewEnv(t, b, false), Provider: NewProvider(t)}
	pol, err := policy.Parse([]byte(PolicyYAML(e.Provider.URL)), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	e.Policy = pol
	conns := map[string]connector.Connector{}
	for _, name := range []string{"note", "invoice", "crm", "email", "digest", "triage", "ping"} {
		h := pol.Action(name).HTTP
		c, err := httpconn.New(httpconn.Config{Targets: h.Targets, Idempotent: h.Idempotent, Timeout: h.Timeout.D(),
			LookupURL: h.LookupURL, LookupAuthoritative: h.LookupAuthoritative})
		if err != nil {
			t.Fatal(err)
		}
		conns[name] = c
	}
	e.Failures = failures.NewService(e.Store, pol, e.Alerts, e.Clock.Now)
	e.Runs.Budgets = e.Failures.Budget
	e.Conns, e.envOverride = conns, envOverride
	e.Effects = e.NewService(e.Store, e.Clock.Now)
	e.Approvals = approvals.NewService(e.Store, pol, e.Alerts, "http://127.0.0.1:8080", e.Clock.Now)
	e.Approvals.Settle, e.Approvals.Queued = e.Effects.Settle, e.Effects.Wake
	e.Ledger = ledger.NewService(e.Store, pol, e.Effects, e.Approvals, e.Alerts, e.Failures.Budget, e.Clock.Now)
	e.Dispatcher = &effects.Dispatcher{Service: e.Effects, BatchSize: 16, Lease: 2 * time.Minute, Interval: 10 * time.Millisecond}
	return e
}

// RunEffects is the outbox's conformance suite on backend b.
func RunEffects(t *testing.T, b Backend) {
	tests := []struct {
		name string
		fn   func(t *testing.T, e *EffectsEnv)
	}{
		{"QueueUnderLease", testQueueUnderLease},
		{"CompletionWaitsForEffects", testCompletionWaitsForEffects},
		{"DispatchOutcomes", testDispatchOutcomes},
		{"RetryCapFails", testRetryCapFails},
		{"IdempotentProviderResent", testIdempotentResent},
		{"ExpiredSendLeaseIsUnknown", testExpiredSendLease},
		{"KillSwitchHoldsQueuedAndLeased", testKillSwitch},
		{"Reconcile", testReconcile},
		{"Resolve", testResolve},
		{"ExternalWorker", testExternalWorker},
		{"ConcurrentDispatchersSendOnce", testConcurrentDispatchers},
		{"SMTPDispatch", testSMTPDispatch},
	}
	for _, tt := range append(append(tests, outboxTests...), poisonTests...) {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, NewEffectsEnv(t, b, "")) })
	}
	t.Run("EnvOverrideStopsSends", func(t *testing.T) {
		for _, v := range []string{"false", "0", "no", ""} {
			e := NewEffectsEnv(t, b, v)
			if v == "" { // unset: the database decides (enabled on a fresh install)
				if ok, _ := e.Effects.Enabled(ctx, "note"); !ok {
					t.Fatal("unset AI_ACTIONS_ENABLED disabled sends")
				}
				continue
			}
			eff := queue(t, e, "k-"+v, "note", "default", `{"n":1}`)
			tick(t, e)
			equal(t, "state with AI_ACTIONS_ENABLED="+v, effectState(t, e, eff.ID), store.EffectPending)
			equal(t, "requests", e.Provider.Total(), 0)
		}
	})
}

func claimRun(t *testing.T, e *EffectsEnv, key string) store.Run {
	t.Helper()
	return claim(t, e.Env, key, "h-"+key).Run
}

func queue(t *testing.T, e *EffectsEnv, key, action, target, payload string) store.Effect {
	t.Helper()
	r, err := e.Runs.Get(ctx, key)
	if errors.Is(err, runs.ErrNotFound) {
		r = claimRun(t, e, key)
	} else if err != nil {
		t.Fatal(err)
	}
	eff, created, _, err := e.Effects.Queue(ctx, effects.QueueRequest{Key: key, Owner: r.LeaseOwner, Version: r.Version,
		ActionType: action, Target: target, Payload: json.RawMessage(payload), Actor: "test"})
	if err != nil {
		t.Fatalf("queue %s on %s: %v", action, key, err)
	}
	if !created {
		t.Fatalf("queue %s on %s: not created", action, key)
	}
	return eff
}

func tick(t *testing.T, e *EffectsEnv) {
	t.Helper()
	if _, err := e.Dispatcher.Tick(ctx); err != nil {
		t.Fatal(err)
	}
}

func effectState(t *testing.T, e *EffectsEnv, id string) store.EffectState {
	t.Helper()
	eff, err := e.Effects.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return eff.State
}

func testQueueUnderLease(t *testing.T, e *EffectsEnv) {
	r := claimRun(t, e, "k1")
	req := effects.QueueRequest{Key: "k1", Owner: r.LeaseOwner, Version: r.Version, ActionType: "note", Target: "default",
		Payload: json.RawMessage(`{"text":"hello","n":1}`)}
	first, created, run, err := e.Effects.Queue(ctx, req)
	if err != nil || !created {
		t.Fatalf("queue: %v %v", created, err)
	}
	equal(t, "state", first.State, store.EffectPending)
	equal(t, "run version unchanged", run.Version, r.Version)
	equal(t, "derived effect id", first.EffectID, effects.DeriveEffectID("note", "default"))
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
	equal(t, "effects stored", len(list), 2)
	equal(t, "events", kinds(t, e.Env, "k1"), []string{"claimed", "effect_queued", "effect_queued"})
	// After the lease expires nothing more can be queued.
	e.Clock.Advance(TestConfig.DefaultLease)
	req.EffectID = "late"
	if _, _, _, err := e.Effects.Queue(ctx, req); !errors.Is(err, runs.ErrLeaseLost) {
		t.Fatalf("queue after expiry: %v", err)
	}
}

func testCompletionWaitsForEffects(t *testing.T, e *EffectsEnv) {
	eff := queue(t, e, "k1", "note", "default", `{"text":"hi"}`)
	r, _ := e.Runs.Get(ctx, "k1")
	_, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: lease(r), To: store.StateCompleted})
	wantErr(t, err, runs.ErrEffectsOpen)
	tick(t, e)
	got, _ := e.Effects.Get(ctx, eff.ID)
	equal(t, "state", got.State, store.EffectCompleted)
	equal(t, "provider id", got.ProviderID, "p-"+effects.ProviderKey(eff))
	if _, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: lease(r), To: store.StateCompleted}); err != nil {
		t.Fatal(err)
	}
	equal(t, "events", kinds(t, e.Env, "k1"), []string{"claimed", "effect_queued", "effect_completed", "transition"})
}

func testDispatchOutcomes(t *testing.T, e *EffectsEnv) {
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
		ids[c.name] = queue(t, e, "k-"+c.name, "note", "default", `{"case":"`+c.name+`"}`).ID
	}
	tick(t, e)
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
	tick(t, e)
	tick(t, e)
	for _, c := range []string{"server_error", "timeout", "bad_request"} {
		eff, _ := e.Effects.Get(ctx, ids[c])
		equal(t, c+" requests", e.Provider.Requests(effects.ProviderKey(eff)), 1)
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

func testRetryCapFails(t *testing.T, e *EffectsEnv) {
	e.Provider.Reply = func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(http.StatusServiceUnavailable) }
	eff := queue(t, e, "k1", "note", "default", `{"x":1}`)
	for range 3 { // max_attempts: 3
		tick(t, e)
		e.Clock.Advance(time.Minute)
	}
	got, _ := e.Effects.Get(ctx, eff.ID)
	equal(t, "state", got.State, store.EffectFailed)
	equal(t, "attempts", got.Attempts, 3)
	equal(t, "requests", e.Provider.Requests(effects.ProviderKey(eff)), 3)
	equal(t, "events", kinds(t, e.Env, "k1"), []string{"claimed", "effect_queued", "effect_retry_scheduled", "effect_retry_scheduled", "effect_failed", "alert"})
}

func testIdempotentResent(t *testing.T, e *EffectsEnv) {
	e.Provider.Reply = func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			w.WriteHeader(http.StatusBadGateway) // ambiguous
			return
		}
		w.WriteHeader(http.StatusOK)
		fmt.Fprint(w, `{"id":"crm-1"}`)
	}
	eff := queue(t, e, "k1", "crm", "default", `{"x":1}`)
	tick(t, e)
	equal(t, "after an ambiguous send", effectState(t, e, eff.ID), store.EffectPending)
	e.Clock.Advance(time.Minute)
	tick(t, e)
	got, _ := e.Effects.Get(ctx, eff.ID)
	equal(t, "state", got.State, store.EffectCompleted)
	equal(t, "provider id", got.ProviderID, "crm-1")
	equal(t, "requests under one key", e.Provider.Requests(effects.ProviderKey(eff)), 2)
}

func testExpiredSendLease(t *testing.T, e *EffectsEnv) {
	note := queue(t, e, "k1", "note", "default", `{"x":1}`)
	crm := queue(t, e, "k2", "crm", "default", `{"x":1}`)
	// A dispatcher leases both and dies before sending.
	var leased []store.Effect
	err := e.Store.Transact(ctx, func(q store.Queries) error {
		var err error
		now := e.Clock.Now()
		leased, err = q.EffectLease(ctx, store.EffectLeaseParams{Executor: store.ExecutorDispatcher, Caps: AllTypes(e.Policy), Owner: "dead", Lease: time.Minute, Limit: 10, Now: &now})
		return err
	})
	if err != nil || len(leased) != 2 {
		t.Fatalf("lease: %d %v", len(leased), err)
	}
	tick(t, e) // before expiry: untouched
	equal(t, "sending", effectState(t, e, note.ID), store.EffectSending)
	e.Clock.Advance(time.Minute)
	if err := e.Effects.SweepExpired(ctx); err != nil {
		t.Fatal(err)
	}
	// It never began sending: both are queued again, their attempt not counted.
	for _, id := range []string{note.ID, crm.ID} {
		got, _ := e.Effects.Get(ctx, id)
		equal(t, "requeued", got.State, store.EffectPending)
		equal(t, "attempts", got.Attempts, 0)
	}
	equal(t, "events", kinds(t, e.Env, "k1"), []string{"claimed", "effect_queued", "effect_requeued"})

	// A sender that began the send and died: unknown for a plain provider, queued again
	// with the same key for an idempotent one.
	err = e.Store.Transact(ctx, func(q store.Queries) error {
		now := e.Clock.Now()
		leased, err = q.EffectLease(ctx, store.EffectLeaseParams{Executor: store.ExecutorDispatcher, Caps: AllTypes(e.Policy), Owner: "dead2", Lease: time.Minute, Limit: 10, Now: &now})
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
	equal(t, "plain provider", effectState(t, e, note.ID), store.EffectUnknown)
	equal(t, "idempotent provider", effectState(t, e, crm.ID), store.EffectPending)
	equal(t, "nothing was sent", e.Provider.Total(), 0)
}

func testKillSwitch(t *testing.T, e *EffectsEnv) {
	if ok, _ := e.Effects.Enabled(ctx, "note"); !ok {
		t.Fatal("a fresh install must start enabled")
	}
	if err := e.Effects.SetKillSwitch(ctx, effects.GlobalScope, false, "incident 42", "apikey:ops"); err != nil {
		t.Fatal(err)
	}
	queued := queue(t, e, "k1", "note", "default", `{"x":1}`)
	tick(t, e)
	got, _ := e.Effects.Get(ctx, queued.ID)
	equal(t, "queued effect held", got.State, store.EffectPending)
	equal(t, "attempts not spent", got.Attempts, 0)
	equal(t, "blocked", got.LastErrorClass, "actions_disabled")
	equal(t, "requests", e.Provider.Total(), 0)
	equal(t, "events", kinds(t, e.Env, "k1"), []string{"claimed", "effect_queued", "send_blocked"})
	// The change itself is audited.
	evs, _ := e.Store.EventList(ctx, effects.SystemKey, 0, 10)
	if len(evs) != 1 || evs[0].Actor != "apikey:ops" || !strings.Contains(string(evs[0].Detail), "incident 42") {
		t.Fatalf("kill switch events: %+v", evs)
	}
	// Workers are refused too.
	queue(t, e, "k2", "task", "anything", `{"x":1}`)
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
	other := queue(t, e, "k3", "crm", "default", `{"x":1}`)
	e.Clock.Advance(time.Minute)
	tick(t, e)
	equal(t, "note held", effectState(t, e, queued.ID), store.EffectPending)
	equal(t, "crm sent", effectState(t, e, other.ID), store.EffectCompleted)
	if err := e.Effects.SetKillSwitch(ctx, effects.ActionScope("note"), true, "fixed", "apikey:ops"); err != nil {
		t.Fatal(err)
	}
	e.Clock.Advance(time.Minute)
	tick(t, e)
	equal(t, "note sent after enable", effectState(t, e, queued.ID), store.EffectCompleted)
	equal(t, "sent once", e.Provider.Requests(effects.ProviderKey(queued)), 1)
	if err := e.Effects.SetKillSwitch(ctx, "action:nope", false, "x", "a"); !errors.Is(err, effects.ErrUnknownActionType) {
		t.Fatalf("unknown scope: %v", err)
	}
	if err := e.Effects.SetKillSwitch(ctx, effects.GlobalScope, false, " ", "a"); err == nil {
		t.Fatal("a change without a reason was accepted")
	}
}

func testReconcile(t *testing.T, e *EffectsEnv) {
	e.Provider.Reply = func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(http.StatusBadGateway) }
	one := queue(t, e, "k-one", "note", "default", `{"x":1}`)
	none := queue(t, e, "k-none", "note", "default", `{"x":2}`)
	several := queue(t, e, "k-several", "note", "default", `{"x":3}`)
	tick(t, e)
	for _, id := range []string{one.ID, none.ID, several.ID} {
		equal(t, "unknown", effectState(t, e, id), store.EffectUnknown)
	}
	e.Provider.mu.Lock()
	e.Provider.Found[effects.ProviderKey(one)] = []string{"rec-1"}
	e.Provider.Found[effects.ProviderKey(several)] = []string{"rec-2", "rec-3"}
	e.Provider.mu.Unlock()
	for range 2 {
		if err := e.Effects.Reconcile(ctx); err != nil {
			t.Fatal(err)
		}
	}
	got, _ := e.Effects.Get(ctx, one.ID)
	equal(t, "one found", got.State, store.EffectCompleted)
	equal(t, "its receipt", got.ProviderID, "rec-1")
	equal(t, "none found, lookup not authoritative", effectState(t, e, none.ID), store.EffectUnknown)
	equal(t, "several found", effectState(t, e, several.ID), store.EffectUnknown)
	equal(t, "alerted once", strings.Count(strings.Join(e.Alerts.Kinds(), " "), "reconcile_several:k-several"), 1)
	// An authoritative lookup that finds nothing proves it was not sent: queued again.
	e.Provider.Reply = func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		w.WriteHeader(http.StatusOK)
	}
	crm := queue(t, e, "k-crm", "crm", "default", `{"x":4}`)
	for range 5 { // idempotent: ambiguous sends are retried, up to max_attempts (5)
		tick(t, e)
		e.Clock.Advance(time.Hour)
	}
	equal(t, "idempotent resent", effectState(t, e, crm.ID), store.EffectCompleted)
}

func testResolve(t *testing.T, e *EffectsEnv) {
	e.Provider.Reply = func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(http.StatusBadGateway) }
	a := queue(t, e, "k-a", "note", "default", `{"x":1}`)
	b := queue(t, e, "k-b", "note", "default", `{"x":2}`)
	c := queue(t, e, "k-c", "note", "default", `{"x":3}`)
	pending := queue(t, e, "k-p", "task", "t", `{"x":4}`)
	tick(t, e)
	if _, err := e.Effects.Resolve(ctx, a.ID, effects.Resolution{Outcome: "sent", ProviderID: "crm-77", Note: "found it in the CRM"}, "cli:ana"); err != nil {
		t.Fatal(err)
	}
	got, _ := e.Effects.Get(ctx, a.ID)
	equal(t, "sent", got.State, store.EffectCompleted)
	equal(t, "receipt", got.ProviderID, "crm-77")
	if _, err := e.Effects.Resolve(ctx, b.ID, effects.Resolution{Outcome: "not_sent", ProviderID: "", Note: "not in the CRM"}, "cli:ana"); err != nil {
		t.Fatal(err)
	}
	equal(t, "not sent → queued", effectState(t, e, b.ID), store.EffectPending)
	if _, err := e.Effects.Resolve(ctx, c.ID, effects.Resolution{Outcome: "abandon", ProviderID: "", Note: "customer handled by phone"}, "cli:ana"); err != nil {
		t.Fatal(err)
	}
	equal(t, "abandoned", effectState(t, e, c.ID), store.EffectCancelled)
	if _, err := e.Effects.Resolve(ctx, pending.ID, effects.Resolution{Outcome: "sent", ProviderID: "", Note: "x"}, "cli:ana"); !errors.Is(err, effects.ErrNotResolvable) {
		t.Fatalf("resolve a pending effect: %v", err)
	}
	if _, err := e.Effects.Resolve(ctx, c.ID, effects.Resolution{Outcome: "sent", ProviderID: "", Note: ""}, "cli:ana"); err == nil {
		t.Fatal("resolve without a note")
	}
	if _, err := e.Effects.Resolve(ctx, "nope", effects.Resolution{Outcome: "sent", ProviderID: "", Note: "x"}, "cli:ana"); !errors.Is(err, effects.ErrNotFound) {
		t.Fatalf("resolve a missing effect: %v", err)
	}
	evs, _ := e.Store.EventList(ctx, "k-a", 0, 100)
	last := evs[len(evs)-1]
	if last.Kind != "effect_resolved" || last.Actor != "cli:ana" || !strings.Contains(string(last.Detail), "found it in the CRM") {
		t.Fatalf("resolution not audited: %+v", last)
	}
}

func testExternalWorker(t *testing.T, e *EffectsEnv) {
	eff := queue(t, e, "k1", "task", "slack", `{"msg":"hi"}`)
	tick(t, e) // the dispatcher never touches worker effects
	equal(t, "pending", effectState(t, e, eff.ID), store.EffectPending)
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
	lost := queue(t, e, "k2", "task", "slack", `{"msg":"again"}`)
	if _, ok, _ := e.Effects.WorkerClaim(ctx, []string{"task"}, time.Minute, "w"); !ok {
		t.Fatal("claim")
	}
	e.Clock.Advance(time.Minute)
	tick(t, e)
	equal(t, "worker lease expired", effectState(t, e, lost.ID), store.EffectUnknown)
	// A definite retryable failure goes back to pending.
	retry := queue(t, e, "k3", "task", "slack", `{"msg":"third"}`)
	c, _, _ := e.Effects.WorkerClaim(ctx, []string{"task"}, time.Minute, "w")
	if c.ID != retry.ID {
		t.Fatalf("claimed %s, want %s", c.ID, retry.ID)
	}
	if _, err := e.Effects.WorkerReport(ctx, retry.ID, c.LeaseOwner, connector.Result{Outcome: connector.Retryable, Class: "slack_rate_limited"}, "w"); err != nil {
		t.Fatal(err)
	}
	equal(t, "retry", effectState(t, e, retry.ID), store.EffectPending)
}

func testConcurrentDispatchers(t *testing.T, e *EffectsEnv) {
	const n = 200
	var ids []string
	for i := range n {
		ids = append(ids, effects.ProviderKey(queue(t, e, fmt.Sprintf("k-%d", i), "note", "default", fmt.Sprintf(`{"i":%d}`, i))))
	}
	var rounds atomic.Int64
	race(4, func(int) {
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
	equal(t, "completed", counts[store.EffectCompleted], n)
}

// testSMTPDispatch sends effects through the SMTP connector to a real SMTP server.
func testSMTPDispatch(t *testing.T, e *EffectsEnv) {
	ms := NewMailServer(t)
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
	m := pol.Action("customer_email").SMTP
	c, err := smtpconn.New(smtpconn.Config{Host: m.Host, Port: m.Port, From: m.From, TLS: m.TLS, Timeout: m.Timeout.D()})
	if err != nil {
		t.Fatal(err)
	}
	svc := effects.NewService(effects.Options{Store: e.Store, Policy: pol, Alerts: e.Alerts, Now: e.Clock.Now,
		Connectors: map[string]connector.Connector{"customer_email": c}})
	d := &effects.Dispatcher{Service: svc, BatchSize: 16, Lease: time.Minute}
	r := claimRun(t, e, "ticket-9")
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
	equal(t, "sent", sent.State, store.EffectCompleted)
	msgs := ms.Messages()
	if len(msgs) != 1 || !strings.Contains(msgs[0], "Subject: Your refund") || !strings.Contains(msgs[0], "<"+sent.ProviderID+">") {
		t.Fatalf("received %d messages; provider id %q:\n%s", len(msgs), sent.ProviderID, strings.Join(msgs, "\n---\n"))
	}
	if strings.Contains(msgs[0], "ticket-9") {
		t.Fatal("the run key reached the recipient")
	}
	failed, _ := svc.Get(ctx, bounce.ID)
	equal(t, "permanent refusal", failed.State, store.EffectFailed)
	equal(t, "class", failed.LastErrorClass, "smtp_550")
	// Nothing is sent twice on later rounds.
	e.Clock.Advance(time.Hour)
	if _, err := d.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	equal(t, "messages", len(ms.Messages()), 1)
}

// AllTypes caps every configured action type at 100 in a lease (tests that lease by hand).
func AllTypes(p *policy.Policy) map[string]int {
	caps := map[string]int{}
	for _, n := range p.ActionNames() {
		caps[n] = 100
	}
	return caps
}
