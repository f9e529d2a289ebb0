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
	Step              string   `json:"step"`
	Receipt           string   `json:"receipt"`
	Replayed          bool     `json:"replayed"`
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

var points = []string{"before_perform", "after_perform", "after_confirm"}

// TestRestartAfterCrash is the work ledger's restart test: the agent is SIGKILLed at every
// step boundary — before it creates the step's record in the document system, right
// after, and after airlock confirmed it but before the ledger's checkpoint — of each of
// its three steps; each time it is started again and finishes. Exactly one record exists
// per step, the run is completed, and the ledger went through the steps in order, once
// each. On both stores.
func TestRestartAfterCrash(t *testing.T) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			srv := startAirlock(t, b)
			c := client.New(srv.URL, srv.APIKey)
			for _, step := range steps {
				for _, point := range points {
					t.Run(point+":"+step, func(t *testing.T) {
						t.Parallel()
						crashAndResume(t, srv, c, step, point)
					})
				}
			}
		})
	}
}

func crashAndResume(t *testing.T, srv *airlocktest.Server, c *client.Client, step, point string) {
	ctx := context.Background()
	runID := "report-2026w48-" + step + "-" + strings.ReplaceAll(point, "_", "-")
	docs := Docs{Dir: t.TempDir()}

	first := runAgent(t, srv, runID, docs.Dir, "AGENT_CRASH_AT="+point+":"+step)
	if !killed(first.err) {
		t.Fatalf("the agent was not killed at %s:%s: %v\n%s", point, step, first.err, first.output)
	}
	performed := 1
	if point == "before_perform" {
		performed = 0
	}
	if got := len(search(t, docs, runID+"/"+step)); got != performed {
		t.Fatalf("after the crash: %d records of %s; want %d", got, step, performed)
	}
	// A crash before the ledger's checkpoint left the effect confirmed; before that,
	// planned: airlock says so before anyone acts.
	r, err := c.Resume(ctx, runID)
	if point == "after_confirm" {
		if err != nil || r.Verdict != client.VerdictContinue || r.NextAllowedAction != step {
			t.Fatalf("resume after the crash: %+v, %v", r, err)
		}
	} else if err != nil || r.Verdict != client.VerdictReconcile || len(r.Reconcile) != 1 || r.Reconcile[0].EffectID != step {
		t.Fatalf("resume after the crash: %+v, %v", r, err)
	}

	second := runAgent(t, srv, runID, docs.Dir)
	if second.err != nil {
		t.Fatalf("the restarted agent failed: %v\n%s", second.err, second.output)
	}
	rec := second.messages("reconciled")
	switch {
	case point == "after_confirm" && len(rec) != 0,
		point != "after_confirm" && (len(rec) != 1 || rec[0].Step != step || len(rec[0].Found) != performed):
		t.Fatalf("looked up on restart: %+v; want %d record(s) of %s found\n%s", rec, performed, step, second.output)
	}
	if claims := second.messages("claimed"); len(claims) != 1 {
		t.Fatalf("restart: %d claims\n%s", len(claims), second.output)
	}
	// Each step's record was created once in both lives together, and each step done once.
	if created := len(first.messages("document created")) + len(second.messages("document created")); created != len(steps) {
		t.Fatalf("%d records created across both lives; want %d", created, len(steps))
	}
	// The first life did the steps before the crash's; the second went through all of them,
	// answering those done (and the crash's, once it was performed) from airlock's record.
	at := slices.Index(steps, step)
	var firstDone, secondDone, wantSecond []string
	for _, l := range first.messages("step done") {
		firstDone = append(firstDone, l.Step)
	}
	for _, l := range second.messages("step done") {
		secondDone = append(secondDone, fmt.Sprintf("%s replayed=%v", l.Step, l.Replayed))
	}
	for i, s := range steps {
		wantSecond = append(wantSecond, fmt.Sprintf("%s replayed=%v", s, i < at || (i == at && point != "before_perform")))
	}
	if !slices.Equal(firstDone, steps[:at]) || !slices.Equal(secondDone, wantSecond) {
		t.Fatalf("steps done: %v, then %v; want %v, then %v", firstDone, secondDone, steps[:at], wantSecond)
	}

	receipts := map[string]string{}
	for _, s := range steps {
		found := search(t, docs, runID+"/"+s)
		if len(found) != 1 {
			t.Fatalf("%d records of step %s; want exactly one", len(found), s)
		}
		receipts[s] = found[0].Receipt()
	}
	if all, _ := docs.SearchByRunID(runID); len(all) != len(steps) {
		t.Fatalf("%d records for the run; want %d", len(all), len(steps))
	}
	run, err := c.Run(ctx, runID)
	if err != nil {
		t.Fatal(err)
	}
	if run.State != client.StateCompleted || run.Reclaims != 1 {
		t.Fatalf("run: state %s, reclaims %d; want completed after one reclaim", run.State, run.Reclaims)
	}
	// Waiting for the killed process's lease is not a redelivery: one duplicate claim (the
	// first try) at most, not one per poll of the agent waiting for it.
	if run.Duplicates > 1 {
		t.Fatalf("run: %d duplicate deliveries counted for one restart; want at most 1", run.Duplicates)
	}
	var result struct{ Document, Check, Share string }
	if err := json.Unmarshal(run.Result, &result); err != nil || result.Document != receipts[stepDraft] ||
		result.Check != receipts[stepCheck] || result.Share != receipts[stepShare] {
		t.Fatalf("run result %s; want the receipts %v", run.Result, receipts)
	}
	checkLedger(t, c, runID, receipts)
	checkHistory(t, c, runID)

	// A third start finds the run completed and does nothing.
	third := runAgent(t, srv, runID, docs.Dir)
	if third.err != nil || len(third.messages("already completed")) != 1 {
		t.Fatalf("a third start: %v\n%s", third.err, third.output)
	}
	if all, _ := docs.SearchByRunID(runID); len(all) != len(steps) {
		t.Fatalf("after a third start: %d records", len(all))
	}
}

