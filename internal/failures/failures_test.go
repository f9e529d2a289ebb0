package failures_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/failures"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

var ctx = context.Background()

// The failure handling's conformance suite, each test on every backend.
func TestValidateThenQueueValidatedValue(t *testing.T)   { apptest.EachEffects(t, testValidateThenQueue) }
func TestRepairFencedAndProseWithinBound(t *testing.T)   { apptest.EachEffects(t, testRepairBound) }
func TestInvalidOutputErrorsAndTerminal(t *testing.T)    { apptest.EachEffects(t, testInvalidOutput) }
func TestTransportRetryCapReachedExactly(t *testing.T)   { apptest.EachEffects(t, testTransportRetryCap) }
func TestRetryAfterHonoured(t *testing.T)                { apptest.EachEffects(t, testRetryAfter) }
func TestBusinessRetryReleasesTheRun(t *testing.T)       { apptest.EachEffects(t, testBusinessRetry) }
func TestTerminalAndUnknownCommit(t *testing.T)          { apptest.EachEffects(t, testTerminalAndUnknownCommit) }
func TestPartialSuccessRetriesOnlyTheWrite(t *testing.T) { apptest.EachEffects(t, testPartialSuccess) }
func TestDeadlineStopsStackedRetries(t *testing.T)       { apptest.EachEffects(t, testDeadline) }
func TestBudgets(t *testing.T)                           { apptest.EachEffects(t, testBudgets) }
func TestReplacement(t *testing.T)                       { apptest.EachEffects(t, testReplacement) }
func TestInputSchema(t *testing.T)                       { apptest.EachEffects(t, testInputSchema) }

func validate(t *testing.T, e *apptest.EffectsEnv, key, output string) failures.ValidateResult {
	t.Helper()
	res, err := e.Failures.Validate(ctx, failures.ValidateRequest{LeaseRequest: apptest.Lease(e.Current(t, key)), ActionType: "reply", Output: json.RawMessage(output)})
	if err != nil {
		t.Fatalf("validate: %v", err)
	}
	return res
}

func testValidateThenQueue(t *testing.T, e *apptest.EffectsEnv) {
	r := e.ClaimRun(t, "t1")
	q := effects.QueueRequest{Key: "t1", Owner: r.LeaseOwner, Version: r.Version, ActionType: "reply", Target: "default"}
	if _, _, _, err := e.Effects.Queue(ctx, q); !errors.Is(err, effects.ErrNotValidated) {
		t.Fatalf("queue before validation: %v", err)
	}
	res := validate(t, e, "t1", `{"label":"refund","text":"Refund on its way"}`)
	if !res.Valid || res.Repaired || res.Errors != nil {
		t.Fatalf("valid output: %+v", res)
	}
	q.Payload = json.RawMessage(`{"label":"other","text":"something else"}`)
	if _, _, _, err := e.Effects.Queue(ctx, q); !errors.Is(err, effects.ErrNotValidated) {
		t.Fatalf("queue of another payload: %v", err)
	}
	q.Payload = nil
	eff, created, _, err := e.Effects.Queue(ctx, q)
	if err != nil || !created {
		t.Fatalf("queue: %v", err)
	}
	got, _ := e.Effects.Get(ctx, eff.ID)
	var v map[string]string
	if err := json.Unmarshal(got.Payload, &v); err != nil || v["label"] != "refund" {
		t.Fatalf("queued payload %s", got.Payload)
	}
	run := e.Current(t, "t1")
	apptest.Equal(t, "validations counted", run.Validations, 1)
	apptest.Equal(t, "action type recorded", run.ActionType, "reply")
}

