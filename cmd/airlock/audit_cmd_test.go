package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/failures"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/sqlite"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// TestExplainAndReportCommands records a run in a SQLite file in this process, then asks
// the airlock binary about it.
func TestExplainAndReportCommands(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "audit.db")
	file := storetest.Backend{Name: "sqlite", Open: func(t testing.TB, c *storetest.Clock) store.Store {
		st, err := sqlite.Open(ctx, path, sqlite.Options{Now: c.Now})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		if err := st.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		return st
	}}
	e := apptest.NewEffectsEnv(t, file, "")
	meta := &runs.Meta{WorkflowVersion: "wf-7@v3", Model: &runs.Model{Provider: "local", Name: "qwen2.5", Revision: "q4"}}
	first, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: "k-1", PayloadHash: "h1", Actor: "apikey:n8n", Meta: meta})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: "k-1", PayloadHash: "h1", Actor: "apikey:n8n"}); err != nil {
		t.Fatal(err)
	}
	run := first.Run
	if _, _, _, err := e.Effects.Queue(ctx, effects.QueueRequest{Key: "k-1", Owner: run.LeaseOwner, Version: run.Version,
		ActionType: "note", Target: "default", Payload: json.RawMessage(`{"note":"hello"}`), Actor: "apikey:n8n", Meta: meta}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Dispatcher.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Runs.Transition(ctx, runs.TransitionRequest{LeaseRequest: runs.LeaseRequest{Key: "k-1", Owner: run.LeaseOwner,
		Version: run.Version, Actor: "apikey:n8n"}, To: store.StateCompleted}); err != nil {
		t.Fatal(err)
	}
	env := []string{"AIRLOCK_DATABASE_URL=" + path}

	out, stderr, err := airlock(t, env, "explain", "k-1")
	if err != nil {
		t.Fatalf("explain: %v\n%s", err, stderr)
	}
	for _, want := range []string{
		"k-1: completed (version 2)",
		"Processed?     yes: claimed by apikey:n8n at 2026-11-30T09:00:00Z; completed at 2026-11-30T09:00:00Z; 1 duplicate delivery refused, 0 reclaims",
		"Sent?          yes: 1 of 1 effect sent (note → default, provider id p-k-1/" + effects.DeriveEffectID("note", "default"),
		"Who approved?  nobody: no approval was needed",
		"Which model?   local/qwen2.5 (revision q4); workflow wf-7@v3; no validation",
		"EFFECTS", "TIMELINE", "duplicate delivery refused: the run was processing", "processing → completed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("explain output lacks %q:\n%s", want, out)
		}
	}

	out, stderr, err = airlock(t, env, "explain", "k-1", "--json")
	if err != nil {
		t.Fatalf("explain --json: %v\n%s", err, stderr)
	}
	var x struct {
		Key       string
		Processed struct{ State string }
		Sent      struct{ Effects []struct{ Sent bool } }
		Timeline  []struct{ Kind string }
	}
	if err := json.Unmarshal([]byte(out), &x); err != nil || x.Key != "k-1" || x.Processed.State != "completed" || len(x.Sent.Effects) != 1 || !x.Sent.Effects[0].Sent || len(x.Timeline) != 5 {
		t.Fatalf("explain --json (%v):\n%s", err, out)
	}

	if _, stderr, err := airlock(t, env, "explain", "nobody"); err == nil || !strings.Contains(stderr, `no run has the key "nobody"`) {
		t.Fatalf("explain of an unknown key: %v %s", err, stderr)
	}

	// The test clock is not the binary's: a window of ten years holds the run whatever today is.
	out, stderr, err = airlock(t, env, "report", "--since", "3650d")
	if err != nil {
		t.Fatalf("report: %v\n%s", err, stderr)
	}
	for _, want := range []string{"duplicate-delivery rate", "50.0%", "= 1 / (1 + 1)", "gate wait p95", "n/a",
		"effects sent", "kill switch", "enabled"} {
		if !strings.Contains(out, want) {
			t.Errorf("report output lacks %q:\n%s", want, out)
		}
	}
	out, stderr, err = airlock(t, env, "report", "--since", "3650d", "--json")
	if err != nil {
		t.Fatalf("report --json: %v\n%s", err, stderr)
	}
	var r struct {
		DuplicateRate *float64 `json:"duplicate_rate"`
		Effects       struct{ Sent int }
		GateWait      struct {
			P95 *float64 `json:"p95_seconds"`
		} `json:"gate_wait"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil || r.DuplicateRate == nil || *r.DuplicateRate != 0.5 || r.Effects.Sent != 1 || r.GateWait.P95 != nil {
		t.Fatalf("report --json (%v):\n%s", err, out)
	}
	if _, stderr, err := airlock(t, env, "report", "--since", "a week"); err == nil || !strings.Contains(stderr, "--since") {
		t.Fatalf("a bad --since: %v %s", err, stderr)
	}
}

// TestUnparkCommand: `airlock runs unpark` gives a parked run its way out through the
// same operation as the API and the console, recorded with the operator and reason.
func TestUnparkCommand(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "unpark.db")
	file := storetest.Backend{Name: "sqlite", Open: func(t testing.TB, c *storetest.Clock) store.Store {
		st, err := sqlite.Open(ctx, path, sqlite.Options{Now: c.Now})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		if err := st.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		return st
	}}
	e := apptest.NewEffectsEnv(t, file, "")
	res, err := e.Runs.Claim(ctx, runs.ClaimRequest{Key: "k-9", PayloadHash: "h9", Actor: "apikey:n8n"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Failures.Failure(ctx, failures.FailureRequest{LeaseRequest: runs.LeaseRequest{Key: "k-9", Owner: res.Run.LeaseOwner,
		Version: res.Run.Version, Actor: "apikey:n8n"}, Class: "unknown_commit"}); err != nil {
		t.Fatal(err)
	}
	env := []string{"AIRLOCK_DATABASE_URL=" + path}
	if _, stderr, err := airlock(t, env, "runs", "unpark", "k-9", "--to", "failed_terminal"); err == nil || !strings.Contains(stderr, "reason") {
		t.Fatalf("unpark without a reason: %v %s", err, stderr)
	}
	out, stderr, err := airlock(t, env, "runs", "unpark", "k-9", "--to", "failed_terminal", "--reason", "sent by hand")
	if err != nil || !strings.Contains(out, "k-9 is failed_terminal") {
		t.Fatalf("unpark: %v %q %s", err, out, stderr)
	}
	if r, err := e.Store.RunGet(ctx, "k-9"); err != nil || r.State != store.StateFailedTerminal {
		t.Fatalf("after unpark: %+v %v", r, err)
	}
	if _, stderr, err := airlock(t, env, "runs", "unpark", "k-9", "--to", "failed_terminal", "--reason", "again"); err == nil || !strings.Contains(stderr, "not parked") {
		t.Fatalf("unpark twice: %v %s", err, stderr)
	}
	out, _, err = airlock(t, env, "explain", "k-9")
	if err != nil || !strings.Contains(out, "failed_terminal at") || !strings.Contains(out, "(unparked by cli:") || !strings.Contains(out, "run_unparked") || !strings.Contains(out, "cli:") || !strings.Contains(out, "sent by hand") {
		t.Fatalf("explain after unpark: %v\n%s", err, out)
	}
}
