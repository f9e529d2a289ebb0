// Command agent is the weekly-report agent airlock's work ledger was designed for: a
// long-running agent that keeps its ledger in airlock and can be killed at any moment
// and started again without repeating its one external effect or starting over.
//
// Its steps: sources_collected → create_internal_draft (creates a document in the
// document system: the one external effect, effect id share-draft-01) → compare_figures
// → done (the run is completed). After every step it saves the ledger with
// checkpoint_version + 1. Around the document it records the intent first (plan) and the
// document's id after (confirm); on restart, airlock's resume verdict tells it to search
// the document system by run id for an effect that was planned but never confirmed.
//
//	airlock serve --config policy.yaml     # actions: {create_internal_draft: {connector: worker, gate: none}}
//	AIRLOCK_API_KEY=$(airlock apikey create --name agent --scope runs) \
//	  go run ./examples/agent --run-id report-2026w48 --docs ./docs
//
// Exit status: 0 done (or already completed), 2 stopped for a person to decide, 3 waiting
// for an approval, 1 any other error. For the restart test, AGENT_CRASH_AT=before_create,
// after_create or before_receipt makes it SIGKILL itself at that point.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/airlockhq/airlock/client"
)

// The agent's plan: each step's name is what next_allowed_action holds before it runs.
const (
	stepSources = "sources_collected"
	stepDraft   = "create_internal_draft"
	stepCompare = "compare_figures"
	stepDone    = "done"

	effectID     = "share-draft-01"
	actionDraft  = "create_internal_draft" // an action type of airlock's policy (connector: worker)
	targetDocs   = "internal-docs"
	exitStop     = 2
	exitWaiting  = 3
	exitFailures = 1
)

var (
	errStop = errors.New("stopped: a person must decide")
	errWait = errors.New("waiting for a person's approval")
	// errReconcile sends the agent back to the resume verdict.
	errReconcile = errors.New("an effect must be reconciled first")
)

type config struct {
	airlock, apiKey, runID, docs string
	lease, wait                  time.Duration
}