func testRepairBound(t *testing.T, e *apptest.EffectsEnv) {
	e.ClaimRun(t, "t1")
	fenced, _ := json.Marshal("Sure! Here it is:\n```json\n{\"label\": \"refund\", \"text\": \"Done\"}\n```\nAnything else?")
	res := validate(t, e, "t1", string(fenced))
	if !res.Valid || !res.Repaired {
		t.Fatalf("fenced: %+v", res)
	}
	prose, _ := json.Marshal(`I think the answer is {"label": "other", "text": "see {braces} \"quoted\""} — hope that helps`)
	res = validate(t, e, "t1", string(prose))
	if !res.Valid || !res.Repaired || res.Run.Repairs != 2 {
		t.Fatalf("prose: %+v", res)
	}
	// The bound (2) is used up: the next output that needs fixing fails the run.
	res = validate(t, e, "t1", string(fenced))
	if res.Valid || res.Run.State != store.StateFailedTerminal {
		t.Fatalf("past the bound: valid=%v state=%s", res.Valid, res.Run.State)
	}
	if !strings.Contains(strings.Join(e.Alerts.Kinds(), " "), "validation_failed:t1") {
		t.Fatalf("alerts: %v", e.Alerts.Kinds())
	}
	// Plain JSON text is no repair.
	e.ClaimRun(t, "t2")
	text, _ := json.Marshal(`{"label":"refund","text":"ok"}`)
	res = validate(t, e, "t2", string(text))
	if !res.Valid || res.Repaired || res.Run.Repairs != 0 {
		t.Fatalf("JSON as text: %+v", res)
	}
}

func testInvalidOutput(t *testing.T, e *apptest.EffectsEnv) {
	e.ClaimRun(t, "t1")
	const secret = "PRIVATE-REASONING-7731"
	out := `{"label":"` + secret + `","text":"` + strings.Repeat("x", 60) + `","extra":1}`
	res := validate(t, e, "t1", out)
	if res.Valid || res.Run.State != store.StateProcessing {
		t.Fatalf("first invalid output: %+v", res)
	}
	got := map[string]string{}
	for _, er := range res.Errors {
		got[er.Pointer+" "+er.Keyword] = er.Message
	}
	for _, want := range []string{"/label enum", "/text maxLength", " additionalProperties"} {
		if _, ok := got[want]; !ok {
			t.Errorf("no error %q in %v", want, res.Errors)
		}
	}
	res = validate(t, e, "t1", `{"label":"refund"}`)
	if res.Valid || res.Run.State != store.StateFailedTerminal {
		t.Fatalf("second invalid output: state %s", res.Run.State)
	}
	// Neither the raw output nor its text reached an event: only its hash and the errors.
	evs, _ := e.Store.EventList(ctx, "t1", 0, 100)
	var sawHash bool
	for _, ev := range evs {
		if strings.Contains(string(ev.Detail), secret) || strings.Contains(string(ev.Detail), "xxxxxxxxxx") {
			t.Fatalf("event %s holds the raw output: %s", ev.Kind, ev.Detail)
		}
		sawHash = sawHash || strings.Contains(string(ev.Detail), `"output_hash"`)
	}
	if !sawHash {
		t.Fatal("no validation event records the output's hash")
	}
	apptest.Equal(t, "events", e.Kinds(t, "t1"), []string{"claimed", "validation", "validation", "transition", "alert"})
}

func testTransportRetryCap(t *testing.T, e *apptest.EffectsEnv) {
	r := e.ClaimRun(t, "t1")
	for i := 1; i <= 2; i++ {
		d := e.Fail(t, "t1", "transport_timeout", 0)
		if d.Decision != failures.DecisionRetry || d.Level != "transport" || d.Attempts != i || d.RetryAfter <= 0 || d.RetryAfter > 10*time.Second {
			t.Fatalf("attempt %d: %+v", i, d)
		}
		apptest.Equal(t, "version kept", d.Run.Version, r.Version)
		apptest.Equal(t, "state kept", d.Run.State, store.StateProcessing)
		apptest.Equal(t, "lease kept", e.Current(t, "t1").LeaseLive(e.Clock.Now()), true)
	}
	d := e.Fail(t, "t1", "transport_timeout", 0) // the third: max_attempts 3 reached exactly
	if d.Decision != failures.DecisionTerminal || d.Reason != "retry_cap" || d.Run.State != store.StateFailedTerminal {
		t.Fatalf("at the cap: %+v", d)
	}
	if !strings.Contains(strings.Join(e.Kinds(t, "t1"), " "), "retry_cap") || !strings.Contains(strings.Join(e.Alerts.Kinds(), " "), "retry_cap:t1") {
		t.Fatalf("no retry-cap event or alert: %v %v", e.Kinds(t, "t1"), e.Alerts.Kinds())
	}
	// Classes count separately.
	e.ClaimRun(t, "t2")
	e.Fail(t, "t2", "transport_timeout", 0)
	if d := e.Fail(t, "t2", "rate_limited", 0); d.Attempts != 1 {
		t.Fatalf("rate_limited attempts %d", d.Attempts)
	}
}

