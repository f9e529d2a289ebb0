package clienttest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/airlocktest"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// gatedPolicy adds an agent-executed action type that needs a person's approval.
const gatedPolicy = airlocktest.AgentPolicy + `
  share_publicly:
    connector: worker
    approvers: {roles: [team-lead]}
`

func serve(t *testing.T, b storetest.Backend, policy string) *client.Client {
	t.Helper()
	return start(t, b, policy).c
}

func claim(t *testing.T, c *client.Client, key string) client.Claim {
	t.Helper()
	cl, err := c.Claim(context.Background(), client.ClaimRequest{Key: key, Payload: map[string]string{"k": key}, LeaseSeconds: 60})
	if err != nil || !cl.Claimed || cl.LeaseOwner == "" {
		t.Fatalf("claim %s: %+v, %v", key, cl, err)
	}
	return cl
}

func wantCode(t *testing.T, err error, status int, code string) *client.APIError {
	t.Helper()
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.Status != status || ae.Code != code || ae.Message == "" {
		t.Fatalf("got %v; want %d %s", err, status, code)
	}
	if !client.IsCode(fmt.Errorf("wrapped: %w", err), code) {
		t.Fatalf("IsCode does not see %s through wrapping", code)
	}
	return ae
}

func TestRunLifecycle(t *testing.T) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			c := serve(t, b, airlocktest.AgentPolicy)
			cl := claim(t, c, "run-1")

			dup, err := c.Claim(ctx, client.ClaimRequest{Key: "run-1", Payload: map[string]string{"k": "run-1"}})
			if err != nil || dup.Claimed || dup.State != client.StateProcessing || dup.LeaseOwner != "" {
				t.Fatalf("duplicate: %+v, %v", dup, err)
			}
			_, err = c.Claim(ctx, client.ClaimRequest{Key: "run-1", Payload: map[string]string{"k": "other"}})
			wantCode(t, err, 409, "payload_mismatch")

			lease, err := c.Heartbeat(ctx, "run-1", client.HeartbeatRequest{LeaseOwner: cl.LeaseOwner, Version: cl.Version, LeaseSeconds: 120})
			if err != nil || lease.Version != cl.Version || !lease.ExpiresAt.After(*cl.LeaseExpiresAt) {
				t.Fatalf("heartbeat: %+v, %v", lease, err)
			}
			_, err = c.Heartbeat(ctx, "run-1", client.HeartbeatRequest{LeaseOwner: "not-the-owner", Version: cl.Version})
			wantCode(t, err, 409, "lease_lost")

			q, err := c.QueueEffect(ctx, "run-1", client.QueueEffectRequest{LeaseOwner: cl.LeaseOwner, Version: cl.Version,
				ActionType: "create_internal_draft", Target: "internal-docs", Payload: map[string]string{"title": "t"}, EffectID: "draft-1"})
			if err != nil || !q.Created || q.Effect == nil || q.Effect.EffectID != "draft-1" || q.Approval != nil {
				t.Fatalf("queue effect: %+v, %v", q, err)
			}
			_, err = c.QueueEffect(ctx, "run-1", client.QueueEffectRequest{LeaseOwner: cl.LeaseOwner, Version: cl.Version,
				ActionType: "no_such_type", Target: "x", Payload: map[string]string{}})
			wantCode(t, err, 422, "unknown_action_type")

			run, err := c.Run(ctx, "run-1")
			if err != nil || run.State != client.StateProcessing || !run.Lease.Live || len(run.Effects) != 1 || run.Duplicates != 1 {
				t.Fatalf("run: %+v, %v", run, err)
			}
			// The queued worker effect is open: completion waits for it.
			_, err = c.Transition(ctx, "run-1", client.TransitionRequest{LeaseOwner: cl.LeaseOwner, Version: cl.Version, To: client.StateCompleted})
			wantCode(t, err, 409, "effects_open")
			tr, err := c.Transition(ctx, "run-1", client.TransitionRequest{LeaseOwner: cl.LeaseOwner, Version: cl.Version,
				To: client.StateFailedTerminal, Result: map[string]string{"why": "test"}})
			if err != nil || tr.State != client.StateFailedTerminal || tr.Version != cl.Version+1 {
				t.Fatalf("transition: %+v, %v", tr, err)
			}
			_, err = c.Run(ctx, "no-such-run")
			wantCode(t, err, 404, "run_not_found")

			evs, next, err := c.Events(ctx, "run-1", 0, 2)
			if err != nil || len(evs) != 2 || evs[0].Kind != "claimed" || next != evs[1].ID {
				t.Fatalf("events: %+v, next %d, %v", evs, next, err)
			}
		})
	}
}

