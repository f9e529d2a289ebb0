// Package apptest opens, for the tests of the packages above the store, a fresh store of
// one backend (storetest.Each runs a test on every backend) with airlock's services over
// it — runs alone (Env), or the whole graph as app.New builds it (EffectsEnv) — plus a
// test HTTP provider, an in-process SMTP server and the helpers those tests share.
//
// It imports the domain packages, so their own tests use it from an external test
// package (package effects_test).
package apptest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/alerts"
	"github.com/airlockhq/airlock/internal/app"
	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/connector"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/failures"
	"github.com/airlockhq/airlock/internal/ledger"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

var ctx = context.Background()

// Env is one test's store, clock and service.
type Env struct {
	Store  store.Store
	Clock  *storetest.Clock
	Runs   *runs.Service
	Alerts *RecordingAlerter
}

// LeaseConfig is the lease configuration the tests assume.
var LeaseConfig = runs.Config{
	DefaultLease:      5 * time.Minute,
	MaxLease:          time.Hour,
	MaxLeaseLifetime:  2 * time.Hour,
	ReclaimAlertAfter: 2,
}

// NewEnv opens a fresh store of backend b with a test clock (or the backend's clock when
// realClock) and a service over it.
func NewEnv(t testing.TB, b storetest.Backend, realClock bool) *Env {
	t.Helper()
	e := &Env{Alerts: &RecordingAlerter{}}
	var now func() time.Time
	if !realClock {
		e.Clock = storetest.NewClock()
		now = e.Clock.Now
	}
	e.Store = b.Open(t, e.Clock)
	relay, err := alerts.New(runs.Base{Store: e.Store}, alerts.Config{Alerter: e.Alerts})
	if err != nil {
		t.Fatal(err)
	}
	e.Alerts.Relay = relay
	if e.Runs, err = runs.New(runs.Base{Store: e.Store, Clock: runs.Clock{Now: now}, Alerts: e.Alerts}, LeaseConfig); err != nil {
		t.Fatal(err)
	}
	// Whatever a test did through airlock's own paths, every run's chain still verifies.
	t.Cleanup(func() {
		if !t.Failed() {
			VerifyChains(t, e.Store)
		}
	})
	return e
}

// RecordingAlerter keeps the alerts raised, and passes them on to Next if set. It is also
// the services' AlertWaker in tests: Wake raises the committed alerts at once, in the
// caller's goroutine, through Relay (its own relay over the environment's store), so a
// test sees an alert as soon as the call that committed it has returned.
type RecordingAlerter struct {
	mu     sync.Mutex
	kinds  []string
	ids    []int64
	others []*alerts.Relay
	Next   runs.Alerter
	// Relay raises the store's alert outbox into this recorder (NewEnv sets it).
	Relay *alerts.Relay
}

func (a *RecordingAlerter) Alert(ctx context.Context, kind, key string, attrs ...slog.Attr) {
	var id int64
	for _, at := range attrs {
		if at.Key == "event_id" {
			id = at.Value.Int64()
		}
	}
	a.mu.Lock()
	a.kinds = append(a.kinds, kind+":"+key)
	a.ids = append(a.ids, id)
	next := a.Next
	a.mu.Unlock()
	if next != nil {
		next.Alert(ctx, kind, key, attrs...)
	}
}

// Wake raises the outbox's alerts now (runs.AlertWaker).
func (a *RecordingAlerter) Wake() {
	if a.Relay != nil {
		_, _ = a.Relay.Drain(ctx) // a failure leaves them for the next Wake or Kinds
	}
}

// Also makes Kinds flush r first: another relay that raises into this recorder (an app's,
// which drains in the background when woken).
func (a *RecordingAlerter) Also(r *alerts.Relay) {
	a.mu.Lock()
	a.others = append(a.others, r)
	a.mu.Unlock()
}

// Flush raises every alert committed so far: the other relays' background drains end,
// then Relay drains what is left.
func (a *RecordingAlerter) Flush(t testing.TB) {
	t.Helper()
	a.mu.Lock()
	others := slices.Clone(a.others)
	a.mu.Unlock()
	for _, r := range append(others, a.Relay) {
		if r == nil {
			continue
		}
		if err := r.Flush(ctx); err != nil {
			t.Fatalf("flush alerts: %v", err)
		}
	}
}

// Kinds are the alerts raised so far as kind:key, after raising the committed ones that
// no relay has raised yet (Flush).
func (a *RecordingAlerter) Kinds() []string {
	a.mu.Lock()
	others := slices.Clone(a.others)
	a.mu.Unlock()
	for _, r := range append(others, a.Relay) {
		if r != nil {
			_ = r.Flush(ctx)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.kinds...)
}

// EventIDs are the event ids of the alerts raised so far, in the order raised (a
// repeated one was raised again).
func (a *RecordingAlerter) EventIDs() []int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.ids)
}

