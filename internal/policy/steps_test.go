package policy

import (
	"strings"
	"testing"
	"time"
)

// TestApprovalStepsValidated: the expiry warning and the escalation default sensibly and
// are refused, each with its field and why, when they cannot happen as written.
func TestApprovalStepsValidated(t *testing.T) {
	p, err := Parse([]byte(`
actions:
  a: {connector: worker, approvers: {roles: [finance]}}
  b: {connector: worker, approvers: {roles: [finance]}, approval_ttl: 20m}
  c: {connector: worker, approvers: {roles: [finance]}, approval: {warn_before: 0s}}
  d: {connector: worker, approvers: {roles: [finance]}, approval_ttl: 4h, approval: {warn_before: 2h, escalate: {after: 1h, roles: [lead, cfo]}}}
`), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		action string
		warn   time.Duration
	}{{"a", time.Hour}, {"b", 5 * time.Minute}, {"c", 0}, {"d", 2 * time.Hour}} {
		if got := p.Action(tt.action).Approval.WarnBefore.D(); got != tt.warn {
			t.Errorf("%s: warn_before = %s, want %s", tt.action, got, tt.warn)
		}
	}
	if x := p.Action("d").Approval.Escalate; x == nil || x.After.D() != time.Hour || strings.Join(x.Roles, ",") != "lead,cfo" {
		t.Fatalf("escalate: %+v", x)
	}

	for _, tt := range []struct{ action, want string }{
		{`{connector: worker, approvers: {roles: [f]}, approval_ttl: 1h, approval: {warn_before: 1h}}`,
			"actions.t.approval.warn_before: must be shorter than approval_ttl (1h0m0s)"},
		{`{connector: worker, approvers: {roles: [f]}, approval: {escalate: {roles: [lead]}}}`,
			"actions.t.approval.escalate.after: must be more than 0s and shorter than approval_ttl (24h0m0s)"},
		{`{connector: worker, approvers: {roles: [f]}, approval_ttl: 1h, approval: {escalate: {after: 1h, roles: [lead]}}}`,
			"actions.t.approval.escalate.after: must be more than 0s"},
		{`{connector: worker, approvers: {roles: [f]}, approval: {escalate: {after: 1h}}}`,
			"actions.t.approval.escalate.roles: name at least one role"},
		{`{connector: worker, approvers: {roles: [f]}, approval: {escalate: {after: 1h, roles: ["a,b"]}}}`,
			`actions.t.approval.escalate.roles: "a,b" is not a role`},
		{`{connector: worker, approvers: {roles: [f]}, approval: {escalate: {after: 1h, roles: [f]}}}`,
			`actions.t.approval.escalate.roles: "f" already approves this type`},
		{`{connector: worker, gate: act_with_window, reversible: true, window: 1m, approvers: {roles: [f]}, approval: {escalate: {after: 1h, roles: [lead]}}}`,
			"actions.t.approval.escalate: gate act_with_window has no approval to escalate"},
		{`{connector: worker, approvers: {roles: [f]}, approval: {on_reject: ignore}}`,
			"actions.t.approval.on_reject: must be end_run or skip_effect"},
		{`{connector: worker, approvers: {roles: [f]}, approval: {warn_before: soon}}`,
			`"soon" is not a duration`},
		{`{connector: worker, approvers: {roles: [f]}, approval: {escalate: {after: 1h, roles: [lead], when: always}}}`,
			"when"},
	} {
		_, err := Parse([]byte("actions:\n  t: "+tt.action+"\n"), env(nil))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s:\n  got  %v\n  want %q", tt.action, err, tt.want)
		}
	}
}
