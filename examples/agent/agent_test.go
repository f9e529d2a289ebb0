package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/airlocktest"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// agentBinary is this command, built once (with -race when the tests run with it).
var agentBinary string

// buildFlags gains -race under the race detector (race_test.go).
var buildFlags []string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "airlock-agent-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	agentBinary = filepath.Join(dir, "agent")
	build := exec.Command("go", append(append([]string{"build"}, buildFlags...), "-o", agentBinary, ".")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build the agent:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// lease is short so a restarted agent can reclaim its run soon after a crash: an expired
// processing lease is reclaimable.
const lease = 2 * time.Second

// startAirlock serves airlock in-process on a fresh store of backend b.
func startAirlock(t *testing.T, b storetest.Backend) *airlocktest.Server {
	t.Helper()
	st := b.Open(t, nil) // the backends' own clocks: leases lapse in wall time
	srv, err := airlocktest.Start(context.Background(), st, airlocktest.AgentPolicy, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return srv
}

// logLine is one JSON line of the agent's output.
type logLine struct {
	Msg               string   `json:"msg"`
	Verdict           string   `json:"verdict"`
	Status            string   `json:"status"`
	Step              string   `json:"step"`
	NextAllowedAction string   `json:"next_allowed_action"`
	CheckpointVersion int      `json:"checkpoint_version"`
	Found             []string `json:"found"`
}

type agentRun struct {
	lines  []logLine
	output string
	err    error
}

func (r agentRun) messages(msg string) []logLine {
	var out []logLine
	for _, l := range r.lines {
		if l.Msg == msg {
			out = append(out, l)
		}
	}
	return out
}

// runAgent runs the agent to its end (or its crash) with env added.
func runAgent(t *testing.T, srv *airlocktest.Server, runID, docs string, env ...string) agentRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, agentBinary, "--airlock", srv.URL, "--run-id", runID, "--docs", docs,
		"--lease", lease.String(), "--wait", "30s")
	cmd.Env = append(os.Environ(), append([]string{"AIRLOCK_API_KEY=" + srv.APIKey, "AGENT_CRASH_AT="}, env...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	r := agentRun{output: out.String(), err: err}
	sc := bufio.NewScanner(strings.NewReader(r.output))
	for sc.Scan() {
		var l logLine
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg != "" {
			r.lines = append(r.lines, l)
		}
	}
	return r
}

func killed(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

var steps = []string{stepSources, stepDraft, stepCompare}

// TestRestartAfterCrash is the work ledger's restart test: the agent is killed immediately
// before creating the document, immediately after, and immediately before confirming
// the receipt; each time it is started again and finishes. Exactly one document exists
// for the run, the run is completed, and the ledger went through the real steps in
// order, once each.
func TestRestartAfterCrash(t *testing.T) {
	cases := []struct {
		crashAt        string
		docsAfterCrash int
		reconciled     string // what the search found on restart
	}{
		{"before_create", 0, client.EffectCleared},
		{"after_create", 1, client.EffectConfirmed},
		{"before_receipt", 1, client.EffectConfirmed},
	}
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			srv := startAirlock(t, b)
			c := client.New(srv.URL, srv.APIKey)
			for _, tc := range cases {
				t.Run(tc.crashAt, func(t *testing.T) {
					t.Parallel()
					ctx := context.Background()
					runID := "report-2026w48-" + strings.ReplaceAll(tc.crashAt, "_", "-")
					docs := Docs{Dir: t.TempDir()}

					first := runAgent(t, srv, runID, docs.Dir, "AGENT_CRASH_AT="+tc.crashAt)
					if !killed(first.err) {
						t.Fatalf("the agent was not killed at %s: %v\n%s", tc.crashAt, first.err, first.output)
					}
					if got := countDocs(t, docs, runID); got != tc.docsAfterCrash {
						t.Fatalf("after the crash: %d documents; want %d", got, tc.docsAfterCrash)
					}
					// The crash left the effect planned: airlock says so before anyone acts.
					r, err := c.Resume(ctx, runID)
					if err != nil || r.Verdict != client.VerdictReconcile || len(r.Reconcile) != 1 || r.Reconcile[0].EffectID != effectID {
						t.Fatalf("resume after the crash: %+v, %v", r, err)
					}

					second := runAgent(t, srv, runID, docs.Dir)
					if second.err != nil {
						t.Fatalf("the restarted agent failed: %v\n%s", second.err, second.output)
					}
					if rec := second.messages("reconciled"); len(rec) != 1 || rec[0].Status != tc.reconciled {
						t.Fatalf("reconciled on restart: %+v; want one, %s\n%s", rec, tc.reconciled, second.output)
					}
					if claims := second.messages("claimed"); len(claims) != 1 {
						t.Fatalf("restart: %d claims\n%s", len(claims), second.output)
					}

					found, err := docs.SearchByRunID(runID)
					if err != nil {
						t.Fatal(err)
					}
					if len(found) != 1 {
						t.Fatalf("%d documents for %s; want exactly one", len(found), runID)
					}
					receipt := found[0].Receipt()

					run, err := c.Run(ctx, runID)
					if err != nil {
						t.Fatal(err)
					}
					if run.State != client.StateCompleted || run.Reclaims != 1 {
						t.Fatalf("run: state %s, reclaims %d; want completed after one reclaim", run.State, run.Reclaims)
					}
					// Waiting for the crashed process's lease is not a redelivery: one duplicate
					// claim (the first try) at most, not one per poll of the agent waiting for it.
					if run.Duplicates > 1 {
						t.Fatalf("run: %d duplicate deliveries counted for one restart; want at most 1", run.Duplicates)
					}
					var result struct{ Document string }
					if err := json.Unmarshal(run.Result, &result); err != nil || result.Document != receipt {
						t.Fatalf("run result %s; want document %s", run.Result, receipt)
					}

					checkLedger(t, c, runID, receipt)
					checkHistory(t, c, runID, append(first.messages("ledger saved"), second.messages("ledger saved")...))
					// The created-document step ran to its end once in both lives together.
					created := len(first.messages("document created")) + len(second.messages("document created"))
					if want := map[string]int{"before_create": 1, "after_create": 0, "before_receipt": 1}[tc.crashAt]; created != want {
						t.Fatalf("%d document-created lines; want %d", created, want)
					}

					// A third start finds the run completed and does nothing.
					third := runAgent(t, srv, runID, docs.Dir)
					if third.err != nil || len(third.messages("already completed")) != 1 {
						t.Fatalf("a third start: %v\n%s", third.err, third.output)
					}
					if got := countDocs(t, docs, runID); got != 1 {
						t.Fatalf("after a third start: %d documents", got)
					}
				})
			}
		})
	}
}