func main() {
	var cfg config
	flag.StringVar(&cfg.airlock, "airlock", envOr("AIRLOCK_URL", "http://127.0.0.1:8080"), "airlock's base URL [AIRLOCK_URL]")
	flag.StringVar(&cfg.apiKey, "api-key", os.Getenv("AIRLOCK_API_KEY"), "API key with the runs scope [AIRLOCK_API_KEY]")
	flag.StringVar(&cfg.runID, "run-id", "", "the run's key, issued once per report (e.g. report-2026w48)")
	flag.StringVar(&cfg.docs, "docs", "", "directory of the document system")
	flag.DurationVar(&cfg.lease, "lease", 30*time.Second, "lease length (whole seconds); renewed every third of it")
	flag.DurationVar(&cfg.wait, "wait", 2*time.Minute, "how long to wait for another process's live lease to lapse")
	flag.Parse()
	log := slog.New(slog.NewJSONHandler(os.Stdout, nil))
	if cfg.runID == "" || cfg.docs == "" || cfg.apiKey == "" {
		fmt.Fprintln(os.Stderr, "agent: --run-id, --docs and --api-key (or AIRLOCK_API_KEY) are required")
		os.Exit(exitFailures)
	}
	if cfg.lease < time.Second {
		fmt.Fprintln(os.Stderr, "agent: --lease must be at least 1s")
		os.Exit(exitFailures)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, cfg, log)
	cancel()
	switch {
	case err == nil:
	case errors.Is(err, errStop):
		log.Warn("stopped", "err", err.Error())
		os.Exit(exitStop)
	case errors.Is(err, errWait):
		log.Info("waiting", "err", err.Error())
		os.Exit(exitWaiting)
	default:
		log.Error("failed", "err", err.Error())
		os.Exit(exitFailures)
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// crashPoint kills the process at a named point when AGENT_CRASH_AT says so: SIGKILL runs
// no deferred code and flushes nothing, as a power cut or an OOM kill would.
func crashPoint(point string) {
	if os.Getenv("AGENT_CRASH_AT") == point {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
}

type agent struct {
	c     *client.Client
	key   string
	docs  Docs
	log   *slog.Logger
	claim client.Claim
}

func run(ctx context.Context, cfg config, log *slog.Logger) error {
	a := &agent{c: client.New(cfg.airlock, cfg.apiKey), key: cfg.runID, docs: Docs{Dir: cfg.docs}, log: log}
	claim, err := a.claimWhenFree(ctx, cfg.lease, cfg.wait)
	if err != nil {
		return err
	}
	if !claim.Claimed {
		if claim.State == client.StateCompleted {
			log.Info("already completed", "run_id", a.key, "result", string(claim.Result))
			return nil
		}
		// Parked or finished otherwise: the verdict says why.
		r, err := a.c.Resume(ctx, a.key)
		if err != nil {
			return err
		}
		if r.Verdict == client.VerdictWait {
			return fmt.Errorf("%w: %s", errWait, strings.Join(r.Reasons, "; "))
		}
		return fmt.Errorf("%w: the run is %s: %s", errStop, claim.State, strings.Join(r.Reasons, "; "))
	}
	a.claim = claim
	log.Info("claimed", "run_id", a.key, "reclaimed", claim.Reclaimed, "version", claim.Version)

	// Renew the lease in the background; losing it cancels everything.
	hbCtx, stopHB := context.WithCancelCause(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); a.heartbeat(hbCtx, stopHB, cfg.lease) }()
	defer func() { stopHB(nil); wg.Wait() }()

	l, err := a.resume(hbCtx)
	if err != nil {
		return a.explain(hbCtx, err)
	}
	for l.NextAllowedAction != stepDone {
		if l, err = a.step(hbCtx, l); errors.Is(err, errReconcile) {
			if l, err = a.resume(hbCtx); err != nil {
				return a.explain(hbCtx, err)
			}
			continue
		}
		if err != nil {
			return a.explain(hbCtx, err)
		}
	}
	// The last step: close the run. The heartbeat stops first: a transition ends the lease.
	stopHB(nil)
	wg.Wait()
	receipt := evidenceOf(l, stepDraft)
	t, err := a.c.Transition(ctx, a.key, client.TransitionRequest{LeaseOwner: claim.LeaseOwner, Version: claim.Version,
		To: client.StateCompleted, Result: map[string]string{"document": receipt}})
	if err != nil {
		return err
	}
	log.Info("run completed", "run_id", a.key, "state", t.State, "document", receipt)
	return nil
}

// explain prefers the reason the heartbeat stopped (the lease was lost) over the error
// of whichever call noticed it.
func (a *agent) explain(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return fmt.Errorf("%w (%v)", cause, err)
	}
	return err
}

// claimWhenFree claims the run. If another process — or this agent before a crash —
// still holds a live lease, it waits for the lease to lapse and claims again.
func (a *agent) claimWhenFree(ctx context.Context, lease, wait time.Duration) (client.Claim, error) {
	deadline := time.Now().Add(wait)
	req := client.ClaimRequest{Key: a.key, Payload: map[string]string{"report": "weekly", "run_id": a.key},
		TriggerSource: "weekly-report-agent", LeaseSeconds: int(lease / time.Second)}
	for {
		claim, err := a.c.Claim(ctx, req)
		if err != nil || claim.Claimed || claim.State != client.StateProcessing {
			return claim, err
		}
		// The duplicate answer says when the other lease lapses: sleep until then, once.
		// Polling would count every try as a duplicate delivery of the run.
		pause := 100 * time.Millisecond
		if claim.LeaseExpiresAt != nil {
			pause = max(time.Until(*claim.LeaseExpiresAt)+100*time.Millisecond, 50*time.Millisecond)
		}
		if time.Now().Add(pause).After(deadline) {
			return client.Claim{}, fmt.Errorf("%w: another process holds the run's lease (waited %s)", errStop, wait)
		}
		a.log.Info("lease held elsewhere; waiting", "run_id", a.key, "retry_in_ms", pause.Milliseconds())
		select {
		case <-ctx.Done():
			return client.Claim{}, ctx.Err()
		case <-time.After(pause):
		}
	}
}

func (a *agent) heartbeat(ctx context.Context, lost context.CancelCauseFunc, lease time.Duration) {
	tick := time.NewTicker(lease / 3)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		_, err := a.c.Heartbeat(ctx, a.key, client.HeartbeatRequest{LeaseOwner: a.claim.LeaseOwner,
			Version: a.claim.Version, LeaseSeconds: int(lease / time.Second)})
		switch {
		case ctx.Err() != nil:
			return
		case client.IsCode(err, "lease_lost"), client.IsCode(err, "version_conflict"), client.IsCode(err, "lease_lifetime_exceeded"):
			lost(fmt.Errorf("%w: the lease is gone: %v", errStop, err))
			return
		case err != nil:
			a.log.Warn("heartbeat failed; retrying", "err", err.Error())
		}
	}
}

