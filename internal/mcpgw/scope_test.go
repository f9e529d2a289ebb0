package mcpgw_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/mcpgw"
	"github.com/airlockhq/airlock/internal/store"
)

func (e *env) reject(token, reason string) {
	e.t.Helper()
	if _, err := e.srv.Approvals.Decide(context.Background(), approvals.HashToken(token), approvals.Reject, reason,
		approvals.Person{Subject: "lead", Roles: []string{"lead"}}); err != nil {
		e.t.Fatal(err)
	}
}

// The default (approval.on_reject: end_run): a reject ends the run, and the model is told
// who rejected it and why on its next call, whatever that call is.
func TestRejectEndsTheRunAndSaysWhoAndWhy(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e.startAgent()
		args := map[string]any{"to": "ana@example.com", "text": "hi"}
		e.reject(approvalToken(t, e.mustRefuse("send_mail", args, "approval_pending")), "not to customers before Monday")
		for _, tool := range []string{"send_mail", "write_note"} {
			got := text(e.mustRefuse(tool, map[string]any{"to": "ana@example.com", "text": "hi"}, "run_finished"))
			if !strings.Contains(got, "rejected by lead") || !strings.Contains(got, `"not to customers before Monday"`) {
				t.Errorf("%s after a reject: the model is not told who rejected it and why: %q", tool, got)
			}
		}
		if n := e.up.count("send_mail") + e.up.count("write_note"); n != 0 {
			t.Errorf("the upstream was called %d times in a rejected run", n)
		}
	})
}

// approval.on_reject: skip_effect: only the rejected effect is refused (effect_rejected,
// with who and why, on every later call of it); the task goes on with its other effects,
// and another input of the same tool is another effect with its own approval.
func TestRejectSkipsOnlyThatEffect(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e.startAgent()
		args := map[string]any{"id": "n1"}
		e.reject(approvalToken(t, e.mustRefuse("delete_note", args, "approval_pending")), "")
		for range 2 {
			got := text(e.mustRefuse("delete_note", args, "effect_rejected"))
			if !strings.Contains(got, "rejected by lead") || !strings.Contains(got, "no reason given") {
				t.Errorf("the rejected effect's refusal does not say who and why: %q", got)
			}
		}
		e.mustOK("write_note", map[string]any{"text": "went on without the delete"})
		token := approvalToken(t, e.mustRefuse("delete_note", map[string]any{"id": "n2"}, "approval_pending"))
		if _, err := e.srv.Approvals.Decide(context.Background(), approvals.HashToken(token), approvals.Approve, "",
			approvals.Person{Subject: "lead", Roles: []string{"lead"}}); err != nil {
			t.Fatal(err)
		}
		e.mustOK("delete_note", map[string]any{"id": "n2"})
		if n := e.up.count("delete_note"); n != 1 {
			t.Errorf("delete_note reached the upstream %d times, want 1 (the approved one)", n)
		}
		ds := strings.Join(e.decisions(), " ")
		if !strings.Contains(ds, "delete_note:effect_rejected") || !strings.Contains(ds, "write_note:executed") {
			t.Errorf("decisions: %s", ds)
		}
	})
}

// An effect whose outcome became unknown keeps what the call was — the tool and its
// arguments — in its record until a person resolves it, and the alert says what to check
// where; once resolved as sent, a replay still never passes the arguments off as a result.
func TestUnknownEffectKeepsItsArguments(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e.hook = func(p string) error {
			if p == "mcp_after_upstream" {
				return errCrash
			}
			return nil
		}
		e.startAgent()
		args := map[string]any{"text": "to Ana: the refund of order 7 is on its way"}
		_, _ = e.call("write_note", args)
		e.hook = nil
		e.restartAgent()
		got := text(e.mustRefuse("write_note", args, "reconcile_first"))
		if !strings.Contains(got, "checks upstream notes for what write_note") {
			t.Errorf("the refusal does not say what to check where: %q", got)
		}
		eff, err := e.st.EffectByRunEffectID(context.Background(), "agent-run-1", effectID(t, e.pol, "write_note", args))
		if err != nil {
			t.Fatal(err)
		}
		if eff.State != store.EffectUnknown {
			t.Fatalf("effect %s, want unknown", eff.State)
		}
		var in struct {
			Tool      string
			Arguments map[string]any
		}
		if err := json.Unmarshal(eff.Payload, &in); err != nil || in.Tool != "write_note" || in.Arguments["text"] != args["text"] {
			t.Fatalf("the unknown effect's record does not hold the call: %s (%v)", eff.Payload, err)
		}
		evs, err := e.st.EventList(context.Background(), "agent-run-1", 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		var alert string
		for _, ev := range evs {
			if ev.Kind == string(store.EventAlert) && strings.Contains(string(ev.Detail), "agent_effect_unknown") {
				alert = string(ev.Detail)
			}
			if strings.Contains(string(ev.Detail), "refund of order 7") {
				t.Errorf("an event carries the arguments: %s %s", ev.Kind, ev.Detail)
			}
		}
		if !strings.Contains(alert, "look at notes") || !strings.Contains(alert, "tool and its arguments") {
			t.Errorf("the alert does not say what to check: %s", alert)
		}
		op := client.New(e.srv.URL, operatorKey(t, e))
		if err := post(op, "/v1/effects/"+eff.ID+"/resolve", `{"outcome":"sent","no_provider_id":true,"note":"it is there"}`); err != nil {
			t.Fatal(err)
		}
		r := e.mustOK("write_note", args)
		if m, _ := r.Meta[mcpgw.ReplayedMeta].(map[string]any); m["result_recorded"] != false || strings.Contains(text(r), "refund of order 7") {
			t.Errorf("the replay passes the input off as a result: %q %v", text(r), r.Meta)
		}
	})
}

// A resource a tool creates at run time is read back through the gateway by the link the
// tool returned (also when the call is answered from the ledger, after a restart); a URI
// no tool linked to and no upstream listed stays unknown.
func TestResourceCreatedAtRunTimeIsReadByItsLink(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e.startAgent()
		ctx := context.Background()
		link := func(r *mcp.CallToolResult) string {
			for _, c := range r.Content {
				if l, ok := c.(*mcp.ResourceLink); ok {
					return l.URI
				}
			}
			t.Fatalf("no resource link in %q", text(r))
			return ""
		}
		uri := link(e.mustOK("write_report", map[string]any{"name": "q3"}))
		r, err := e.agent.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
		if err != nil {
			t.Fatalf("read %s: %v", uri, err)
		}
		if len(r.Contents) != 1 || r.Contents[0].Text != "the report "+uri {
			t.Errorf("read %s: %+v", uri, r.Contents)
		}
		if _, err := e.agent.ReadResource(ctx, &mcp.ReadResourceParams{URI: "notes://report/never-linked"}); err == nil {
			t.Error("a URI no tool linked to was read")
		}
		e.restartAgent()
		if again := link(e.mustOK("write_report", map[string]any{"name": "q3"})); again != uri {
			t.Fatalf("replayed link %q, want %q", again, uri)
		}
		if _, err := e.agent.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri}); err != nil {
			t.Errorf("read %s after a restart, by the replayed link: %v", uri, err)
		}
		if n := e.up.count("write_report"); n != 1 {
			t.Errorf("write_report performed %d times", n)
		}
		if got := strings.Join(e.decisions(), ","); !strings.Contains(got, "resources/read:passed") {
			t.Errorf("the read is not on the run: %s", got)
		}
	})
}