// Claim claims key with payload hash hash, failing t on an error.
func (e *Env) Claim(t *testing.T, key, hash string) runs.ClaimResult {
	t.Helper()
	res, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: key, PayloadHash: hash, Actor: "test"})
	if err != nil {
		t.Fatalf("claim %s: %v", key, err)
	}
	return res
}

// Lease is the lease request of r as its holder would send it.
func Lease(r store.Run) runs.LeaseRequest {
	return runs.LeaseRequest{Key: r.Key, Owner: r.LeaseOwner, Version: r.Version, Actor: "test"}
}

// Kinds are the kinds of key's events, oldest first.
func (e *Env) Kinds(t *testing.T, key string) []string {
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

// Equal fails t unless got and want print the same.
func Equal(t *testing.T, what string, got, want any) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s = %v, want %v", what, got, want)
	}
}

// WantErr fails t unless err is want (errors.Is).
func WantErr(t *testing.T, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("err = %v, want %v", err, want)
	}
}

// Race runs n goroutines released at once.
func Race(n int, fn func(i int)) {
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

// SetReply sets Reply while requests may be arriving.
func (p *Provider) SetReply(reply func(w http.ResponseWriter, r *http.Request, n int)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.Reply = reply
}

// SetLookup sets Lookup while requests may be arriving.
func (p *Provider) SetLookup(hold func(key string)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.Lookup = hold
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
	App         *app.App // the graph the services above belong to
	envOverride string
}

// Base is the services' Base over st (a second instance, or a store with faults
// injected) on the clock now, waking this environment's alert recorder.
func (e *EffectsEnv) Base(st store.Store, now func() time.Time) runs.Base {
	return runs.Base{Store: st, Policy: e.Policy, Clock: runs.Clock{Now: now}, Alerts: e.Alerts}
}

// NewService is another outbox service over st, with its own clock (and no approvals:
// gated types are refused).
func (e *EffectsEnv) NewService(st store.Store, now func() time.Time) *effects.Service {
	return e.NewServiceOn(e.Base(st, now))
}

// NewServiceOn is another outbox service over b (its own log or observer).
func (e *EffectsEnv) NewServiceOn(b runs.Base) *effects.Service {
	s, err := effects.New(b, effects.Config{Connectors: e.Conns, AIActionsEnabled: e.envOverride, AIActionsEnabledSet: e.envOverride != ""})
	if err != nil {
		panic(err) // only a missing store fails, and a test gives one
	}
	return s
}

// NewApprovals is another approvals service over st, with its own clock, whose decisions
// enter the outbox through an outbox of its own over st.
func (e *EffectsEnv) NewApprovals(st store.Store, now func() time.Time) *approvals.Service {
	b := e.Base(st, now)
	outbox, err := effects.NewOutbox(b)
	if err != nil {
		panic(err)
	}
	s, err := approvals.New(b, approvals.Config{Outbox: outbox, PublicURL: "http://127.0.0.1:8080"})
	if err != nil {
		panic(err)
	}
	return s
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

// NewEffectsEnv opens a fresh store of backend b with airlock's services over it, wired
// by app.New as `airlock serve` wires them, on the test clock, with connectors to a test
// provider and a dispatcher the test ticks by hand. envOverride is AI_ACTIONS_ENABLED
// ("": unset).
func NewEffectsEnv(t testing.TB, b storetest.Backend, envOverride string) *EffectsEnv {
	t.Helper()
	return NewEffectsEnvWith(t, b, envOverride, nil)
}

// NewEffectsEnvWith is NewEffectsEnv with configure applied to the graph's options before
// app.New builds it, once: a test that serves the graph sets its public URL, logger,
// metrics and pages there, or another policy and connectors. The environment's Policy and
// Conns are the options' after configure, its services the graph's, App the graph.
func NewEffectsEnvWith(t testing.TB, b storetest.Backend, envOverride string, configure func(e *EffectsEnv, o *app.Options)) *EffectsEnv {
	t.Helper()
	e := &EffectsEnv{Env: NewEnv(t, b, false), Provider: NewProvider(t)}
	pol, err := policy.Parse([]byte(PolicyYAML(e.Provider.URL)), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	e.Policy = pol
	conns, err := app.Connectors(pol) // each from its kind's section, as `airlock serve` builds them
	if err != nil {
		t.Fatal(err)
	}
	e.Conns, e.envOverride = conns, envOverride
	o := app.Options{Store: e.Store, Policy: pol, Connectors: conns, Runs: LeaseConfig,
		PublicURL: "http://127.0.0.1:8080", Now: e.Clock.Now, Alerts: e.Alerts,
		AIActionsEnabled: envOverride, AIActionsEnabledSet: envOverride != ""}
	if configure != nil {
		configure(e, &o)
	}
	a, err := app.New(o)
	if err != nil {
		t.Fatal(err)
	}
	e.App, e.Policy, e.Conns = a, o.Policy, o.Connectors
	e.Runs, e.Failures, e.Effects, e.Approvals, e.Ledger = a.Runs, a.Failures, a.Effects, a.Approvals, a.Ledger
	e.Alerts.Also(a.Alerts)
	e.Dispatcher = &effects.Dispatcher{Service: e.Effects, BatchSize: 16, Lease: 2 * time.Minute, Interval: 10 * time.Millisecond}
	return e
}

// ClaimRun claims key (payload hash "h-"+key) and returns the run.
func (e *EffectsEnv) ClaimRun(t *testing.T, key string) store.Run {
	t.Helper()
	return e.Claim(t, key, "h-"+key).Run
}

// Queue queues one effect on key's run (claiming it first if it does not exist).
func (e *EffectsEnv) Queue(t *testing.T, key, action, target, payload string) store.Effect {
	t.Helper()
	r, err := e.Runs.Get(ctx, key)
	if errors.Is(err, runs.ErrNotFound) {
		r = e.ClaimRun(t, key)
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

// Tick runs one pass of the dispatcher.
func (e *EffectsEnv) Tick(t *testing.T) {
	t.Helper()
	if _, err := e.Dispatcher.Tick(ctx); err != nil {
		t.Fatal(err)
	}
}

// EffectState is effect id's state now.
func (e *EffectsEnv) EffectState(t *testing.T, id string) store.EffectState {
	t.Helper()
	eff, err := e.Effects.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return eff.State
}

// AllTypes caps every configured action type at 100 in a lease (tests that lease by hand).
func AllTypes(p *policy.Policy) map[string]int {
	caps := map[string]int{}
	for _, n := range p.ActionNames() {
		caps[n] = 100
	}
	return caps
}

// Current is key's run now.
func (e *EffectsEnv) Current(t *testing.T, key string) store.Run {
	t.Helper()
	r, err := e.Runs.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Fail reports a failure of class on key's run under its current lease.
func (e *EffectsEnv) Fail(t *testing.T, key, class string, retryAfter time.Duration) failures.Decision {
	t.Helper()
	d, err := e.Failures.Failure(ctx, failures.FailureRequest{LeaseRequest: Lease(e.Current(t, key)), Class: class, RetryAfter: retryAfter})
	if err != nil {
		t.Fatalf("failure %s: %v", class, err)
	}
	return d
}

// LedgerDoc is a valid ledger document of run key at checkpoint cv.
func LedgerDoc(key string, cv int, next string, invariants ...string) json.RawMessage {
	if invariants == nil {
		invariants = []string{"no customer names leave the company"}
	}
	inv, _ := json.Marshal(invariants)
	return json.RawMessage(fmt.Sprintf(`{"run_id":%q,"goal":"weekly report","invariants":%s,
		"completed":[{"step":"sources_collected","evidence":"artifact://sources-v3.json"}],
		"pending":["compare_figures"],"next_allowed_action":%q,"checkpoint_version":%d}`, key, inv, next, cv))
}

// Owner is the lease owner of key's run now.
func (e *EffectsEnv) Owner(t *testing.T, key string) string {
	t.Helper()
	return e.Current(t, key).LeaseOwner
}

// Plan plans effect id (create_internal_draft on docs) on key's run under its lease.
func (e *EffectsEnv) Plan(key, id, input string) (ledger.PlanResult, error) {
	r, _ := e.Runs.Get(ctx, key)
	return e.Ledger.Plan(ctx, ledger.PlanRequest{Key: key, EffectID: id, Owner: r.LeaseOwner, Action: "create_internal_draft",
		Target: "docs", InputHash: input, Actor: "test"})
}

// HookOn calls fn at one named point only.
func HookOn(point string, fn func()) func(string) {
	return func(p string) {
		if p == point {
			fn()
		}
	}
}

// WaitFor polls cond for up to 10 s (a deadline for a failing test, not a timing claim).
func WaitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// LockedBuffer collects output written from several goroutines (logs, a process's
// output copier).
type LockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// VerifyChains fails t unless every run's chain in st verifies.
func VerifyChains(t testing.TB, st store.Store) int {
	t.Helper()
	n, bad := 0, 0
	err := audit.New(st, nil).VerifyAll(context.Background(), func(c audit.ChainCheck) error {
		n++
		if !c.OK {
			t.Errorf("chain of %q: %s (event %d)", c.Key, c.Problem, c.BadEventID)
			bad++
		}
		if bad == 5 {
			return errors.New("five broken chains: the rest is not checked")
		}
		if n == maxVerified {
			return errStop
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		t.Fatalf("verify all: %v", err)
	}
	return n
}

// maxVerified bounds the runs VerifyChains checks after a test: the cost suite plants
// tens of thousands of one-event runs, all alike.
const maxVerified = 500

var errStop = errors.New("enough runs checked")

// AddApprover adds an enabled local account (no usable password) holding roles, so that
// the approvals it may decide are not undecidable (approvals.Holders).
func (e *Env) AddApprover(t testing.TB, name string, roles ...string) {
	t.Helper()
	if err := e.Store.UserInsert(context.Background(), store.User{ID: "user-" + name, Name: name, PasswordHash: "!",
		Roles: roles, CreatedAt: e.Clock.Now()}); err != nil {
		t.Fatal(err)
	}
}