func TestLedgerErrors(t *testing.T) {
	ctx := context.Background()
	c := serve(t, storetest.Backends[0], airlocktest.AgentPolicy)
	cl := claim(t, c, "run-2")

	_, err := c.Ledger(ctx, "run-2")
	wantCode(t, err, 404, "ledger_not_found")

	// A schema failure lists its pointers.
	_, err = c.SaveLedger(ctx, "run-2", cl.LeaseOwner, client.Ledger{NextAllowedAction: "a", CheckpointVersion: 1})
	ae := wantCode(t, err, 422, "invalid_ledger")
	if len(ae.Errors) == 0 || ae.Errors[0].Pointer == "" {
		t.Fatalf("invalid_ledger without pointers: %+v", ae.Errors)
	}
	_, err = c.SaveLedger(ctx, "run-2", "not-the-owner", client.Ledger{Goal: "g", NextAllowedAction: "a", CheckpointVersion: 1})
	wantCode(t, err, 409, "lease_lost")

	l := client.Ledger{Goal: "g", Pending: []string{"a"}, NextAllowedAction: "a", CheckpointVersion: 1}
	if cp, err := c.SaveLedger(ctx, "run-2", cl.LeaseOwner, l); err != nil || cp != 1 {
		t.Fatalf("save: %d, %v", cp, err)
	}

	hash, err := client.HashInput(map[string]string{"title": "t"})
	if err != nil {
		t.Fatal(err)
	}
	plan := client.PlanRequest{LeaseOwner: cl.LeaseOwner, Action: "create_internal_draft", Target: "internal-docs", InputHash: hash}
	if p, err := c.Plan(ctx, "run-2", "draft-1", plan); err != nil || !p.Execute {
		t.Fatalf("plan: %+v, %v", p, err)
	}
	_, err = c.Plan(ctx, "run-2", "draft-1", plan)
	wantCode(t, err, 409, "reconcile_first")
	if status, err := c.Reconcile(ctx, "run-2", "draft-1", cl.LeaseOwner, nil, false); err != nil || status != client.EffectCleared {
		t.Fatalf("reconcile of nothing found: %q, %v", status, err)
	}
	if p, err := c.Plan(ctx, "run-2", "draft-1", plan); err != nil || !p.Execute {
		t.Fatalf("plan after cleared: %+v, %v", p, err)
	}
	if err := c.Confirm(ctx, "run-2", "draft-1", cl.LeaseOwner, "doc://1"); err != nil {
		t.Fatal(err)
	}

	// A ledger read back carries its derived effects; saving it as is sends none.
	read, err := c.Ledger(ctx, "run-2")
	if err != nil || len(read.Effects) != 1 || read.Effects[0].Status != client.EffectConfirmed || read.Effects[0].InputHash != hash {
		t.Fatalf("ledger: %+v, %v", read, err)
	}
	read.CheckpointVersion++
	if cp, err := c.SaveLedger(ctx, "run-2", cl.LeaseOwner, read); err != nil || cp != 2 {
		t.Fatalf("save of a read ledger: %d, %v", cp, err)
	}

	// The same effect id with other input stops the run.
	other := plan
	other.InputHash, _ = client.HashInput(map[string]string{"title": "other"})
	_, err = c.Plan(ctx, "run-2", "draft-1", other)
	wantCode(t, err, 409, "input_mismatch")
	r, err := c.Resume(ctx, "run-2")
	if err != nil || r.Verdict != client.VerdictStop || len(r.Reasons) == 0 {
		t.Fatalf("resume after a mismatch: %+v, %v", r, err)
	}

	schema, err := c.LedgerSchema(ctx)
	if err != nil || len(schema) == 0 {
		t.Fatalf("schema: %s, %v", schema, err)
	}
}