// TestSeveralCandidatesStop: if the search on restart finds more than one document, the
// outcome is unknown and the agent stops for a person instead of guessing or creating a
// third.
func TestSeveralCandidatesStop(t *testing.T) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			srv := startAirlock(t, b)
			c := client.New(srv.URL, srv.APIKey)
			ctx := context.Background()
			runID := "report-2026w49"
			docs := Docs{Dir: t.TempDir()}
			if first := runAgent(t, srv, runID, docs.Dir, "AGENT_CRASH_AT=after_create"); !killed(first.err) {
				t.Fatalf("not killed: %v\n%s", first.err, first.output)
			}
			if _, err := docs.Create(runID, "Weekly report (copy)", "made by someone else"); err != nil {
				t.Fatal(err)
			}
			second := runAgent(t, srv, runID, docs.Dir)
			if exitCode(second.err) != exitStop {
				t.Fatalf("exit %v; want %d (stopped)\n%s", second.err, exitStop, second.output)
			}
			if rec := second.messages("reconciled"); len(rec) != 1 || rec[0].Status != client.EffectUnknown || len(rec[0].Found) != 2 {
				t.Fatalf("reconciled: %+v\n%s", rec, second.output)
			}
			if got := countDocs(t, docs, runID); got != 2 {
				t.Fatalf("%d documents; want the two found, no third", got)
			}
			r, err := c.Resume(ctx, runID)
			if err != nil || r.Verdict != client.VerdictStop {
				t.Fatalf("resume: %+v, %v", r, err)
			}
			l, err := c.Ledger(ctx, runID)
			if err != nil || l.NextAllowedAction != stepDraft || len(l.Effects) != 1 || l.Effects[0].Status != client.EffectUnknown {
				t.Fatalf("ledger: %+v, %v", l, err)
			}
		})
	}
}