func testRetryAfter(t *testing.T, e *apptest.EffectsEnv) {
	e.ClaimRun(t, "t1")
	d := e.Fail(t, "t1", "rate_limited", 45*time.Second)
	if d.Decision != failures.DecisionRetry || d.RetryAfter < 45*time.Second {
		t.Fatalf("Retry-After not honoured: %+v", d)
	}
}

func testBusinessRetry(t *testing.T, e *apptest.EffectsEnv) {
	r := e.ClaimRun(t, "t1")
	d := e.Fail(t, "t1", "server_error", 0) // configured: business, 2 attempts
	if d.Decision != failures.DecisionRetry || d.Level != "business" || d.Run.State != store.StateFailedRetryable || d.Run.Version != r.Version+1 {
		t.Fatalf("business retry: %+v", d)
	}
	res := e.Claim(t, "t1", "h-t1")
	apptest.Equal(t, "the next delivery reclaims it", res.Reclaimed, true)
	d = e.Fail(t, "t1", "server_error", 0)
	apptest.Equal(t, "cap", d.Reason, "retry_cap")
	apptest.Equal(t, "state", e.Current(t, "t1").State, store.StateFailedTerminal)
}

func testTerminalAndUnknownCommit(t *testing.T, e *apptest.EffectsEnv) {
	e.ClaimRun(t, "t1")
	d := e.Fail(t, "t1", "client_error", 0)
	if d.Decision != failures.DecisionTerminal || d.Reason != "never" || d.Run.State != store.StateFailedTerminal {
		t.Fatalf("client_error: %+v", d)
	}
	e.ClaimRun(t, "t2")
	d = e.Fail(t, "t2", "unknown_commit", 0)
	if d.Decision != failures.DecisionReconcile || d.Run.State != store.StateAwaitingHuman || d.Run.ParkReason != "unknown_commit" {
		t.Fatalf("unknown_commit: %+v", d)
	}
	e.Clock.Advance(24 * time.Hour)
	if res := e.Claim(t, "t2", "h-t2"); res.Claimed {
		t.Fatal("a delivery reclaimed a run parked for reconciliation")
	}
	if _, err := e.Failures.Failure(ctx, failures.FailureRequest{LeaseRequest: apptest.Lease(e.Current(t, "t2")), Class: "bogus"}); err == nil {
		t.Fatal("an unknown class was accepted")
	}
}

func testPartialSuccess(t *testing.T, e *apptest.EffectsEnv) {
	e.Provider.Reply = func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusOK)
	}
	eff := e.Queue(t, "t1", "note", "default", `{"n":1}`)
	e.Tick(t)
	apptest.Equal(t, "failed", e.EffectState(t, eff.ID), store.EffectFailed)
	d := e.Fail(t, "t1", "partial_success", 0)
	if d.Decision != failures.DecisionRetry || d.Level != "write" || d.Requeued != 1 || d.Run.State != store.StateProcessing {
		t.Fatalf("partial_success: %+v", d)
	}
	e.Tick(t)
	apptest.Equal(t, "the write alone was retried", e.EffectState(t, eff.ID), store.EffectCompleted)
	apptest.Equal(t, "requests", e.Provider.Requests(effects.ProviderKey(eff)), 2)
}

