package clienttest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/airlocktest"
	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// stepsPolicy is the client tests' one policy (clients/testdata/policy.yaml), which has the
// onboarding agent's two ungated effects (create_doc, crm_note) and its gated one
// (share_doc, for support-lead).
var stepsPolicy = clientPolicy

// TestMain lets the crash test run the onboarding agent in a child process (this test
// binary again) that it can SIGKILL.
func TestMain(m *testing.M) {
	if os.Getenv("ONBOARD_CHILD") == "1" {
		os.Exit(onboardChild())
	}
	os.Exit(m.Run())
}

func onboardChild() int {
	hook := func(point string, call client.StepCall) {
		mark := os.Getenv("AGENT_CRASH_MARK")
		if os.Getenv("AGENT_CRASH_AT") == point+":"+call.EffectID {
			if _, err := os.Stat(mark); errors.Is(err, os.ErrNotExist) {
				_ = os.WriteFile(mark, nil, 0o600)
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}
		}
	}
	c := client.New(os.Getenv("AIRLOCK_URL"), os.Getenv("AIRLOCK_API_KEY"))
	err := onboard(context.Background(), c, os.Getenv("RUN_KEY"), os.Getenv("PROVIDER"), 0, hook)
	var pending *client.ApprovalPendingError
	switch {
	case errors.As(err, &pending):
		fmt.Fprintf(os.Stderr, "waiting for approval %s: %s\n", pending.ApprovalID, pending.ApproveURL)
		return 3
	case err != nil:
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

type stepsEnv struct {
	srv   *airlocktest.Server
	c, op *client.Client
}

func startSteps(t *testing.T, b storetest.Backend) stepsEnv {
	t.Helper()
	srv := start(t, b, stepsPolicy, "support-lead")
	return stepsEnv{srv: srv.Server, c: srv.c, op: srv.op}
}

// decide decides the approval behind an approve link as the lead would.
func (e stepsEnv) decide(t *testing.T, approveURL, decision, reason string) {
	t.Helper()
	token := approveURL[strings.LastIndex(approveURL, "/")+1:]
	if _, err := e.srv.Approvals.Decide(context.Background(), approvals.HashToken(token), decision, reason,
		approvals.Person{Subject: "lead", Roles: []string{"support-lead"}}); err != nil {
		t.Fatalf("decide %s: %v", decision, err)
	}
}

// deciding wraps the client's transport: every plan answered with an approval is decided
// a moment later, as a person would while the agent waits.
func (e stepsEnv) deciding(t *testing.T, decision, reason string) *client.Client {
	c := client.New(e.srv.URL, e.srv.APIKey)
	c.HTTP = &http.Client{Transport: roundTrip(func(r *http.Request) (*http.Response, error) {
		resp, err := http.DefaultTransport.RoundTrip(r)
		if err != nil || resp.StatusCode != http.StatusAccepted || !strings.HasSuffix(r.URL.Path, "/plan") {
			return resp, err
		}
		var buf bytes.Buffer
		_, _ = buf.ReadFrom(resp.Body)
		resp.Body.Close()
		resp.Body = ioNopCloser{bytes.NewReader(buf.Bytes())}
		var a client.Approval
		if json.Unmarshal(buf.Bytes(), &a) == nil {
			time.AfterFunc(300*time.Millisecond, func() { e.decide(t, a.ApproveURL, decision, reason) })
		}
		return resp, nil
	})}
	return c
}

type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

type ioNopCloser struct{ *bytes.Reader }

func (ioNopCloser) Close() error { return nil }

func (e stepsEnv) effect(t *testing.T, key, effectID string) client.RunEffect {
	t.Helper()
	run, err := e.c.Run(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	for _, ef := range run.Effects {
		if ef.EffectID == effectID {
			return ef
		}
	}
	t.Fatalf("run %s has no effect %s", key, effectID)
	return client.RunEffect{}
}

func perform(receipt string) func(context.Context, client.StepCall) (string, error) {
	return func(context.Context, client.StepCall) (string, error) { return receipt, nil }
}

func mustNotPerform(t *testing.T) func(context.Context, client.StepCall) (string, error) {
	return func(context.Context, client.StepCall) (string, error) {
		t.Error("performed")
		return "", errors.New("performed")
	}
}

// TestStepSentWithoutProviderID: an effect an operator resolved "sent" without the
// provider's id plans as confirmed with no receipt, and a step answers it as a replay,
// recorded in the ledger, without performing. On both stores.
func TestStepSentWithoutProviderID(t *testing.T) {
	storetest.Each(t, func(t *testing.T, b storetest.Backend) {
		ctx, e := context.Background(), startSteps(t, b)
		cl := claim(t, e.c, "noid")
		in, _ := json.Marshal(map[string]string{"title": "Q4"})
		h, _ := client.HashInput(map[string]string{"title": "Q4"})
		req := client.PlanRequest{LeaseOwner: cl.LeaseOwner, Action: "create_doc", Target: "docs", InputHash: h, Input: in}
		if p, err := e.c.Plan(ctx, "noid", "doc-1", req); err != nil || !p.Execute {
			t.Fatalf("plan: %+v, %v", p, err)
		}
		if s, err := e.c.Reconcile(ctx, "noid", "doc-1", cl.LeaseOwner, nil, true); err != nil || s != client.EffectUnknown {
			t.Fatalf("reconcile: %s, %v", s, err)
		}
		ef := e.effect(t, "noid", "doc-1")
		body, _ := json.Marshal(map[string]any{"outcome": "sent", "no_provider_id": true, "note": "seen in the docs app", "version": ef.Version})
		r, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/effects/"+ef.ID+"/resolve", bytes.NewReader(body))
		r.Header.Set("Authorization", "Bearer "+e.op.APIKey)
		r.Header.Set("Content-Type", "application/json")
		if resp, err := http.DefaultClient.Do(r); err != nil || resp.StatusCode != 200 {
			t.Fatalf("resolve: %v %v", resp, err)
		}
		p, err := e.c.Plan(ctx, "noid", "doc-1", req)
		if err != nil || p.Execute || !p.Confirmed || p.Receipt != "" || p.Approval != nil {
			t.Fatalf("plan after resolve: %+v, %v", p, err)
		}
		if _, err := e.c.SaveLedger(ctx, "noid", cl.LeaseOwner, client.Ledger{Goal: "g", Pending: []string{"doc-1"}, NextAllowedAction: "doc-1", CheckpointVersion: 1}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.c.Transition(ctx, "noid", client.TransitionRequest{LeaseOwner: cl.LeaseOwner, Version: cl.Version, To: "failed_retryable"}); err != nil {
			t.Fatal(err)
		}
		run, err := e.c.OpenRun(ctx, "noid", map[string]string{"k": "noid"}, client.RunOptions{Steps: []string{"doc-1"}})
		if err != nil {
			t.Fatal(err)
		}
		defer run.Close()
		res, err := run.Step(ctx, "doc-1", "create_doc", "docs", map[string]string{"title": "Q4"}, mustNotPerform(t))
		if err != nil || res.Receipt != "" || !res.Replayed || !res.Confirmed {
			t.Fatalf("step: %+v, %v", res, err)
		}
		l, _ := e.c.Ledger(ctx, "noid")
		if len(l.Completed) != 1 || l.Completed[0].Step != "doc-1" || l.NextAllowedAction != client.Done {
			t.Fatalf("ledger: %+v", l)
		}
	})
}

// TestStepRejectionReason: the approver's reason reaches the agent, from a waiting step
// and from a later start. On both stores.
func TestStepRejectionReason(t *testing.T) {
	storetest.Each(t, func(t *testing.T, b storetest.Backend) {
		ctx, e := context.Background(), startSteps(t, b)
		run, err := e.c.OpenRun(ctx, "rej-1", map[string]string{"k": "1"}, client.RunOptions{LeaseSeconds: 5})
		if err != nil {
			t.Fatal(err)
		}
		_, err = run.Step(ctx, "share", "share_doc", "team", map[string]string{"doc": "doc://1"}, mustNotPerform(t))
		run.Close()
		var pending *client.ApprovalPendingError
		if !errors.As(err, &pending) || pending.ApproveURL == "" || !strings.HasSuffix(pending.ConsoleURL, "/console/approvals/"+pending.ApprovalID) {
			t.Fatalf("step: %v", err)
		}
		// A restarted agent whose run still waits learns which approval, and where to see it.
		_, err = e.c.OpenRun(ctx, "rej-1", map[string]string{"k": "1"}, client.RunOptions{})
		var again *client.ApprovalPendingError
		if !errors.As(err, &again) || again.ApprovalID != pending.ApprovalID || again.EffectID != "share" || again.ConsoleURL != pending.ConsoleURL {
			t.Fatalf("open a waiting run: %v", err)
		}
		e.decide(t, pending.ApproveURL, approvals.Reject, "not before legal has read it")
		_, err = e.c.OpenRun(ctx, "rej-1", map[string]string{"k": "1"}, client.RunOptions{})
		var rej *client.RejectedError
		if !errors.As(err, &rej) || rej.Reason != "not before legal has read it" || rej.RejectedBy != "lead" ||
			rej.EffectID != "share" || rej.ApprovalID != pending.ApprovalID {
			t.Fatalf("open a rejected run: %+v", err)
		}

		c := e.deciding(t, approvals.Reject, "wrong team")
		run, err = c.OpenRun(ctx, "rej-2", map[string]string{"k": "2"}, client.RunOptions{LeaseSeconds: 5, WaitApproval: 20 * time.Second, Poll: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer run.Close()
		_, err = run.Step(ctx, "share", "share_doc", "team", map[string]string{"doc": "doc://2"}, mustNotPerform(t))
		if !errors.As(err, &rej) || rej.Reason != "wrong team" || rej.EffectID != "share" {
			t.Fatalf("waiting step: %v", err)
		}
	})
}

// TestStepSkipEffectRejected: a reject of an effect whose type says approval.on_reject:
// skip_effect reaches the step as a RejectedError (who, why, which effect and approval,
// read from the error's details), the step is recorded as settled without performing,
// and the run goes on to its next step — from a later start and from a waiting step.
// On both stores.
func TestStepSkipEffectRejected(t *testing.T) {
	storetest.Each(t, func(t *testing.T, b storetest.Backend) {
		ctx, e := context.Background(), startSteps(t, b)
		opts := client.RunOptions{Steps: []string{"a", "post", "b"}, LeaseSeconds: 5}
		run, err := e.c.OpenRun(ctx, "skip-1", map[string]string{"k": "skip-1"}, opts)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := run.Step(ctx, "a", "create_doc", "x", map[string]int{"n": 1}, perform("r-a")); err != nil {
			t.Fatal(err)
		}
		_, err = run.Step(ctx, "post", "post_update", "team", map[string]string{"text": "hello"}, mustNotPerform(t))
		run.Close()
		var pending *client.ApprovalPendingError
		if !errors.As(err, &pending) {
			t.Fatalf("gated step: %v", err)
		}
		e.decide(t, pending.ApproveURL, approvals.Reject, "not this week")

		// The low-level answer carries the particulars as details.
		cl := claim(t, e.c, "skip-1")
		h, _ := client.HashInput(map[string]string{"text": "hello"})
		_, err = e.c.Plan(ctx, "skip-1", "post", client.PlanRequest{LeaseOwner: cl.LeaseOwner, Action: "post_update", Target: "team", InputHash: h})
		ae := wantCode(t, err, http.StatusConflict, "effect_rejected")
		var details map[string]string
		if err := json.Unmarshal(ae.Details, &details); err != nil || !maps.Equal(details, map[string]string{"effect_id": "post",
			"approval_id": pending.ApprovalID, "rejected_by": "lead", "reason": "not this week"}) {
			t.Fatalf("details %s: %v", ae.Details, err)
		}
		// The approver's link is a bearer secret: never in an answer to the agent.
		if token := pending.ApproveURL[strings.LastIndex(pending.ApproveURL, "/")+1:]; strings.Contains(ae.Message+string(ae.Details), token) {
			t.Fatalf("effect_rejected carries the approval token: %s %s", ae.Message, ae.Details)
		}
		if _, err := e.c.Transition(ctx, "skip-1", client.TransitionRequest{LeaseOwner: cl.LeaseOwner, Version: cl.Version, To: "failed_retryable"}); err != nil {
			t.Fatal(err)
		}

		for range 2 { // a second start answers the same, and records the step once
			run, err = e.c.OpenRun(ctx, "skip-1", map[string]string{"k": "skip-1"}, opts)
			if err != nil {
				t.Fatal(err)
			}
			_, err = run.Step(ctx, "post", "post_update", "team", map[string]string{"text": "hello"}, mustNotPerform(t))
			var rej *client.RejectedError
			if !errors.As(err, &rej) || rej.Reason != "not this week" || rej.RejectedBy != "lead" || rej.EffectID != "post" ||
				rej.ApprovalID != pending.ApprovalID || !client.IsCode(err, "effect_rejected") {
				t.Fatalf("rejected step: %#v", err)
			}
			if run.Ledger.NextAllowedAction != "b" {
				t.Fatalf("next allowed action after the rejected step: %q", run.Ledger.NextAllowedAction)
			}
			run.Close()
		}
		run, err = e.c.OpenRun(ctx, "skip-1", map[string]string{"k": "skip-1"}, opts)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := run.Step(ctx, "b", "crm_note", "x", map[string]int{"n": 2}, perform("r-b")); err != nil {
			t.Fatal(err)
		}
		if _, err := run.Complete(ctx, nil); err != nil {
			t.Fatal(err)
		}
		l, _ := e.c.Ledger(ctx, "skip-1")
		var got []string
		for _, s := range l.Completed {
			got = append(got, s.Step+"="+s.Evidence)
		}
		if want := []string{"a=r-a", "post=rejected://" + pending.ApprovalID, "b=r-b"}; !slices.Equal(got, want) {
			t.Fatalf("ledger completed %v; want %v", got, want)
		}

		// A step that waits for the decision learns it the same way and goes on.
		c := e.deciding(t, approvals.Reject, "")
		run, err = c.OpenRun(ctx, "skip-2", map[string]string{"k": "2"}, client.RunOptions{Steps: []string{"post", "b"},
			LeaseSeconds: 5, WaitApproval: 20 * time.Second, Poll: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer run.Close()
		_, err = run.Step(ctx, "post", "post_update", "team", map[string]string{"text": "hi"}, mustNotPerform(t))
		var rej *client.RejectedError
		if !errors.As(err, &rej) || rej.Reason != "" || rej.RejectedBy != "lead" || rej.EffectID != "post" || rej.ApprovalID == "" {
			t.Fatalf("waiting step: %#v", err)
		}
		if res, err := run.Step(ctx, "b", "crm_note", "x", map[string]int{"n": 2}, perform("r-b2")); err != nil || res.Receipt != "r-b2" {
			t.Fatalf("the next step: %+v, %v", res, err)
		}
		if _, err := run.Complete(ctx, nil); err != nil {
			t.Fatal(err)
		}
	})
}

// TestStepsGatedWaitThenPerformOnce: three steps, the last gated and approved while the
// agent waits; replays answer from the record; the ledger holds each step once. On both stores.
func TestStepsGatedWaitThenPerformOnce(t *testing.T) {
	storetest.Each(t, func(t *testing.T, b storetest.Backend) {
		ctx, e := context.Background(), startSteps(t, b)
		c := e.deciding(t, approvals.Approve, "")
		var done []string
		do := func(_ context.Context, s client.StepCall) (string, error) {
			if s.IdempotencyKey != "steps/"+s.EffectID {
				t.Errorf("idempotency key %q", s.IdempotencyKey)
			}
			done = append(done, s.EffectID)
			return "r-" + s.EffectID, nil
		}
		run, err := c.OpenRun(ctx, "steps", map[string]string{"k": "s"}, client.RunOptions{Steps: []string{"a", "b", "share"},
			LeaseSeconds: 5, WaitApproval: 20 * time.Second, Poll: 100 * time.Millisecond})
		if err != nil || run.Ledger.NextAllowedAction != "a" {
			t.Fatalf("open: %+v, %v", run, err)
		}
		defer run.Close()
		for i, s := range []struct{ id, action string }{{"a", "create_doc"}, {"a", "create_doc"}, {"b", "crm_note"}} {
			res, err := run.Step(ctx, s.id, s.action, "x", map[string]int{"n": 1}, do)
			if err != nil || res.Replayed != (i == 1) {
				t.Fatalf("step %d: %+v, %v", i, res, err)
			}
		}
		before := run.LeaseOwner
		res, err := run.Step(ctx, "share", "share_doc", "team", map[string]int{"n": 3}, do)
		if err != nil || res.Receipt != "r-share" || res.Replayed || run.LeaseOwner == before {
			t.Fatalf("gated step: %+v, %v (owner %s → %s)", res, err, before, run.LeaseOwner)
		}
		if _, err := run.Complete(ctx, map[string]bool{"ok": true}); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(done, []string{"a", "b", "share"}) {
			t.Fatalf("performed %v", done)
		}
		l, _ := e.c.Ledger(ctx, "steps")
		var got []string
		for _, s := range l.Completed {
			got = append(got, s.Step+"="+s.Evidence)
		}
		if !slices.Equal(got, []string{"a=r-a", "b=r-b", "share=r-share"}) || len(l.Pending) != 0 || l.NextAllowedAction != client.Done {
			t.Fatalf("ledger: %+v", l)
		}
		again, err := e.c.OpenRun(ctx, "steps", map[string]string{"k": "s"}, client.RunOptions{})
		if err != nil || !again.Finished || string(again.Result) != `{"ok":true}` {
			t.Fatalf("open a completed run: %+v, %v", again, err)
		}
		var fin *client.RunFinishedError
		if _, err := again.Step(ctx, "a", "create_doc", "x", map[string]int{"n": 1}, do); !errors.As(err, &fin) {
			t.Fatalf("step on a finished run: %v", err)
		}
	})
}

// TestStepLookup: a step planned by a process that died is looked up: none found →
// performed, one → confirmed with it, several, undetermined or no lookup → a person.
func TestStepLookup(t *testing.T) {
	storetest.Each(t, func(t *testing.T, b storetest.Backend) {
		ctx, e := context.Background(), startSteps(t, b)
		for i, tc := range []struct {
			found   []string
			err     error
			noLook  bool
			receipt string
		}{{found: []string{}, receipt: "performed"}, {found: []string{"r-old"}, receipt: "r-old"},
			{found: []string{"x", "y"}}, {err: client.ErrUndetermined}, {noLook: true}} {
			key := fmt.Sprintf("lookup-%d", i)
			cl, err := e.c.Claim(ctx, client.ClaimRequest{Key: key, Payload: map[string]string{"k": key}, LeaseSeconds: 1})
			if err != nil {
				t.Fatal(err)
			}
			h, _ := client.HashInput(map[string]int{"n": 1})
			if p, err := e.c.Plan(ctx, key, "e", client.PlanRequest{LeaseOwner: cl.LeaseOwner, Action: "create_doc", Target: "docs", InputHash: h}); err != nil || !p.Execute {
				t.Fatalf("plan: %+v %v", p, err)
			}
			time.Sleep(1200 * time.Millisecond) // the process "died" after planning: its lease lapses
			run, err := e.c.OpenRun(ctx, key, map[string]string{"k": key}, client.RunOptions{LeaseSeconds: 5})
			if err != nil {
				t.Fatal(err)
			}
			var opts []client.StepOption
			if !tc.noLook {
				opts = append(opts, client.Lookup(func(context.Context, client.StepCall) ([]string, error) { return tc.found, tc.err }))
			}
			res, err := run.Step(ctx, "e", "create_doc", "docs", map[string]int{"n": 1}, perform("performed"), opts...)
			run.Close()
			var np *client.NeedsPersonError
			switch {
			case tc.receipt != "" && (err != nil || res.Receipt != tc.receipt):
				t.Fatalf("case %d: %+v, %v", i, res, err)
			case tc.receipt == "" && (!errors.As(err, &np) || np.EffectID != "e"):
				t.Fatalf("case %d: want NeedsPersonError, got %+v, %v", i, res, err)
			}
		}
	})
}

// TestStepStopsOnLeaseLoss: a run whose lease another process took cannot step, and its
// context says so.
func TestStepStopsOnLeaseLoss(t *testing.T) {
	storetest.Each(t, func(t *testing.T, b storetest.Backend) {
		ctx, e := context.Background(), startSteps(t, b)
		run, err := e.c.OpenRun(ctx, "lost", map[string]string{"k": "l"}, client.RunOptions{LeaseSeconds: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer run.Close()
		if err := e.c.Release(ctx, "lost", run.LeaseOwner, run.Version); err != nil {
			t.Fatal(err)
		}
		if cl, err := e.c.Claim(ctx, client.ClaimRequest{Key: "lost", Payload: map[string]string{"k": "l"}, LeaseSeconds: 30}); err != nil || !cl.Claimed {
			t.Fatalf("claim: %+v %v", cl, err)
		}
		_, err = run.Step(ctx, "e", "create_doc", "docs", map[string]int{"n": 1}, mustNotPerform(t))
		if !client.IsCode(err, "lease_lost") && !client.IsCode(err, "version_conflict") {
			t.Fatalf("step after the lease was taken: %v", err)
		}
		select {
		case <-run.Context().Done():
		case <-time.After(3 * time.Second):
			t.Fatal("the run's context is not cancelled after the lease was lost")
		}
	})
}

// TestOnboardKilledAtEveryBoundary: docs/agents.md's agent, SIGKILLed before perform,
// after perform and after confirm of each of its three steps, then started again until it
// completes: the provider holds exactly one record per step, the ledger each step once.
func TestOnboardKilledAtEveryBoundary(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the agent dozens of times")
	}
	storetest.Each(t, func(t *testing.T, b storetest.Backend) {
		ctx, e := context.Background(), startSteps(t, b)
		steps := []string{"draft", "crm", "share"}
		for _, step := range steps {
			for _, point := range []string{"before_perform", "after_perform", "after_confirm"} {
				base := t.TempDir()
				provider := filepath.Join(base, "provider")
				if err := os.Mkdir(provider, 0o700); err != nil {
					t.Fatal(err)
				}
				key := "onboard-" + step + "-" + point
				start := func(crash string) (*exec.Cmd, string, error) {
					cmd := exec.Command(os.Args[0], "-test.run=^$")
					cmd.Env = append(os.Environ(), "ONBOARD_CHILD=1", "AIRLOCK_URL="+e.srv.URL, "AIRLOCK_API_KEY="+e.srv.APIKey,
						"RUN_KEY="+key, "PROVIDER="+provider, "AGENT_CRASH_AT="+crash, "AGENT_CRASH_MARK="+filepath.Join(base, "crashed"))
					var stderr bytes.Buffer
					cmd.Stderr = &stderr
					err := cmd.Run()
					return cmd, stderr.String(), err
				}
				var outcomes []string
				link := regexp.MustCompile(`waiting for approval \S+: (\S+)`)
				for range 8 {
					cmd, stderr, err := start(point + ":" + step)
					if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
						outcomes = append(outcomes, "killed")
						continue
					}
					if m := link.FindStringSubmatch(stderr); m != nil {
						outcomes = append(outcomes, "pending")
						e.decide(t, m[1], approvals.Approve, "")
						continue
					}
					if err != nil {
						t.Fatalf("%s %s: %v: %s", step, point, err, stderr)
					}
					outcomes = append(outcomes, "completed")
					break
				}
				if outcomes[len(outcomes)-1] != "completed" || !slices.Contains(outcomes, "killed") {
					t.Fatalf("%s %s: %v", step, point, outcomes)
				}
				files, _ := os.ReadDir(provider)
				var effects []string
				for _, f := range files {
					var r struct{ Effect string }
					raw, _ := os.ReadFile(filepath.Join(provider, f.Name()))
					_ = json.Unmarshal(raw, &r)
					effects = append(effects, r.Effect)
				}
				slices.Sort(effects)
				if !slices.Equal(effects, []string{"crm", "draft", "share"}) {
					t.Fatalf("%s %s (%v): the provider holds %v", step, point, outcomes, effects)
				}
				l, _ := e.c.Ledger(ctx, key)
				var got []string
				for _, s := range l.Completed {
					got = append(got, s.Step)
				}
				run, _ := e.c.Run(ctx, key)
				if !slices.Equal(got, steps) || run.State != "completed" {
					t.Fatalf("%s %s: ledger %v, run %s", step, point, got, run.State)
				}
				if _, stderr, err := start(""); err != nil {
					t.Fatalf("a start after completion: %v: %s", err, stderr)
				}
				if files, _ := os.ReadDir(provider); len(files) != 3 {
					t.Fatalf("a start after completion performed again: %d records", len(files))
				}
			}
		}
	})
}

// TestDocsShowTheStepAgent: docs/agents.md shows the onboarding agent exactly as the crash
// test runs it.
func TestDocsShowTheStepAgent(t *testing.T) {
	src, err := os.ReadFile("onboard_test.go")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "agents.md"))
	if err != nil {
		t.Fatal(err)
	}
	fn := string(src[bytes.Index(src, []byte("func onboard(")):])
	fn = fn[:strings.Index(fn, "\n}\n")+3]
	if !strings.Contains(string(doc), "```go\n"+fn+"```") {
		t.Fatal("docs/agents.md does not show onboard (internal/clienttest/onboard_test.go) as it is")
	}
	if n := strings.Count(fn, "\n"); n >= 40 {
		t.Fatalf("the agent is %d lines; the step API promises under 40", n)
	}
}
