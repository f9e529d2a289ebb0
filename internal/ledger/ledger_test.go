package ledger_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/ledger"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/retention"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

var ctx = context.Background()

// The work ledger's conformance suite, each test on every backend.
func TestSaveIsCompareAndSet(t *testing.T)     { apptest.EachEffects(t, testLedgerSave) }
func TestSchemaAndRules(t *testing.T)          { apptest.EachEffects(t, testLedgerRules) }
func TestPlanConfirmNeverTwice(t *testing.T)   { apptest.EachEffects(t, testPlanConfirm) }
func TestReconcileNoneOneSeveral(t *testing.T) { apptest.EachEffects(t, testLedgerReconcile) }
func TestInputMismatchStops(t *testing.T)      { apptest.EachEffects(t, testInputMismatch) }
func TestResumeVerdicts(t *testing.T)          { apptest.EachEffects(t, testResume) }
func TestGatedAgentEffect(t *testing.T)        { apptest.EachEffects(t, testGatedAgentEffect) }
func TestKillSwitchRefusesPlan(t *testing.T)   { apptest.EachEffects(t, testPlanKillSwitch) }
func TestConfirmedResultAnsweredUntilPurged(t *testing.T) {
	apptest.EachEffects(t, testConfirmedResult)
}
func TestNoneInsideTheSettleWindowClearsNothing(t *testing.T) {
	apptest.EachEffects(t, testReconcileSettle)
}

func testLedgerSave(t *testing.T, e *apptest.EffectsEnv) {
	e.ClaimRun(t, "report-1")
	o := e.Owner(t, "report-1")
	if _, _, err := e.Ledger.Save(ctx, "report-1", o, apptest.LedgerDoc("report-1", 2, "x"), "t"); !errors.Is(err, runs.ErrVersionConflict) {
		t.Fatalf("first save at 2: %v", err)
	}
	for cv := 1; cv <= 3; cv++ {
		if got, _, err := e.Ledger.Save(ctx, "report-1", o, apptest.LedgerDoc("report-1", cv, fmt.Sprintf("step-%d", cv)), "t"); err != nil || got != cv {
			t.Fatalf("save %d: %v", cv, err)
		}
	}
	if _, _, err := e.Ledger.Save(ctx, "report-1", o, apptest.LedgerDoc("report-1", 3, "again"), "t"); !errors.Is(err, runs.ErrVersionConflict) {
		t.Fatalf("a stale checkpoint: %v", err)
	}
	l, err := e.Ledger.Get(ctx, "report-1")
	if err != nil || l.CheckpointVersion != 3 || l.NextAllowedAction != "step-3" {
		t.Fatalf("get: %+v %v", l, err)
	}
	if _, _, err := e.Ledger.Save(ctx, "report-1", "thief", apptest.LedgerDoc("report-1", 4, "x"), "t"); !errors.Is(err, runs.ErrLeaseLost) {
		t.Fatalf("save without the lease: %v", err)
	}
	// Two writers at the same checkpoint: one wins.
	results := make(chan error, 2)
	apptest.Race(2, func(i int) {
		_, _, err := e.Ledger.Save(ctx, "report-1", o, apptest.LedgerDoc("report-1", 4, fmt.Sprintf("w%d", i)), "t")
		results <- err
	})
	close(results)
	var ok, conflict int
	for err := range results {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, runs.ErrVersionConflict):
			conflict++
		default:
			t.Fatal(err)
		}
	}
	apptest.Equal(t, "one writer wins", fmt.Sprint(ok, conflict), "1 1")
}