func countDocs(t *testing.T, docs Docs, runID string) int {
	t.Helper()
	found, err := docs.SearchByRunID(runID)
	if err != nil {
		t.Fatal(err)
	}
	return len(found)
}

// checkLedger: the final ledger holds the real steps in order, the document's receipt
// as their evidence and as the one confirmed effect, and nothing left to do.
func checkLedger(t *testing.T, c *client.Client, runID, receipt string) {
	t.Helper()
	l, err := c.Ledger(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	var done []string
	for _, s := range l.Completed {
		done = append(done, s.Step)
	}
	if !slices.Equal(done, steps) || l.NextAllowedAction != stepDone || len(l.Pending) != 0 || l.CheckpointVersion != 4 {
		t.Fatalf("final ledger: completed %v, pending %v, next %q, checkpoint %d; want %v, none, done, 4",
			done, l.Pending, l.NextAllowedAction, l.CheckpointVersion, steps)
	}
	if ev := evidenceOf(l, stepDraft); ev != receipt {
		t.Fatalf("evidence of %s: %q; want %q", stepDraft, ev, receipt)
	}
	want := client.LedgerEffect{EffectID: effectID, Action: actionDraft, Target: targetDocs, Status: client.EffectConfirmed, Receipt: receipt}
	if len(l.Effects) != 1 {
		t.Fatalf("ledger effects: %+v", l.Effects)
	}
	got := l.Effects[0]
	got.InputHash = ""
	if got != want {
		t.Fatalf("ledger effect: %+v; want %+v", got, want)
	}
}

// checkHistory: the checkpoints the agent saved across both lives, and those airlock
// recorded, are 1…4 with next_allowed_action stepping through the real steps once each.
func checkHistory(t *testing.T, c *client.Client, runID string, saved []logLine) {
	t.Helper()
	want := append(slices.Clone(steps), stepDone)
	var agentSaw []string
	for i, s := range saved {
		if s.CheckpointVersion != i+1 {
			t.Fatalf("the agent saved checkpoint %d as save %d", s.CheckpointVersion, i+1)
		}
		agentSaw = append(agentSaw, s.NextAllowedAction)
	}
	if !slices.Equal(agentSaw, want) {
		t.Fatalf("next_allowed_action saved by the agent: %v; want %v", agentSaw, want)
	}
	events, next, err := c.Events(context.Background(), runID, 0, 1000)
	if err != nil || next != 0 {
		t.Fatalf("events: %v (next %d)", err, next)
	}
	var recorded []string
	for _, e := range events {
		if e.Kind != "ledger_saved" {
			continue
		}
		var d struct {
			CheckpointVersion int    `json:"checkpoint_version"`
			NextAllowedAction string `json:"next_allowed_action"`
		}
		if err := json.Unmarshal(e.Detail, &d); err != nil || d.CheckpointVersion != len(recorded)+1 {
			t.Fatalf("ledger_saved event %s: %v", e.Detail, err)
		}
		recorded = append(recorded, d.NextAllowedAction)
	}
	if !slices.Equal(recorded, want) {
		t.Fatalf("next_allowed_action recorded by airlock: %v; want %v", recorded, want)
	}
}