func testDeadline(t *testing.T, e *apptest.EffectsEnv) {
	if _, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: "t1", PayloadHash: "h", Lease: 20 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Failures.Usage(ctx, apptest.Lease(e.Current(t, "t1")), 1, 0, "reply"); err != nil { // reply: 10m deadline
		t.Fatal(err)
	}
	e.Clock.Advance(9 * time.Minute)
	if d := e.Fail(t, "t1", "transport_timeout", 5*time.Second); d.Decision != failures.DecisionRetry {
		t.Fatalf("inside the deadline: %+v", d)
	}
	d := e.Fail(t, "t1", "transport_timeout", 90*time.Second)
	if d.Decision != failures.DecisionTerminal || d.Reason != "deadline" {
		t.Fatalf("a retry past the deadline: %+v", d)
	}
}

func testBudgets(t *testing.T, e *apptest.EffectsEnv) {
	// Reported model calls: reply allows 4.
	e.ClaimRun(t, "t1")
	if _, err := e.Failures.Usage(ctx, apptest.Lease(e.Current(t, "t1")), 4, 100, "reply"); err != nil {
		t.Fatal(err)
	}
	run, err := e.Failures.Usage(ctx, apptest.Lease(e.Current(t, "t1")), 1, 0, "")
	if !errors.Is(err, runs.ErrBudgetExhausted) || run.State != store.StateFailedTerminal {
		t.Fatalf("past the budget: %v %s", err, run.State)
	}
	if !strings.Contains(strings.Join(e.Alerts.Kinds(), " "), "budget_exhausted:t1") {
		t.Fatal("no alert")
	}
	// Validations airlock sees count even when the client reports nothing.
	e.ClaimRun(t, "t2")
	for i := range 4 {
		if res := validate(t, e, "t2", `{"label":"refund","text":"x"}`); !res.Valid {
			t.Fatalf("validation %d", i)
		}
	}
	_, err = e.Failures.Validate(ctx, failures.ValidateRequest{LeaseRequest: apptest.Lease(e.Current(t, "t2")), ActionType: "reply", Output: json.RawMessage(`{"label":"refund","text":"x"}`)})
	if !errors.Is(err, runs.ErrBudgetExhausted) {
		t.Fatalf("fifth validation: %v", err)
	}
	// The deadline stops heartbeats and effects.
	r := e.ClaimRun(t, "t3")
	if _, err := e.Failures.Usage(ctx, apptest.Lease(r), 0, 0, "reply"); err != nil {
		t.Fatal(err)
	}
	e.Clock.Advance(4 * time.Minute)
	r = e.Current(t, "t3")
	if _, err := e.Runs.Heartbeat(ctx, apptest.Lease(r), 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	e.Clock.Advance(6 * time.Minute)
	if _, err := e.Runs.Heartbeat(ctx, apptest.Lease(e.Current(t, "t3")), 0); !errors.Is(err, runs.ErrBudgetExhausted) {
		t.Fatalf("heartbeat past the deadline: %v", err)
	}
	apptest.Equal(t, "state", e.Current(t, "t3").State, store.StateFailedTerminal)
	e.ClaimRun(t, "t4")
	validate(t, e, "t4", `{"label":"refund","text":"x"}`)
	e.Clock.Advance(4 * time.Minute)
	if _, err := e.Runs.Heartbeat(ctx, apptest.Lease(e.Current(t, "t4")), 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	e.Clock.Advance(6 * time.Minute)
	r = e.Current(t, "t4")
	_, _, _, err = e.Effects.Queue(ctx, effects.QueueRequest{Key: "t4", Owner: r.LeaseOwner, Version: r.Version, ActionType: "reply", Target: "default"})
	if !errors.Is(err, runs.ErrBudgetExhausted) {
		t.Fatalf("effect past the deadline: %v", err)
	}
}

func testReplacement(t *testing.T, e *apptest.EffectsEnv) {
	eff := e.Queue(t, "T-1", "note", "default", `{"n":1}`)
	if _, err := e.Failures.Replace(ctx, "T-1", "T-9", "wrong amount", "cli:ana"); !errors.Is(err, failures.ErrNotFinished) {
		t.Fatalf("replace a running run: %v", err)
	}
	e.Tick(t)
	r := e.Current(t, "T-1")
	if _, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: apptest.Lease(r), To: store.StateCompleted}); err != nil {
		t.Fatal(err)
	}
	e.ClaimRun(t, "T-5") // a key already in use
	for _, c := range []struct {
		newKey string
		want   error
	}{
		{"T-1", failures.ErrInvalidReplacement},
		{"T-1-retry", failures.ErrInvalidReplacement},
		{"T-1.v2", failures.ErrInvalidReplacement},
		{"T-5", failures.ErrKeyInUse},
	} {
		if _, err := e.Failures.Replace(ctx, "T-1", c.newKey, "wrong amount", "cli:ana"); !errors.Is(err, c.want) {
			t.Errorf("replace by %s: %v, want %v", c.newKey, err, c.want)
		}
	}
	if _, err := e.Failures.Replace(ctx, "T-1", "T-9", " ", "cli:ana"); err == nil {
		t.Fatal("a replacement without a reason")
	}
	rep, err := e.Failures.Replace(ctx, "T-1", "T-9", "wrong amount", "cli:ana")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := e.Effects.Get(ctx, eff.ID)
	if len(rep.ProviderIDs) != 1 || rep.ProviderIDs[0] != got.ProviderID {
		t.Fatalf("provider ids %v, want [%s]", rep.ProviderIDs, got.ProviderID)
	}
	if _, err := e.Failures.Replace(ctx, "T-1", "T-10", "again", "cli:ana"); !errors.Is(err, failures.ErrAlreadyReplaced) {
		t.Fatalf("replace twice: %v", err)
	}
	apptest.Equal(t, "replaced_by", e.Current(t, "T-1").ReplacedBy, "T-9")
	// The old key keeps answering its state; the new one goes through the normal claim.
	old := e.Claim(t, "T-1", "h-T-1")
	if old.Claimed || old.Run.State != store.StateCompleted {
		t.Fatalf("the old key restarted: %+v", old)
	}
	if !e.Claim(t, "T-9", "h-corrected").Claimed {
		t.Fatal("the new key was not claimed")
	}
	evs, _ := e.Store.EventList(ctx, "T-9", 0, 10)
	var detail struct{ Replaces string }
	if err := json.Unmarshal(evs[0].Detail, &detail); err != nil || detail.Replaces != "T-1" {
		t.Fatalf("the new run's claim does not link the original: %s", evs[0].Detail)
	}
	by, of, err := e.Failures.Replacements(ctx, "T-9")
	if err != nil || by != nil || of == nil || of.OldKey != "T-1" {
		t.Fatalf("links: %+v %+v %v", by, of, err)
	}
	// Another run's key may not be reused as a replacement twice.
	e.ClaimRun(t, "U-1")
	u := e.Current(t, "U-1")
	if _, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: apptest.Lease(u), To: store.StateFailedTerminal}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Failures.Replace(ctx, "U-1", "T-9", "x", "cli:ana"); !errors.Is(err, failures.ErrKeyInUse) {
		t.Fatalf("reuse a replacing key: %v", err)
	}
}

func testInputSchema(t *testing.T, e *apptest.EffectsEnv) {
	if !e.Failures.HasInputSchema("zendesk") || e.Failures.HasInputSchema("gmail") {
		t.Fatal("input schemas by trigger source")
	}
	if err := e.Failures.CheckInput("zendesk", json.RawMessage(`{"ticket":42}`)); err != nil {
		t.Fatal(err)
	}
	var ie *failures.InputError
	if err := e.Failures.CheckInput("zendesk", json.RawMessage(`{"ticket":"42"}`)); !errors.As(err, &ie) || ie.Errors[0].Pointer != "/ticket" {
		t.Fatalf("bad input: %v", err)
	}
}