func testLedgerRules(t *testing.T, e *apptest.EffectsEnv) {
	e.ClaimRun(t, "report-1")
	o := e.Owner(t, "report-1")
	var ie *ledger.InvalidError
	for name, doc := range map[string]string{
		"missing next":   `{"run_id":"report-1","goal":"g","invariants":[],"completed":[],"pending":[],"checkpoint_version":1}`,
		"extra field":    `{"run_id":"report-1","goal":"g","invariants":[],"completed":[],"pending":[],"next_allowed_action":"a","checkpoint_version":1,"mood":"ok"}`,
		"effects":        `{"run_id":"report-1","goal":"g","invariants":[],"completed":[],"pending":[],"next_allowed_action":"a","checkpoint_version":1,"effects":[]}`,
		"other run":      `{"run_id":"report-2","goal":"g","invariants":[],"completed":[],"pending":[],"next_allowed_action":"a","checkpoint_version":1}`,
		"bad completion": `{"run_id":"report-1","goal":"g","invariants":[],"completed":[{"step":"x"}],"pending":[],"next_allowed_action":"a","checkpoint_version":1}`,
	} {
		if _, _, err := e.Ledger.Save(ctx, "report-1", o, json.RawMessage(doc), "t"); !errors.As(err, &ie) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := e.Ledger.Get(ctx, "report-1"); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("a refused save stored a ledger: %v", err)
	}
	if _, _, err := e.Ledger.Save(ctx, "report-1", o, apptest.LedgerDoc("report-1", 1, "a"), "t"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.Ledger.Save(ctx, "report-1", o, apptest.LedgerDoc("report-1", 2, "b", "something else"), "t"); !errors.Is(err, ledger.ErrInvariantsChanged) {
		t.Fatalf("changed invariants: %v", err)
	}
}

func testPlanConfirm(t *testing.T, e *apptest.EffectsEnv) {
	e.ClaimRun(t, "report-1")
	if _, _, err := e.Ledger.Save(ctx, "report-1", e.Owner(t, "report-1"), apptest.LedgerDoc("report-1", 1, "create_internal_draft"), "t"); err != nil {
		t.Fatal(err)
	}
	res, err := e.Plan("report-1", "share-draft-01", "in-1")
	if err != nil || !res.Execute {
		t.Fatalf("first plan: %+v %v", res, err)
	}
	// Stopped between plan and confirm: never execute again before reconciling.
	if _, err := e.Plan("report-1", "share-draft-01", "in-1"); !errors.Is(err, ledger.ErrReconcileFirst) {
		t.Fatalf("plan of a planned effect: %v", err)
	}
	if err := e.Ledger.Confirm(ctx, ledger.ConfirmRequest{Key: "report-1", EffectID: "share-draft-01", Owner: e.Owner(t, "report-1"), Receipt: "doc://weekly-report-42", Actor: "t"}); err != nil {
		t.Fatal(err)
	}
	res, err = e.Plan("report-1", "share-draft-01", "in-1")
	if err != nil || res.Execute || res.Receipt != "doc://weekly-report-42" {
		t.Fatalf("plan of a confirmed effect: %+v %v", res, err)
	}
	if err := e.Ledger.Confirm(ctx, ledger.ConfirmRequest{Key: "report-1", EffectID: "share-draft-01", Owner: e.Owner(t, "report-1"), Receipt: "doc://weekly-report-42", Actor: "t"}); err != nil {
		t.Fatalf("the same confirmation again: %v", err)
	}
	if err := e.Ledger.Confirm(ctx, ledger.ConfirmRequest{Key: "report-1", EffectID: "share-draft-01", Owner: e.Owner(t, "report-1"), Receipt: "doc://other", Actor: "t"}); !errors.Is(err, ledger.ErrNotPlanned) {
		t.Fatalf("another receipt: %v", err)
	}
	l, err := e.Ledger.Get(ctx, "report-1")
	if err != nil || len(l.Effects) != 1 || l.Effects[0].Status != "confirmed" || l.Effects[0].Receipt != "doc://weekly-report-42" {
		t.Fatalf("derived effects: %+v", l.Effects)
	}
	// The run completes: agent effects are all confirmed.
	r := e.Current(t, "report-1")
	if _, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: apptest.Lease(r), To: store.StateCompleted}); err != nil {
		t.Fatal(err)
	}
}

