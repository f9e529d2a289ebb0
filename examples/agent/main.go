// Command agent is the weekly-report agent airlock's work ledger was designed for, on the
// Go client's step API: a long-running agent that can be killed at any moment and started
// again without repeating an external effect or starting over.
//
// Its steps, each one external effect in the document system (a directory: docs.go):
// draft (create_internal_draft: the week's figures as a document) → check (annotate_draft:
// the draft read back and compared with the sources; a note on it says they match) →
// share (share_internal: the draft shared with the team) → done. [client.Client.OpenRun]
// claims the run and keeps its lease; each [client.AgentRun.Step] plans the effect,
// performs it once, confirms it and records the ledger's checkpoint; a step that a killed
// process left planned is looked up in the document system by its idempotency key.
//
//	airlock serve --config policy.yaml   # the three action types, {connector: worker, gate: none}
//	AIRLOCK_API_KEY=$(airlock apikey create --name agent --scope runs) \
//	  go run ./examples/agent --run-id report-2026w48 --docs ./docs
//
// Exit status: 0 done (or already completed), 2 stopped for a person, 3 waiting for an
// approval, 1 any other error. For the restart test, AGENT_CRASH_AT=POINT:STEP (POINT is
// before_perform, after_perform or after_confirm; STEP draft, check or share) makes it
// SIGKILL itself there.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/airlockhq/airlock/client"
)

// The steps (effect ids), their action types in airlock's policy, and where they act.
const (
	stepDraft, stepCheck, stepShare = "draft", "check", "share"
	actionDraft, actionCheck        = "create_internal_draft", "annotate_draft"
	actionShare, targetDocs         = "share_internal", "internal-docs"
	exitFailed, exitStop, exitWait  = 1, 2, 3
)

var steps = []string{stepDraft, stepCheck, stepShare}

// figures are the week's numbers from the sources: a pure function of the run, so every
// attempt drafts the same document and plans it with the same input.
var figures = [][2]string{{"revenue", "1,204,000 JPY"}, {"tickets_closed", "311"}, {"median_first_response", "42 min"}}

