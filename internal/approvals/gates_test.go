package approvals_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apikeys"
	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/failures"
	"github.com/airlockhq/airlock/internal/ledger"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

var ctx = context.Background()

// The conformance suite of the gates' store work (migration 0008): keys that
// name their person and types, approvals that keep every requester identity, evidence
// recorded by evaluators, and the domain rules over them, each test on every backend.
func TestAPIKeyOnBehalfOfAndTypes(t *testing.T)        { apptest.EachEffects(t, testGateAPIKeyColumns) }
func TestApprovalKeepsRequesters(t *testing.T)         { apptest.EachEffects(t, testGateRequesters) }
func TestEvidenceRecordedNotRequested(t *testing.T)    { apptest.EachEffects(t, testGateEvidence) }
func TestCancelOnlyWindowSettlesApproved(t *testing.T) { apptest.EachEffects(t, testGateCancel) }
func TestCancelPathsLockInOneOrder(t *testing.T)       { apptest.EachEffects(t, testGateCancelLockOrder) }
func TestLedgerUnknownIsAPersons(t *testing.T)         { apptest.EachEffects(t, testGateLedgerUnknown) }
func TestReissueReplacesTheLink(t *testing.T)          { apptest.EachEffects(t, testGateReissue) }

func testGateAPIKeyColumns(t *testing.T, e *apptest.EffectsEnv) {
	_, raw, err := apikeys.CreateSpec(ctx, e.Store, apikeys.Spec{Name: "w", Scopes: []string{apikeys.ScopeWorker},
		OnBehalfOf: " ana ", Types: []string{"task", " slack_digest", "task"}}, e.Clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	k, err := apikeys.Authenticate(ctx, e.Store, raw)
	if err != nil || k.OnBehalfOf != "ana" || !slices.Equal(k.Types, []string{"task", "slack_digest"}) {
		t.Fatalf("key: %+v %v", k, err)
	}
	if !apikeys.MayHandle(k, "task") || apikeys.MayHandle(k, "email") {
		t.Fatal("types do not limit the key")
	}
	_, raw, _ = apikeys.CreateSpec(ctx, e.Store, apikeys.Spec{Name: "plain", Scopes: []string{apikeys.ScopeRuns}}, e.Clock.Now())
	if k, err := apikeys.Authenticate(ctx, e.Store, raw); err != nil || k.OnBehalfOf != "" || k.Types != nil || !apikeys.MayHandle(k, "email") {
		t.Fatalf("plain key: %+v %v", k, err)
	}
	if _, err := apikeys.ParseScopes("evaluator,admin"); err == nil {
		t.Fatal("an evaluator key may also administer")
	}
}

func testGateRequesters(t *testing.T, e *apptest.EffectsEnv) {
	r := e.ClaimRun(t, "sod")
	sub, err := e.Effects.Submit(ctx, effects.QueueRequest{Key: "sod", Owner: r.LeaseOwner, Version: r.Version, ActionType: "email",
		Target: "default", Payload: json.RawMessage(`{"text":"hi"}`), Actor: "apikey:Assistant", OnBehalfOf: "Ana",
		Meta: &runs.Meta{RequestedBy: " ＢＯＢ "}})
	if err != nil || sub.Approval == nil {
		t.Fatalf("submit: %+v %v", sub, err)
	}
	aps, err := e.Store.ApprovalsByRun(ctx, "sod")
	if err != nil || len(aps) != 1 {
		t.Fatalf("approvals: %v %v", aps, err)
	}
	a := aps[0]
	apptest.Equal(t, "requesters", a.Requesters, []string{"apikey:assistant", "ana", "bob"})
	apptest.Equal(t, "requested_by", a.RequestedBy, "ＢＯＢ")
	for _, who := range []string{"ana", "ANA", "bob", "Bob ", "apikey:assistant"} {
		if err := approvals.May(a, approvals.Person{Subject: who, Roles: []string{"support-lead"}}); !errors.Is(err, approvals.ErrSelfApproval) {
			t.Errorf("%q may decide a request that is theirs: %v", who, err)
		}
	}
	if err := approvals.May(a, approvals.Person{Subject: "carol", Roles: []string{"support-lead"}}); err != nil {
		t.Fatalf("another approver: %v", err)
	}
}

func testGateEvidence(t *testing.T, e *apptest.EffectsEnv) {
	submit := func(key string) effects.Submitted {
		t.Helper()
		r := e.ClaimRun(t, key)
		if _, err := e.Failures.Validate(ctx, failures.ValidateRequest{LeaseRequest: apptest.Lease(r), ActionType: "triage", Output: json.RawMessage(`{"label":"spam"}`)}); err != nil {
			t.Fatal(err)
		}
		sub, err := e.Effects.Submit(ctx, effects.QueueRequest{Key: key, Owner: r.LeaseOwner, Version: r.Version, ActionType: "triage",
			Target: "default", Actor: "apikey:n8n"})
		if err != nil {
			t.Fatal(err)
		}
		return sub
	}
	if sub := submit("ev-none"); sub.Approval == nil {
		t.Fatal("auto-approved without recorded evidence")
	}
	e.ClaimRun(t, "ev-1")
	for _, v := range []string{`0.5`, `0.99`} { // the latest finding of a source and name counts
		if _, err := e.Approvals.RecordEvidence(ctx, "ev-1", "classifier", "score", json.RawMessage(v), "apikey:classifier"); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := e.Store.EvidenceByRun(ctx, "ev-1")
	if err != nil || len(rows) != 2 || rows[0].ID >= rows[1].ID || string(rows[1].Value) != "0.99" || rows[1].Source != "classifier" {
		t.Fatalf("evidence rows: %+v %v", rows, err)
	}
	if _, err := e.Approvals.RecordEvidence(ctx, "missing", "classifier", "score", json.RawMessage(`1`), "apikey:classifier"); !errors.Is(err, runs.ErrNotFound) {
		t.Fatalf("evidence on a missing run: %v", err)
	}
	// ev-1 is claimed already: validate and submit under that lease.
	r, _ := e.Runs.Get(ctx, "ev-1")
	if _, err := e.Failures.Validate(ctx, failures.ValidateRequest{LeaseRequest: apptest.Lease(r), ActionType: "triage", Output: json.RawMessage(`{"label":"spam"}`)}); err != nil {
		t.Fatal(err)
	}
	sub, err := e.Effects.Submit(ctx, effects.QueueRequest{Key: "ev-1", Owner: r.LeaseOwner, Version: r.Version, ActionType: "triage",
		Target: "default", Actor: "apikey:n8n"})
	if err != nil || sub.Approval != nil || !sub.Created {
		t.Fatalf("with the classifier's recorded evidence: %+v %v", sub, err)
	}
}

func testGateCancel(t *testing.T, e *apptest.EffectsEnv) {
	// Not a window effect: nobody cancels it through Cancel.
	plain := e.Queue(t, "c-1", "note", "default", `{"n":1}`)
	if _, err := e.Effects.Cancel(ctx, plain.ID, "x", "cli:op", effects.Canceller{Operator: true}); !errors.Is(err, effects.ErrNotResolvable) {
		t.Fatalf("cancel of an ungated effect: %v", err)
	}
	// A window effect: not by a stale lease owner; by the holder.
	r := e.ClaimRun(t, "c-2")
	sub, err := e.Effects.Submit(ctx, effects.QueueRequest{Key: "c-2", Owner: r.LeaseOwner, Version: r.Version, ActionType: "digest",
		Target: "default", Payload: json.RawMessage(`{"w":1}`), Actor: "apikey:n8n"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Effects.Cancel(ctx, sub.Effect.ID, "x", "apikey:n8n", effects.Canceller{Owner: "thief"}); !errors.Is(err, runs.ErrLeaseLost) {
		t.Fatalf("cancel by a stale owner: %v", err)
	}
	if _, err := e.Effects.Cancel(ctx, sub.Effect.ID, "x", "apikey:n8n", effects.Canceller{Owner: r.LeaseOwner}); err != nil {
		t.Fatal(err)
	}
	apptest.Equal(t, "cancelled", e.EffectState(t, sub.Effect.ID), store.EffectCancelled)
	aps, _ := e.Store.ApprovalsByRun(ctx, "c-2")
	if len(aps) != 1 || aps[0].ConsumedAt == nil {
		t.Fatalf("the cancel link outlived the effect: %+v", aps)
	}
	// An approved run whose only effect is abandoned settles.
	e.Provider.Reply = func(w http.ResponseWriter, _ *http.Request, _ int) { w.WriteHeader(http.StatusInternalServerError) }
	r = e.ClaimRun(t, "c-3")
	sub, err = e.Effects.Submit(ctx, effects.QueueRequest{Key: "c-3", Owner: r.LeaseOwner, Version: r.Version, ActionType: "email",
		Target: "default", Payload: json.RawMessage(`{"text":"x"}`), Actor: "apikey:n8n"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Approvals.Decide(ctx, sub.Approval.Approval.TokenHash, approvals.Approve, "", approvals.Person{Subject: "lead", Roles: []string{"support-lead"}}); err != nil {
		t.Fatal(err)
	}
	e.Tick(t)
	effs, _ := e.Effects.List(ctx, store.EffectListParams{RunKey: "c-3"})
	apptest.Equal(t, "sent into the unknown", effs[0].State, store.EffectUnknown)
	if _, err := e.Effects.Resolve(ctx, effs[0].ID, effects.Resolution{Outcome: effects.OutcomeAbandon, ProviderID: "", Note: "never arrived"}, "cli:op"); err != nil {
		t.Fatal(err)
	}
	run, _ := e.Runs.Get(ctx, "c-3")
	apptest.Equal(t, "settled", run.State, store.StateFailedTerminal)
	if !strings.Contains(string(run.Result), "effects_cancelled") {
		t.Fatalf("result: %s", run.Result)
	}
}

func testGateLedgerUnknown(t *testing.T, e *apptest.EffectsEnv) {
	r := e.ClaimRun(t, "ag")
	if res, err := e.Ledger.Plan(ctx, ledger.PlanRequest{Key: "ag", EffectID: "d1", Owner: r.LeaseOwner, Action: "create_internal_draft",
		Target: "docs", InputHash: "h"}); err != nil || !res.Execute {
		t.Fatalf("plan: %+v %v", res, err)
	}
	if st, err := e.Ledger.Reconcile(ctx, ledger.ReconcileRequest{Key: "ag", EffectID: "d1", Owner: r.LeaseOwner, Undetermined: true, Actor: "agent"}); err != nil || st != "unknown" {
		t.Fatalf("undetermined: %s %v", st, err)
	}
	if _, err := e.Ledger.Reconcile(ctx, ledger.ReconcileRequest{Key: "ag", EffectID: "d1", Owner: r.LeaseOwner, Found: []string{}, Actor: "agent"}); !errors.Is(err, ledger.ErrNotPlanned) {
		t.Fatalf("the agent cleared an unknown effect: %v", err)
	}
	eff, _ := e.Store.EffectByRunEffectID(ctx, "ag", "d1")
	apptest.Equal(t, "still unknown", eff.State, store.EffectUnknown)
}

// testGateReissue: a reissued link replaces the old one in one statement; a decided or
// expired approval is not reissued.
func testGateReissue(t *testing.T, e *apptest.EffectsEnv) {
	r := e.ClaimRun(t, "re")
	sub, err := e.Effects.Submit(ctx, effects.QueueRequest{Key: "re", Owner: r.LeaseOwner, Version: r.Version, ActionType: "email",
		Target: "default", Payload: json.RawMessage(`{"text":"hi"}`), Actor: "apikey:n8n"})
	if err != nil || sub.Approval == nil {
		t.Fatalf("submit: %+v %v", sub, err)
	}
	old := approvals.HashToken(sub.Approval.Token)
	re, err := e.Approvals.Reissue(ctx, sub.Approval.Approval.ID, "apikey:ops")
	if err != nil || re.Token == "" || re.Token == sub.Approval.Token || !re.Reissued {
		t.Fatalf("reissue: %+v %v", re, err)
	}
	if _, err := e.Store.ApprovalByTokenHash(ctx, old); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the old hash still finds the approval: %v", err)
	}
	a, err := e.Store.ApprovalByTokenHash(ctx, approvals.HashToken(re.Token))
	if err != nil || a.ID != sub.Approval.Approval.ID || strings.Contains(a.TokenHash, re.Token) {
		t.Fatalf("by the new hash: %+v %v", a, err)
	}
	if _, err := e.Approvals.Reissue(ctx, "nope", "apikey:ops"); !errors.Is(err, approvals.ErrUnknownApproval) {
		t.Fatalf("unknown id: %v", err)
	}
	// Expired (by the store's clock: its own `now` on PostgreSQL when no time is injected).
	past := a.ExpiresAt.Add(1)
	if _, err := e.Store.ApprovalRekey(ctx, a.ID, "x", &past); !errors.Is(err, store.ErrNoMatch) {
		t.Fatalf("rekey of an expired approval: %v", err)
	}
	if _, err := e.Approvals.Decide(ctx, approvals.HashToken(re.Token), approvals.Approve, "", approvals.Person{Subject: "lead", Roles: []string{"support-lead"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Approvals.Reissue(ctx, a.ID, "apikey:ops"); !errors.Is(err, approvals.ErrNotPending) {
		t.Fatalf("reissue of a decided approval: %v", err)
	}
	evs, err := e.Store.EventList(ctx, "re", 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ev := range evs {
		if ev.Kind == "approval_link_reissued" {
			n++
			if ev.Actor != "apikey:ops" || strings.Contains(string(ev.Detail), re.Token) {
				t.Fatalf("event: %+v", ev)
			}
		}
	}
	if n != 1 {
		t.Fatalf("%d reissue events, want 1", n)
	}
}

// An operator's cancel of a window effect (effects.Cancel) and an approver's cancel link
// (approvals.Decide) race on one effect, each inside an Idempotency-Key request (Within:
// a deadlock there is not run again, it answers 500). Each waits for the other (up to
// 300 ms) after its first lock: run then approval, approval then run, before the fix.
// PostgreSQL found the deadlock and one request failed; now both take the run's lock
// first, so the second waits, then sees the first's cancel and refuses cleanly.
func testGateCancelLockOrder(t *testing.T, e *apptest.EffectsEnv) {
	r := e.ClaimRun(t, "w-1")
	sub, err := e.Effects.Submit(ctx, effects.QueueRequest{Key: "w-1", Owner: r.LeaseOwner, Version: r.Version, ActionType: "digest",
		Target: "default", Payload: json.RawMessage(`{"w":1}`), Actor: "apikey:n8n"})
	if err != nil || sub.Approval == nil {
		t.Fatalf("queue in a window: %+v %v", sub, err)
	}
	var arrived atomic.Int32
	barrier := func() {
		arrived.Add(1)
		for i := 0; i < 60 && arrived.Load() < 2; i++ {
			time.Sleep(5 * time.Millisecond)
		}
	}
	e.Effects.Hook = apptest.HookOn("cancel_run_locked", barrier)
	e.Approvals.Hook = apptest.HookOn("approval_consumed", barrier)
	defer func() { e.Effects.Hook, e.Approvals.Hook = nil, nil }()
	var errs [2]error
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		errs[0] = e.Store.Within(ctx, func(ctx context.Context) error {
			_, err := e.Effects.Cancel(ctx, sub.Effect.ID, "not this week", "cli:op", effects.Canceller{Operator: true})
			return err
		})
	}()
	go func() {
		defer wg.Done()
		errs[1] = e.Store.Within(ctx, func(ctx context.Context) error {
			_, err := e.Approvals.Decide(ctx, approvals.HashToken(sub.Approval.Token), approvals.Cancel, "no",
				approvals.Person{Subject: "lead", Roles: []string{"support-lead"}})
			return err
		})
	}()
	wg.Wait()
	for i, err := range errs {
		if err != nil && (strings.Contains(err.Error(), "deadlock") || strings.Contains(err.Error(), "40P01")) {
			t.Fatalf("cancel path %d: %v", i, err)
		}
	}
	wonOperator, wonLink := errs[0] == nil, errs[1] == nil
	if wonOperator == wonLink {
		t.Fatalf("exactly one cancel should win: operator %v, link %v", errs[0], errs[1])
	}
	if !wonOperator && !errors.Is(errs[0], effects.ErrNotResolvable) {
		t.Errorf("the operator's cancel after the link's: %v, want ErrNotResolvable", errs[0])
	}
	if !wonLink && !errors.Is(errs[1], approvals.ErrNotFound) {
		t.Errorf("the link's cancel after the operator's: %v, want ErrNotFound", errs[1])
	}
	apptest.Equal(t, "effect", e.EffectState(t, sub.Effect.ID), store.EffectCancelled)
	n := 0
	for _, k := range e.Kinds(t, "w-1") {
		if k == "effect_cancelled" {
			n++
		}
	}
	apptest.Equal(t, "effect_cancelled events", n, 1)
}