func testLedgerReconcile(t *testing.T, e *apptest.EffectsEnv) {
	e.ClaimRun(t, "report-1")
	o := e.Owner(t, "report-1")
	if _, _, err := e.Ledger.Save(ctx, "report-1", o, apptest.LedgerDoc("report-1", 1, "create_internal_draft"), "t"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"none", "one", "several", "undecided"} {
		if _, err := e.Plan("report-1", id, "in"); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		id           string
		found        []string
		undetermined bool
		want         string
	}{
		{"none", []string{}, false, "cleared"},
		{"one", []string{"doc://7"}, false, "confirmed"},
		{"several", []string{"doc://8", "doc://9"}, false, "unknown"},
		{"undecided", nil, true, "unknown"},
	}
	for _, c := range cases {
		got, err := e.Ledger.Reconcile(ctx, ledger.ReconcileRequest{Key: "report-1", EffectID: c.id, Owner: o, Found: c.found, Undetermined: c.undetermined, Actor: "t"})
		if err != nil || got != c.want {
			t.Errorf("%s: %s %v, want %s", c.id, got, err, c.want)
		}
	}
	// Cleared: it may run again under the same id.
	if res, err := e.Plan("report-1", "none", "in"); err != nil || !res.Execute {
		t.Fatalf("plan after none found: %+v %v", res, err)
	}
	if _, err := e.Plan("report-1", "several", "in"); !errors.Is(err, ledger.ErrReconcileFirst) {
		t.Fatalf("plan of an unknown effect: %v", err)
	}
	v, err := e.Ledger.Resume(ctx, "report-1")
	if err != nil || v.Verdict != ledger.Stop || len(v.Reasons) != 2 {
		t.Fatalf("resume with unknown effects: %+v %v", v, err)
	}
}

func testInputMismatch(t *testing.T, e *apptest.EffectsEnv) {
	e.ClaimRun(t, "report-1")
	if _, err := e.Plan("report-1", "share-draft-01", "in-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Plan("report-1", "share-draft-01", "in-2"); !errors.Is(err, ledger.ErrInputMismatch) {
		t.Fatalf("another input: %v", err)
	}
	r := e.Current(t, "report-1")
	if r.State != store.StateAwaitingHuman || r.ParkReason != "input_mismatch" {
		t.Fatalf("run after a mismatch: %s %s", r.State, r.ParkReason)
	}
	if v, _ := e.Ledger.Resume(ctx, "report-1"); v.Verdict != ledger.Stop {
		t.Fatalf("resume after a mismatch: %+v", v)
	}
	if res := e.Claim(t, "report-1", "h-report-1"); res.Claimed {
		t.Fatal("a stopped run was reclaimed")
	}
}

func testResume(t *testing.T, e *apptest.EffectsEnv) {
	// A new run: continue, save the first ledger.
	e.ClaimRun(t, "fresh")
	if v, _ := e.Ledger.Resume(ctx, "fresh"); v.Verdict != ledger.Continue || v.NextAllowedAction != "" {
		t.Fatalf("fresh run: %+v", v)
	}
	// Started without a ledger: never from scratch.
	e.ClaimRun(t, "started")
	if _, err := e.Plan("started", "x", "in"); err != nil {
		t.Fatal(err)
	}
	if v, _ := e.Ledger.Resume(ctx, "started"); v.Verdict != ledger.Stop || !strings.Contains(strings.Join(v.Reasons, " "), "no ledger") {
		t.Fatalf("started without ledger: %+v", v)
	}
	// With a ledger: continue with its next action; a planned effect first needs reconciling.
	e.ClaimRun(t, "report-1")
	o := e.Owner(t, "report-1")
	if _, _, err := e.Ledger.Save(ctx, "report-1", o, apptest.LedgerDoc("report-1", 1, "compare_figures"), "t"); err != nil {
		t.Fatal(err)
	}
	if v, _ := e.Ledger.Resume(ctx, "report-1"); v.Verdict != ledger.Continue || v.NextAllowedAction != "compare_figures" || v.CheckpointVersion != 1 {
		t.Fatalf("continue: %+v", v)
	}
	if _, err := e.Plan("report-1", "share-draft-01", "in-1"); err != nil {
		t.Fatal(err)
	}
	v, _ := e.Ledger.Resume(ctx, "report-1")
	if v.Verdict != ledger.Reconcile || len(v.Reconcile) != 1 || v.Reconcile[0].EffectID != "share-draft-01" || v.Reconcile[0].RunID != "report-1" || v.Reconcile[0].InputHash != "in-1" {
		t.Fatalf("reconcile: %+v", v)
	}
	if _, err := e.Ledger.Resume(ctx, "nope"); !errors.Is(err, runs.ErrNotFound) {
		t.Fatalf("resume of no run: %v", err)
	}
}