// TestSeveralCandidatesStop: if the lookup on restart finds more than one record for the
// step, the outcome is unknown and the agent stops for a person instead of guessing or
// creating a third.
func TestSeveralCandidatesStop(t *testing.T) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			srv := startAirlock(t, b)
			c := client.New(srv.URL, srv.APIKey)
			ctx := context.Background()
			runID := "report-2026w49"
			docs := Docs{Dir: t.TempDir()}
			if first := runAgent(t, srv, runID, docs.Dir, "AGENT_CRASH_AT=after_perform:draft"); !killed(first.err) {
				t.Fatalf("not killed: %v\n%s", first.err, first.output)
			}
			if _, err := docs.Create(Document{Kind: "doc", RunID: runID, Key: runID + "/draft", Title: "Weekly report (copy)", Body: "made by someone else"}); err != nil {
				t.Fatal(err)
			}
			second := runAgent(t, srv, runID, docs.Dir)
			if exitCode(second.err) != exitStop {
				t.Fatalf("exit %v; want %d (stopped)\n%s", second.err, exitStop, second.output)
			}
			if rec := second.messages("reconciled"); len(rec) != 1 || len(rec[0].Found) != 2 {
				t.Fatalf("reconciled: %+v\n%s", rec, second.output)
			}
			if got := len(search(t, docs, runID+"/draft")); got != 2 {
				t.Fatalf("%d records; want the two found, no third", got)
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

func search(t *testing.T, docs Docs, key string) []Document {
	t.Helper()
	found, err := docs.Search(key)
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// checkLedger: the final ledger holds the steps in order with their records' receipts as
// evidence, each step's effect confirmed with the same receipt, and nothing left to do.
func checkLedger(t *testing.T, c *client.Client, runID string, receipts map[string]string) {
	t.Helper()
	l, err := c.Ledger(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	var done, want []string
	for _, s := range l.Completed {
		done = append(done, s.Step+"="+s.Evidence)
	}
	for _, s := range steps {
		want = append(want, s+"="+receipts[s])
	}
	if !slices.Equal(done, want) || l.NextAllowedAction != client.Done || len(l.Pending) != 0 || l.CheckpointVersion != 4 {
		t.Fatalf("final ledger: completed %v, pending %v, next %q, checkpoint %d; want %v, none, done, 4",
			done, l.Pending, l.NextAllowedAction, l.CheckpointVersion, want)
	}
	actions := map[string]string{stepDraft: actionDraft, stepCheck: actionCheck, stepShare: actionShare}
	if len(l.Effects) != len(steps) {
		t.Fatalf("ledger effects: %+v", l.Effects)
	}
	for _, e := range l.Effects {
		e.InputHash = ""
		if want := (client.LedgerEffect{EffectID: e.EffectID, Action: actions[e.EffectID], Target: targetDocs,
			Status: client.EffectConfirmed, Receipt: receipts[e.EffectID]}); e != want {
			t.Fatalf("ledger effect: %+v; want %+v", e, want)
		}
	}
}

// checkHistory: the checkpoints airlock recorded are 1…4 with next_allowed_action stepping
// through the steps once each.
func checkHistory(t *testing.T, c *client.Client, runID string) {
	t.Helper()
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
	if want := append(slices.Clone(steps), client.Done); !slices.Equal(recorded, want) {
		t.Fatalf("next_allowed_action recorded by airlock: %v; want %v", recorded, want)
	}
}