func main() {
	var airlock, apiKey, runID, dir string
	var lease, wait time.Duration
	flag.StringVar(&airlock, "airlock", envOr("AIRLOCK_URL", "http://127.0.0.1:8080"), "airlock's base URL [AIRLOCK_URL]")
	flag.StringVar(&apiKey, "api-key", os.Getenv("AIRLOCK_API_KEY"), "API key with the runs scope [AIRLOCK_API_KEY]")
	flag.StringVar(&runID, "run-id", "", "the run's key, issued once per report (e.g. report-2026w48)")
	flag.StringVar(&dir, "docs", "", "directory of the document system")
	flag.DurationVar(&lease, "lease", 30*time.Second, "lease length (whole seconds); renewed every third of it")
	flag.DurationVar(&wait, "wait", 2*time.Minute, "how long to wait for another process's live lease to lapse")
	flag.Parse()
	if runID == "" || dir == "" || apiKey == "" || lease < time.Second {
		fmt.Fprintln(os.Stderr, "agent: --run-id, --docs and --api-key (or AIRLOCK_API_KEY) are required; --lease at least 1s")
		os.Exit(exitFailed)
	}
	log := slog.New(slog.NewJSONHandler(os.Stdout, nil))
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	a := agent{docs: Docs{Dir: dir}, key: runID, log: log}
	err := a.run(ctx, client.New(airlock, apiKey), client.RunOptions{
		Goal:         "Draft the weekly report, check its figures and share it internally",
		Steps:        steps,
		Invariants:   []string{"Never send customer names to external services", "Share only a draft whose figures were checked"},
		LeaseSeconds: int(lease / time.Second), WaitLease: wait,
		Meta: &client.Meta{TriggerSource: "weekly-report-agent"},
		Hook: crashAt(os.Getenv("AGENT_CRASH_AT")),
	})
	cancel()
	var person *client.NeedsPersonError
	var busy *client.RunBusyError
	var rejected *client.RejectedError
	var pending *client.ApprovalPendingError
	switch {
	case err == nil:
	case errors.As(err, &pending):
		log.Info("waiting", "run_id", runID, "approval_id", pending.ApprovalID, "console_url", pending.ConsoleURL)
		os.Exit(exitWait)
	case errors.As(err, &person), errors.As(err, &busy), errors.As(err, &rejected):
		log.Warn("stopped", "run_id", runID, "err", err.Error())
		os.Exit(exitStop)
	default:
		log.Error("failed", "run_id", runID, "err", err.Error())
		os.Exit(exitFailed)
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// crashAt returns the step hook that SIGKILLs the process at "POINT:STEP": no deferred
// code runs and nothing is flushed, as in a power cut or an OOM kill.
func crashAt(where string) func(string, client.StepCall) {
	return func(point string, call client.StepCall) {
		if where == point+":"+call.EffectID {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
}

type agent struct {
	docs Docs
	key  string
	log  *slog.Logger
}

func (a agent) run(ctx context.Context, c *client.Client, o client.RunOptions) error {
	r, err := c.OpenRun(ctx, a.key, map[string]string{"report": "weekly", "run_id": a.key}, o)
	if err != nil {
		return err
	}
	defer r.Close()
	if r.Finished {
		a.log.Info("already completed", "run_id", a.key, "state", r.State, "result", string(r.Result))
		return nil
	}
	a.log.Info("claimed", "run_id", a.key, "reclaimed", r.Reclaimed, "version", r.Version,
		"checkpoint_version", r.Ledger.CheckpointVersion, "next_allowed_action", r.Ledger.NextAllowedAction)
	var b strings.Builder
	fmt.Fprintf(&b, "Weekly report (%s), internal draft\n\n", a.key)
	for _, f := range figures {
		fmt.Fprintf(&b, "- %s: %s\n", f[0], f[1])
	}
	draft := Document{Kind: "doc", RunID: a.key, Title: "Weekly report " + a.key, Body: b.String()}
	doc, err := a.step(ctx, r, stepDraft, actionDraft, map[string]string{"title": draft.Title, "body": draft.Body},
		func() (Document, error) { return draft, nil })
	if err != nil {
		return err
	}
	note, err := a.step(ctx, r, stepCheck, actionCheck, map[string]any{"document": doc, "figures": len(figures)},
		func() (Document, error) { return a.checkFigures(doc) })
	if err != nil {
		return err
	}
	shared, err := a.step(ctx, r, stepShare, actionShare, map[string]string{"document": doc, "checked": note, "audience": "team"},
		func() (Document, error) {
			return Document{Kind: "share", RunID: a.key, Title: "Shared with team", Body: doc}, nil
		})
	if err != nil {
		return err
	}
	t, err := r.Complete(ctx, map[string]string{"document": doc, "check": note, "share": shared})
	if err != nil {
		return err
	}
	a.log.Info("run completed", "run_id", a.key, "state", t.State, "document", doc, "share", shared)
	return nil
}

// step is one external effect: the record that record returns is created in the document
// system under the step's idempotency key, at most once, and its receipt returned.
func (a agent) step(ctx context.Context, r *client.AgentRun, id, action string, input any,
	record func() (Document, error)) (string, error) {
	res, err := r.Step(ctx, id, action, targetDocs, input, func(_ context.Context, call client.StepCall) (string, error) {
		d, err := record()
		if err != nil {
			return "", err
		}
		d.Key = call.IdempotencyKey
		created, err := a.docs.Create(d)
		if err != nil {
			return "", err // the document system refused, or may have created it: a restart looks it up
		}
		a.log.Info("document created", "run_id", a.key, "step", id, "receipt", created.Receipt())
		return created.Receipt(), nil
	}, client.Lookup(a.lookup))
	if err != nil {
		return "", err
	}
	a.log.Info("step done", "run_id", a.key, "step", id, "receipt", res.Receipt, "replayed", res.Replayed,
		"checkpoint_version", r.Ledger.CheckpointVersion, "next_allowed_action", r.Ledger.NextAllowedAction)
	return res.Receipt, nil
}

// lookup searches the document system for what a step planned by a killed process left:
// none found, it is performed; one, it happened; several, a person decides.
func (a agent) lookup(_ context.Context, call client.StepCall) ([]string, error) {
	found, err := a.docs.Search(call.IdempotencyKey)
	if err != nil {
		a.log.Warn("search failed", "run_id", a.key, "step", call.EffectID, "err", err.Error())
		return nil, client.ErrUndetermined // a failed search proves nothing
	}
	receipts := []string{}
	for _, d := range found {
		receipts = append(receipts, d.Receipt())
	}
	a.log.Info("reconciled", "run_id", a.key, "step", call.EffectID, "found", receipts)
	return receipts, nil
}

// checkFigures reads the stored draft back and compares it with the sources: the note
// it returns says they match.
func (a agent) checkFigures(receipt string) (Document, error) {
	d, err := a.docs.Get(receipt)
	if err != nil {
		return Document{}, fmt.Errorf("the draft %s cannot be read: %w", receipt, err)
	}
	for _, f := range figures {
		if !strings.Contains(d.Body, f[0]+": "+f[1]) {
			return Document{}, &client.NeedsPersonError{EffectID: stepCheck, Why: "the draft's " + f[0] + " differs from the sources"}
		}
	}
	return Document{Kind: "note", RunID: a.key, Title: "Figures checked", Body: fmt.Sprintf("%s: %d figures match the sources", receipt, len(figures))}, nil
}