// resume asks airlock how to go on and returns the ledger to continue from. It
// reconciles planned effects when told to, then asks again.
func (a *agent) resume(ctx context.Context) (client.Ledger, error) {
	for {
		r, err := a.c.Resume(ctx, a.key)
		if err != nil {
			return client.Ledger{}, err
		}
		a.log.Info("resume", "run_id", a.key, "verdict", r.Verdict, "next_allowed_action", r.NextAllowedAction,
			"checkpoint_version", r.CheckpointVersion, "reasons", r.Reasons)
		switch r.Verdict {
		case client.VerdictReconcile:
			for _, item := range r.Reconcile {
				if err := a.reconcile(ctx, item); err != nil {
					return client.Ledger{}, err
				}
			}
			continue
		case client.VerdictWait:
			return client.Ledger{}, fmt.Errorf("%w: %s", errWait, strings.Join(r.Reasons, "; "))
		case client.VerdictContinue:
		default:
			return client.Ledger{}, fmt.Errorf("%w: %s", errStop, strings.Join(r.Reasons, "; "))
		}
		if r.CheckpointVersion == 0 {
			// A new run: its first ledger, before anything is done.
			return a.save(ctx, client.Ledger{
				Goal: "Draft the weekly report and share it internally once approved",
				Invariants: []string{
					"Never send customer names to external services",
					"Do not issue a share link before approval",
				},
				Pending:           []string{stepSources, stepDraft, stepCompare},
				NextAllowedAction: stepSources,
			})
		}
		l, err := a.c.Ledger(ctx, a.key)
		if err != nil {
			return client.Ledger{}, err
		}
		if l.CheckpointVersion != r.CheckpointVersion || l.NextAllowedAction != r.NextAllowedAction {
			// Another writer moved the ledger between the two reads.
			return client.Ledger{}, fmt.Errorf("%w: the ledger moved while resuming", errStop)
		}
		return l, nil
	}
}

// reconcile searches the document system for an effect planned but never confirmed and
// reports what it found. Nothing found clears it (plan it again); one document confirms
// it; several make its outcome unknown, and the next verdict stops for a person.
func (a *agent) reconcile(ctx context.Context, item client.ReconcileItem) error {
	if item.Action != actionDraft {
		return fmt.Errorf("%w: no search is known for action %s (effect %s)", errStop, item.Action, item.EffectID)
	}
	found, err := a.docs.SearchByRunID(item.RunID)
	undetermined := false
	if err != nil {
		a.log.Warn("search failed", "run_id", item.RunID, "err", err.Error())
		undetermined = true // a failed search proves nothing: a person decides
	}
	receipts := []string{}
	for _, d := range found {
		receipts = append(receipts, d.Receipt())
	}
	status, err := a.c.Reconcile(ctx, a.key, item.EffectID, a.claim.LeaseOwner, receipts, undetermined)
	if err != nil {
		return err
	}
	a.log.Info("reconciled", "run_id", a.key, "effect_id", item.EffectID, "found", receipts, "status", status)
	return nil
}

// step runs the next allowed action and saves the ledger that follows it.
func (a *agent) step(ctx context.Context, l client.Ledger) (client.Ledger, error) {
	var evidence string
	var err error
	switch l.NextAllowedAction {
	case stepSources:
		evidence, err = a.collectSources()
	case stepDraft:
		evidence, err = a.createDraft(ctx, l)
	case stepCompare:
		evidence, err = a.compareFigures(l)
	default:
		return l, fmt.Errorf("%w: next_allowed_action %q is not a step of this agent", errStop, l.NextAllowedAction)
	}
	if err != nil {
		return l, err
	}
	done := l.NextAllowedAction
	a.log.Info("step done", "run_id", a.key, "step", done, "evidence", evidence)
	l.Completed = append(l.Completed, client.Step{Step: done, Evidence: evidence})
	l.Pending = slices.DeleteFunc(slices.Clone(l.Pending), func(s string) bool { return s == done })
	l.NextAllowedAction = stepDone
	if len(l.Pending) > 0 {
		l.NextAllowedAction = l.Pending[0]
	}
	return a.save(ctx, l)
}