func testGatedAgentEffect(t *testing.T, e *apptest.EffectsEnv) {
	e.ClaimRun(t, "report-1")
	o := e.Owner(t, "report-1")
	res, err := e.Ledger.Plan(ctx, ledger.PlanRequest{Key: "report-1", EffectID: "publish", Owner: o, Action: "share_publicly",
		Target: "intranet", InputHash: "in-1", Actor: "apikey:agent"})
	if err != nil || res.Execute || res.Approval == nil {
		t.Fatalf("gated plan: %+v %v", res, err)
	}
	if v, _ := e.Ledger.Resume(ctx, "report-1"); v.Verdict != ledger.Wait {
		t.Fatalf("while waiting: %+v", v)
	}
	if _, err := e.Approvals.Decide(ctx, approvals.HashToken(res.Approval.Token), approvals.Approve, "", approvals.Person{Subject: "lead", Roles: []string{"support-lead"}}); err != nil {
		t.Fatal(err)
	}
	r := e.Current(t, "report-1")
	if r.State != store.StateProcessing || r.LeaseLive(e.Clock.Now()) {
		t.Fatalf("after approval: %s live=%v", r.State, r.LeaseLive(e.Clock.Now()))
	}
	if effs, _ := e.Effects.List(ctx, store.EffectListParams{RunKey: "report-1"}); len(effs) != 0 {
		t.Fatal("an agent-executed effect entered the outbox")
	}
	// The agent's next claim takes the run; its plan now allows execution.
	if !e.Claim(t, "report-1", "h-report-1").Claimed {
		t.Fatal("the approved run was not claimable")
	}
	res, err = e.Ledger.Plan(ctx, ledger.PlanRequest{Key: "report-1", EffectID: "publish", Owner: e.Owner(t, "report-1"),
		Action: "share_publicly", Target: "intranet", InputHash: "in-1", Actor: "apikey:agent"})
	if err != nil || !res.Execute {
		t.Fatalf("plan after approval: %+v %v", res, err)
	}
}