func TestReconcileUndetermined(t *testing.T) {
	ctx := context.Background()
	c := serve(t, storetest.Backends[0], airlocktest.AgentPolicy)
	cl := claim(t, c, "run-3")
	if _, err := c.SaveLedger(ctx, "run-3", cl.LeaseOwner, client.Ledger{Goal: "g", NextAllowedAction: "a", CheckpointVersion: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Plan(ctx, "run-3", "e-1", client.PlanRequest{LeaseOwner: cl.LeaseOwner, Action: "create_internal_draft", Target: "t", InputHash: "h"}); err != nil {
		t.Fatal(err)
	}
	status, err := c.Reconcile(ctx, "run-3", "e-1", cl.LeaseOwner, nil, true)
	if err != nil || status != client.EffectUnknown {
		t.Fatalf("undetermined: %q, %v", status, err)
	}
	if r, err := c.Resume(ctx, "run-3"); err != nil || r.Verdict != client.VerdictStop {
		t.Fatalf("resume: %+v, %v", r, err)
	}
}

// A gated action type: plan answers with an approval and the run waits for a person.
func TestPlanNeedsApproval(t *testing.T) {
	ctx := context.Background()
	c := serve(t, storetest.Backends[0], gatedPolicy)
	cl := claim(t, c, "run-4")
	if _, err := c.SaveLedger(ctx, "run-4", cl.LeaseOwner, client.Ledger{Goal: "g", NextAllowedAction: "share", CheckpointVersion: 1}); err != nil {
		t.Fatal(err)
	}
	p, err := c.Plan(ctx, "run-4", "share-1", client.PlanRequest{LeaseOwner: cl.LeaseOwner, Action: "share_publicly", Target: "everyone", InputHash: "h"})
	if err != nil || p.Execute || p.Receipt != "" || p.Approval == nil || p.Approval.ID == "" || p.Approval.ApproveURL == "" || p.Approval.ExpiresAt.IsZero() {
		t.Fatalf("plan of a gated action: %+v, %v", p, err)
	}
	r, err := c.Resume(ctx, "run-4")
	if err != nil || r.Verdict != client.VerdictWait {
		t.Fatalf("resume: %+v, %v", r, err)
	}
	again, err := c.Claim(ctx, client.ClaimRequest{Key: "run-4", Payload: map[string]string{"k": "run-4"}})
	if err != nil || again.Claimed || again.State != client.StateAwaitingHuman {
		t.Fatalf("claim while waiting: %+v, %v", again, err)
	}
}

// An answer that is not airlock's (a proxy's error page) is still an *APIError, with the
// status and an excerpt of the body, and no code.
func TestForeignErrorBody(t *testing.T) {
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer k" {
			t.Errorf("Authorization: %q", r.Header.Get("Authorization"))
		}
		w.WriteHeader(http.StatusBadGateway)
		fmt.Fprint(w, "<html>bad gateway</html>")
	}))
	defer proxy.Close()
	_, err := client.New(proxy.URL+"/", "k").Resume(context.Background(), "run-5")
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.Status != 502 || ae.Code != "" || ae.Message != "<html>bad gateway</html>" {
		t.Fatalf("got %#v", err)
	}
}

func TestHashInputRefusesUnencodable(t *testing.T) {
	if _, err := client.HashInput(map[string]any{"f": func() {}}); err == nil {
		t.Fatal("a function hashed")
	}
}

// A client that gives up tells a person: Alert on a failed_terminal transition raises the
// alert workflow_gave_up with the reason; with any other state the server refuses it
// (invalid_field) and writes nothing; without Alert a failed_terminal stays silent.
func TestTransitionAlert(t *testing.T) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			c := serve(t, b, airlocktest.AgentPolicy)
			alerts := func(key string) []map[string]any {
				t.Helper()
				evs, _, err := c.Events(ctx, key, 0, 0)
				if err != nil {
					t.Fatal(err)
				}
				var out []map[string]any
				for _, e := range evs {
					if e.Kind == "alert" {
						var d map[string]any
						if err := json.Unmarshal(e.Detail, &d); err != nil {
							t.Fatal(err)
						}
						out = append(out, d)
					}
				}
				return out
			}

			cl := claim(t, c, "gave-up")
			for _, to := range []string{client.StateCompleted, client.StateFailedRetryable} {
				_, err := c.Transition(ctx, "gave-up", client.TransitionRequest{LeaseOwner: cl.LeaseOwner, Version: cl.Version, To: to, Alert: "no"})
				wantCode(t, err, 400, "invalid_field")
			}
			if got := alerts("gave-up"); len(got) != 0 {
				t.Fatalf("a refused transition wrote alerts: %v", got)
			}
			tr, err := c.Transition(ctx, "gave-up", client.TransitionRequest{LeaseOwner: cl.LeaseOwner, Version: cl.Version,
				To: client.StateFailedTerminal, Result: map[string]string{"reason": "invalid_model_output"}, Alert: "invalid model output after 2 repairs"})
			if err != nil || tr.State != client.StateFailedTerminal {
				t.Fatalf("transition: %+v, %v", tr, err)
			}
			if got := alerts("gave-up"); len(got) != 1 || got[0]["alert"] != "workflow_gave_up" || got[0]["reason"] != "invalid model output after 2 repairs" {
				t.Fatalf("alerts = %v, want one workflow_gave_up with the reason", got)
			}

			q := claim(t, c, "quiet")
			if _, err := c.Transition(ctx, "quiet", client.TransitionRequest{LeaseOwner: q.LeaseOwner, Version: q.Version, To: client.StateFailedTerminal}); err != nil {
				t.Fatal(err)
			}
			if got := alerts("quiet"); len(got) != 0 {
				t.Fatalf("alerts of a silent failed_terminal = %v, want none", got)
			}
		})
	}
}