// save stores l as the next checkpoint.
func (a *agent) save(ctx context.Context, l client.Ledger) (client.Ledger, error) {
	l.CheckpointVersion++
	cp, err := a.c.SaveLedger(ctx, a.key, a.claim.LeaseOwner, l)
	if client.IsCode(err, "version_conflict") || client.IsCode(err, "lease_lost") {
		return l, fmt.Errorf("%w: another process owns the run now: %v", errStop, err)
	}
	if err != nil {
		return l, err
	}
	a.log.Info("ledger saved", "run_id", a.key, "checkpoint_version", cp, "next_allowed_action", l.NextAllowedAction)
	return l, nil
}

// figures are the week's numbers from the sources. They are a pure function of the run,
// so every attempt drafts the same document and plans it with the same input hash.
func (a *agent) figures() [][2]string {
	return [][2]string{{"revenue", "1,204,000 JPY"}, {"tickets_closed", "311"}, {"median_first_response", "42 min"}}
}

func (a *agent) collectSources() (string, error) {
	h, err := client.HashInput(a.figures())
	if err != nil {
		return "", err
	}
	return "artifact://sources/" + a.key + ".json#sha256=" + h[:16], nil
}

// draft is the document to create; its hash is the effect's input hash.
func (a *agent) draft() (title, body string) {
	var b strings.Builder
	fmt.Fprintf(&b, "Weekly report (%s), internal draft\n\n", a.key)
	for _, f := range a.figures() {
		fmt.Fprintf(&b, "- %s: %s\n", f[0], f[1])
	}
	return "Weekly report " + a.key, b.String()
}

// createDraft is the external effect, recorded as planned before and confirmed after.
func (a *agent) createDraft(ctx context.Context, l client.Ledger) (string, error) {
	title, body := a.draft()
	input := map[string]string{"run_id": a.key, "title": title, "body": body}
	hash, err := client.HashInput(input)
	if err != nil {
		return "", err
	}
	raw, err := json.Marshal(input)
	if err != nil {
		return "", err
	}
	// Input is what a gated action's approval card shows the person who decides.
	plan, err := a.c.Plan(ctx, a.key, effectID, client.PlanRequest{LeaseOwner: a.claim.LeaseOwner,
		Action: actionDraft, Target: targetDocs, InputHash: hash, Input: raw})
	switch {
	case client.IsCode(err, "reconcile_first"):
		return "", errReconcile
	case client.IsCode(err, "input_mismatch"):
		return "", fmt.Errorf("%w: %v", errStop, err)
	case err != nil:
		return "", err
	case plan.Approval != nil:
		// Hand the link to the approvers; claim the run again once it is approved.
		fmt.Printf("approval needed for %s: %s (expires %s)\n", effectID, plan.Approval.ApproveURL, plan.Approval.ExpiresAt.Format(time.RFC3339))
		return "", fmt.Errorf("%w: approval %s", errWait, plan.Approval.ID)
	case !plan.Execute:
		a.log.Info("effect already confirmed; not repeating it", "run_id", a.key, "effect_id", effectID, "receipt", plan.Receipt)
		return plan.Receipt, nil
	}
	crashPoint("before_create")
	doc, err := a.docs.Create(a.key, title, body)
	if err != nil {
		// The document system refused, or may have created it: the next start reconciles.
		return "", err
	}
	crashPoint("after_create")
	// Read it back: the receipt is what the external system holds, not what was sent.
	got, err := a.docs.Get(doc.Receipt())
	if err != nil {
		return "", err
	}
	a.log.Info("document created", "run_id", a.key, "effect_id", effectID, "receipt", got.Receipt())
	crashPoint("before_receipt")
	if err := a.c.Confirm(ctx, a.key, effectID, a.claim.LeaseOwner, got.Receipt()); err != nil {
		return "", err
	}
	return got.Receipt(), nil
}

// compareFigures checks the draft in the document system against the sources.
func (a *agent) compareFigures(l client.Ledger) (string, error) {
	receipt := evidenceOf(l, stepDraft)
	doc, err := a.docs.Get(receipt)
	if err != nil {
		return "", fmt.Errorf("%w: the draft %s cannot be read: %v", errStop, receipt, err)
	}
	for _, f := range a.figures() {
		if !strings.Contains(doc.Body, f[0]+": "+f[1]) {
			return "", fmt.Errorf("%w: the draft's %s differs from the sources", errStop, f[0])
		}
	}
	return fmt.Sprintf("check://%s/figures-match/%d", doc.ID, len(a.figures())), nil
}

// evidenceOf is the evidence recorded for a completed step.
func evidenceOf(l client.Ledger, step string) string {
	for _, s := range l.Completed {
		if s.Step == step {
			return s.Evidence
		}
	}
	return ""
}