func testPlanKillSwitch(t *testing.T, e *apptest.EffectsEnv) {
	e.ClaimRun(t, "report-1")
	if err := e.Effects.SetKillSwitch(ctx, effects.GlobalScope, false, "stop", "ops"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Plan("report-1", "x", "in"); !errors.Is(err, effects.ErrActionsDisabled) {
		t.Fatalf("plan while disabled: %v", err)
	}
	if _, err := e.Plan("report-1", "x", "in"); err == nil {
		t.Fatal("no effect may be planned while disabled")
	}
	if _, err := e.Ledger.Plan(ctx, ledger.PlanRequest{Key: "report-1", EffectID: "y", Owner: e.Owner(t, "report-1"),
		Action: "wire_money", Target: "x", InputHash: "in"}); !errors.Is(err, effects.ErrUnknownActionType) {
		t.Fatalf("unconfigured action: %v", err)
	}
}

// testConfirmedResult: a confirmation may carry the effect's result (the MCP gateway's
// tool answer); a later plan answers it instead of executing, until retention purges it
// with every payload — then the plan still answers the receipt and never executes.
func testConfirmedResult(t *testing.T, e *apptest.EffectsEnv) {
	e.ClaimRun(t, "report-1")
	if res, err := e.Plan("report-1", "mcp.write_file.1", "in-1"); err != nil || !res.Execute {
		t.Fatalf("plan: %+v %v", res, err)
	}
	result := json.RawMessage(`{"content":[{"type":"text","text":"Successfully wrote"}],"structuredContent":{"content":"Successfully wrote"}}`)
	if err := e.Ledger.Confirm(ctx, ledger.ConfirmRequest{Key: "report-1", EffectID: "mcp.write_file.1", Owner: e.Owner(t, "report-1"), Receipt: "sha256:abc", Result: result, Actor: "t"}); err != nil {
		t.Fatal(err)
	}
	res, err := e.Plan("report-1", "mcp.write_file.1", "in-1")
	if err != nil || res.Execute || res.Receipt != "sha256:abc" {
		t.Fatalf("plan after confirm: %+v %v", res, err)
	}
	var got, want any
	if err := json.Unmarshal(res.Result, &got); err != nil {
		t.Fatalf("result %s: %v", res.Result, err)
	}
	_ = json.Unmarshal(result, &want)
	apptest.Equal(t, "the recorded result", fmt.Sprint(got), fmt.Sprint(want))
	if _, err := retention.Purge(ctx, e.Store, e.Policy, e.Clock.Now().Add(e.Policy.Retention.Payloads.D()+time.Hour), false); err != nil {
		t.Fatal(err)
	}
	res, err = e.Plan("report-1", "mcp.write_file.1", "in-1")
	if err != nil || res.Execute || res.Receipt != "sha256:abc" || res.Result != nil {
		t.Fatalf("plan after retention: %+v (result %s) %v", res, res.Result, err)
	}
}

// An agent type with a settle window: a search's "none" soon after the plan clears
// nothing — the earlier holder's call may still be at the provider — and says when to
// ask again; past the window it clears the effect. A record found confirms it at once.
func testReconcileSettle(t *testing.T, e *apptest.EffectsEnv) {
	e.Policy.Actions["create_internal_draft"].SettleWindow = policy.Duration(3 * time.Minute)
	e.ClaimRun(t, "settle-1")
	o := e.Owner(t, "settle-1")
	if _, _, err := e.Ledger.Save(ctx, "settle-1", o, apptest.LedgerDoc("settle-1", 1, "create_internal_draft"), "t"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"slow", "found"} {
		if _, err := e.Plan("settle-1", id, "in"); err != nil {
			t.Fatal(err)
		}
	}
	e.Clock.Advance(time.Minute)
	_, err := e.Ledger.Reconcile(ctx, ledger.ReconcileRequest{Key: "settle-1", EffectID: "slow", Owner: o, Found: []string{}, Actor: "t"})
	var ns *ledger.NotSettledError
	if !errors.As(err, &ns) || ns.RetryAfter != 2*time.Minute {
		t.Fatalf("none a minute after the plan: %v, want not settled for 2m", err)
	}
	if _, err := e.Plan("settle-1", "slow", "in"); !errors.Is(err, ledger.ErrReconcileFirst) {
		t.Fatalf("plan while unsettled: %v, want reconcile_first", err)
	}
	if got, err := e.Ledger.Reconcile(ctx, ledger.ReconcileRequest{Key: "settle-1", EffectID: "found", Owner: o, Found: []string{"doc://1"}, Actor: "t"}); err != nil || got != "confirmed" {
		t.Fatalf("found inside the window: %s %v", got, err)
	}
	e.Clock.Advance(2 * time.Minute) // inside the run's lease still
	if got, err := e.Ledger.Reconcile(ctx, ledger.ReconcileRequest{Key: "settle-1", EffectID: "slow", Owner: o, Found: []string{}, Actor: "t"}); err != nil || got != "cleared" {
		t.Fatalf("none past the window: %s %v, want cleared", got, err)
	}
}
