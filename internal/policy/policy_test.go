package policy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/connector/httpconn"
	"github.com/airlockhq/airlock/internal/connector/smtpconn"
)

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

const good = `
public_url: https://airlock.example.com
actions:
  crm_note:
    connector: http
    gate: none
    http:
      url: https://crm.internal/api/notes
      idempotent: true
      token_env: CRM_TOKEN
      timeout: 5s
      lookup_url: "https://crm.internal/api/notes?idempotency_key={effect_id}"
  customer_email:
    connector: smtp
    smtp: {host: smtp.example.com, port: 587, from: support@example.com, username: bot, password_env: SMTP_PASSWORD}
    approvers: {roles: [support-lead]}
  slack_digest:
    connector: worker
    gate: none
dispatch: {interval: 200ms, batch_size: 32}
`

func TestParseGood(t *testing.T) {
	p, err := Parse([]byte(good), env(map[string]string{"CRM_TOKEN": "tok", "SMTP_PASSWORD": "pw"}))
	if err != nil {
		t.Fatal(err)
	}
	crm := p.Action("crm_note")
	if httpOf(crm).Token != "tok" || httpOf(crm).Targets["default"] != "https://crm.internal/api/notes" || crm.Gate != GateNone {
		t.Fatalf("crm_note: %+v %+v", crm, httpOf(crm))
	}
	mail := p.Action("customer_email")
	if mail.Gate != GateApproveBeforeAct || smtpOf(mail).TLS != "starttls" || smtpOf(mail).Password != "pw" {
		t.Fatalf("customer_email defaults: %+v %+v", mail, smtpOf(mail))
	}
	if mail.Retry.MaxAttempts != 5 || p.Dispatch.Interval.D() != 200*time.Millisecond || p.Dispatch.Lease.D() != 2*time.Minute {
		t.Fatalf("defaults: %+v %+v", mail.Retry, p.Dispatch)
	}
	if !crm.ValidTarget("default") || crm.ValidTarget("https://evil.example/") {
		t.Fatal("http targets must be configured names")
	}
	if p.Action("slack_digest").Executor() != "worker" || crm.Executor() != "dispatcher" {
		t.Fatal("executors")
	}
	if p.Action("wire_money") != nil {
		t.Fatal("action types are closed")
	}
}

func TestErrorsNameTheField(t *testing.T) {
	for _, c := range []struct{ doc, want string }{
		{`actions: {a: {connector: fax}}`, "actions.a.connector"},
		{`actions: {a: {}}`, "actions.a.connector: required"},
		{`actions: {a: {connector: http}}`, "actions.a.http: required"},
		{`actions: {a: {connector: http, http: {url: "ftp://x"}}}`, "actions.a.http.targets.default"},
		{`actions: {a: {connector: http, http: {url: "https://u:p@x/"}}}`, "without credentials"},
		{`actions: {a: {connector: http, http: {url: "https://x/", token_env: NOPE}}}`, "actions.a.http.token_env: environment variable NOPE is not set"},
		{`actions: {a: {connector: http, http: {url: "https://x/", lookup_url: "https://x/q"}}}`, "actions.a.http.lookup_url: must contain {effect_id}"},
		{`actions: {a: {connector: http, http: {url: "https://x/", lookup_authoritative: true}}}`, "needs a lookup_url"},
		{`actions: {a: {connector: http, gate: maybe, http: {url: "https://x/"}}}`, "actions.a.gate"},
		{`actions: {a: {connector: worker}}`, "actions.a.approvers: a gated action type"},
		{`actions: {a: {connector: worker, gate: act_with_window, approvers: {roles: [x]}}}`, "actions.a.reversible"},
		{`actions: {a: {connector: worker, approvers: {roles: [x]}, approval_ttl: 1s}}`, "actions.a.approval_ttl"},
		{`actions: {a: {connector: worker, http: {url: "https://x/"}}}`, "actions.a.http: given, but the connector is \"worker\""},
		{`actions: {a: {connector: smtp, smtp: {host: h, port: 0, from: nope}}}`, "actions.a.smtp.port"},
		{`actions: {a: {connector: smtp, smtp: {host: h, port: 25, from: nope}}}`, "actions.a.smtp.from"},
		{`actions: {a: {connector: smtp, smtp: {host: h, port: 25, from: a@b.c, tls: maybe}}}`, "actions.a.smtp.tls"},
		{`actions: {Bad-Name: {connector: worker, gate: none}}`, "actions.Bad-Name"},
		{`actions: {a: {connector: worker, retry: {max_attempts: 0, backoff: 10s, max_backoff: 1s}}}`, "actions.a.retry.max_backoff"},
		{`actions: {a: {connector: worker, colour: red}}`, "actions.a.colour: unknown field"},
		{`actions: {a: {connector: worker, retry: {backoff: soon}}}`, "not a duration"},
		{`public_url: "not a url"`, "public_url"},
		{`dispatch: {batch_size: 5000}`, "dispatch.batch_size"},
		{`retry: {gremlins: {retry: transport, max_attempts: 2}}`, "retry.gremlins: unknown failure class"},
		{`retry: {unknown_commit: {retry: transport, max_attempts: 2}}`, "retry.unknown_commit.retry: must be never"},
		{`retry: {partial_success: {retry: business, max_attempts: 2}}`, "retry.partial_success.retry: must be write or never"},
		{`retry: {server_error: {retry: transport, max_attempts: 0}}`, "retry.server_error.max_attempts"},
		{`retry: {server_error: {retry: sometimes, max_attempts: 2}}`, "retry.server_error.retry"},
		{`actions: {a: {connector: worker, schema: {type: 5}}}`, "actions.a.schema: schema actions.a.schema: not a valid JSON Schema"},
		{`actions: {a: {connector: worker, schema: /nonexistent/s.json}}`, "actions.a.schema"},
		{`actions: {a: {connector: worker, schema: [1, 2]}}`, "a schema is a file path or an inline mapping"},
		{`input_schemas: {zendesk: {type: object, properties: {a: {type: nope}}}}`, "input_schemas.zendesk"},
		{`validation: {max_repairs: -1}`, "validation.max_repairs"},
		{`actions: {t: {connector: worker, gate: approve_by_exception, reversible: true, approvers: {roles: [x]}, schema: {type: object}, evidence_sources: [c], rule: "output.label =="}}`, "actions.t.rule"},
		{`actions: {t: {connector: worker, gate: approve_by_exception, reversible: true, approvers: {roles: [x]}, schema: {type: object}, evidence_sources: [c], rule: "1 + 1"}}`, "must be a boolean expression"},
		{`actions: {t: {connector: worker, gate: approve_by_exception, reversible: true, approvers: {roles: [x]}, schema: {type: object}, rule: "true"}}`, "actions.t.evidence_sources"},
		{`actions: {t: {connector: worker, gate: approve_by_exception, reversible: true, approvers: {roles: [x]}, evidence_sources: [c], rule: "true"}}`, "actions.t.schema"},
		{`actions: {t: {connector: worker, gate: none, sample_rate: 2}}`, "actions.t.sample_rate"},
		{`budgets: {max_model_calls: -1}`, "budgets.max_model_calls"},
		// A send may not outlive its lease (it could be taken for crashed while in flight).
		{`actions: {a: {connector: http, gate: none, http: {url: "https://x/", timeout: 2m}}}`, "actions.a.timeout: 2m0s must be shorter than dispatch.lease"},
		{`dispatch: {lease: 5s}
actions: {a: {connector: http, gate: none, http: {url: "https://x/"}}}`, "actions.a.timeout: 10s must be shorter than dispatch.lease (5s)"},
		{`dispatch: {concurrency: 2000}`, "dispatch.concurrency"},
		{`dispatch: {drain: 1h}`, "dispatch.drain"},
		{`actions: {a: {connector: worker, gate: none, max_in_flight: 64}}`, "actions.a.max_in_flight: must be from 1 to dispatch.concurrency (32)"},
		{`actions: {a: {connector: worker, gate: none, rate: -1}}`, "actions.a.rate"},
	} {
		_, err := Parse([]byte(c.doc), env(nil))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s:\n  err = %v\n  want it to contain %q", c.doc, err, c.want)
		}
	}
}

func TestSecretsFromFileNeverInErrors(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "token")
	if err := os.WriteFile(f, []byte("s3cret-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := Parse([]byte(`actions: {a: {connector: http, gate: none, http: {url: "https://x/", token_file: `+f+`}}}`), env(nil))
	if err != nil || httpOf(p.Action("a")).Token != "s3cret-token" {
		t.Fatalf("token file: %v", err)
	}
	_, err = Parse([]byte(`actions: {a: {connector: http, http: {url: "https://x/", token_env: T, timeout: 1h}}}`), env(map[string]string{"T": "s3cret-token"}))
	if err == nil || strings.Contains(err.Error(), "s3cret-token") {
		t.Fatalf("err = %v", err)
	}
}

func TestEmptyRefusesEverything(t *testing.T) {
	if len(Empty().Actions) != 0 || Empty().Dispatch.BatchSize == 0 {
		t.Fatal("empty policy")
	}
}

func TestRetryTableDefaultsAndOverrides(t *testing.T) {
	p, err := Parse([]byte(`retry: {server_error: {retry: business, max_attempts: 2, backoff: 1s, max_backoff: 2s}}`), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if r := p.Retry[ClassServerError]; r.Retry != RetryBusiness || r.MaxAttempts != 2 {
		t.Fatalf("override: %+v", r)
	}
	for _, c := range Classes {
		if p.Retry[c] == nil {
			t.Errorf("no default for %s", c)
		}
	}
	if p.Retry[ClassUnknownCommit].Retry != RetryNever || p.Retry[ClassPartialSuccess].Retry != RetryWrite {
		t.Fatal("fixed classes")
	}
	if p.BudgetsFor("").MaxModelCalls != 50 || *p.Validation.MaxRepairs != 2 {
		t.Fatal("budget and repair defaults")
	}
}

func TestSchemaFileRelativeToPolicy(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "reply.json"), []byte(`{"type":"object","required":["text"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	pf := filepath.Join(dir, "airlock.yaml")
	if err := os.WriteFile(pf, []byte("actions: {reply: {connector: worker, gate: none, schema: reply.json}}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := Load(pf, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if errs := p.Action("reply").Schema.Compiled.Validate(map[string]any{}); len(errs) != 1 || errs[0].Keyword != "required" {
		t.Fatalf("schema from file: %v", errs)
	}
}

func TestBackoff(t *testing.T) {
	base, limit := Duration(time.Second), Duration(8*time.Second)
	for attempts, max := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 4: 8 * time.Second, 9: 8 * time.Second} {
		for range 50 {
			d := Backoff(base, limit, attempts, 0)
			if d < max/2 || d > max {
				t.Fatalf("attempt %d: %s outside [%s, %s]", attempts, d, max/2, max)
			}
		}
	}
	if d := Backoff(base, limit, 1, time.Minute); d != time.Minute {
		t.Fatalf("Retry-After: %s", d)
	}
}

// An SMTP target is the recipient: one bare address, and a payload may only repeat it.
func TestSMTPTargetIsTheRecipient(t *testing.T) {
	p, err := Parse([]byte(good), env(map[string]string{"CRM_TOKEN": "tok", "SMTP_PASSWORD": "pw"}))
	if err != nil {
		t.Fatal(err)
	}
	a := p.Action("customer_email")
	for target, ok := range map[string]bool{"alice@example.com": true, "alice@example.com, eve@example.net": false,
		"Alice <alice@example.com>": false, "alice": false, "": false} {
		if a.ValidTarget(target) != ok {
			t.Errorf("ValidTarget(%q) = %v", target, !ok)
		}
	}
	for payload, ok := range map[string]bool{
		`{"subject":"s","text":"t"}`:                                      true,
		`{"to":"alice@EXAMPLE.com","subject":"s","text":"t"}`:             true,
		`{"to":["alice@example.com"],"subject":"s","text":"t"}`:           true,
		`{"to":"mallory@example.net","subject":"s","text":"t"}`:           false,
		`{"to":["alice@example.com","eve@example.net"],"subject":"s"}`:    false,
		`{"to":"Alice@example.com","subject":"s","text":"t"}`:             false, // the local part is case-sensitive
		`{"to":[],"subject":"s","text":"t"}`:                              false,
		`{"to":"Alice <alice@example.com>","subject":"s","text":"t"}`:     false,
		`{"to":{"address":"alice@example.com"},"subject":"s","text":"t"}`: false,
	} {
		if err := a.CheckRecipients("alice@example.com", []byte(payload)); (err == nil) != ok {
			t.Errorf("CheckRecipients(%s) = %v", payload, err)
		}
	}
	if got := a.Recipients("alice@example.com"); len(got) != 1 || got[0] != "alice@example.com" {
		t.Errorf("Recipients = %v", got)
	}
	smtpOf(a).Targets = map[string]string{"alice": "Alice <alice@example.com>"}
	if got := a.Recipients("alice"); len(got) != 1 || got[0] != "alice@example.com" {
		t.Errorf("Recipients with targets = %v", got)
	}
	if err := a.CheckRecipients("alice", []byte(`{"to":"alice@example.com","subject":"s","text":"t"}`)); err == nil {
		t.Error("a payload named a recipient fixed by smtp.targets")
	}
	if p.Action("crm_note").Recipients("default") != nil {
		t.Error("recipients for an http action")
	}
}

// max_in_flight defaults to every slot for a lone sent type and half of them beside others.
func TestMaxInFlightDefaults(t *testing.T) {
	one, err := Parse([]byte(`actions: {a: {connector: http, gate: none, http: {url: "https://x/"}}, w: {connector: worker, gate: none}}`), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if got := one.Action("a").MaxInFlight; got != 32 {
		t.Fatalf("lone type: max_in_flight %d, want 32", got)
	}
	two, err := Parse([]byte(`dispatch: {concurrency: 10}
actions: {a: {connector: http, gate: none, http: {url: "https://x/"}}, b: {connector: http, gate: none, http: {url: "https://y/"}, max_in_flight: 9}}`), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if a, b := two.Action("a").MaxInFlight, two.Action("b").MaxInFlight; a != 5 || b != 9 {
		t.Fatalf("two types: max_in_flight %d and %d, want 5 (default) and 9 (given)", a, b)
	}
}

// TestExplicitZerosAreRangeErrors: a default fills a field that is left out; one given
// as 0 is judged by its documented range, never silently replaced.
func TestExplicitZerosAreRangeErrors(t *testing.T) {
	for _, c := range []struct{ doc, want string }{
		{`dispatch: {batch_size: 0}`, "dispatch.batch_size: must be from 1 to 1000"},
		{`dispatch: {lease: 0s}`, "dispatch.lease: must be at least 1s"},
		{`dispatch: {interval: 0s}`, "dispatch.interval"},
		{`dispatch: {concurrency: 0}`, "dispatch.concurrency"},
		{`retention: {payloads: 0s}`, "retention.payloads"},
		{`retention: {interval: 0s}`, "retention.interval"},
		{`actions: {a: {connector: worker, gate: none, retry: {max_attempts: 0}}}`, "actions.a.retry.max_attempts: must be from 1 to 100"},
		{`actions: {a: {connector: worker, gate: none, max_in_flight: 0}}`, "actions.a.max_in_flight"},
		{`actions: {a: {connector: worker, approvers: {roles: [x]}, approval_ttl: 0s}}`, "actions.a.approval_ttl"},
		{`actions: {a: {connector: http, gate: none, http: {url: "https://x/", timeout: 0s}}}`, "actions.a.http.timeout"},
	} {
		_, err := Parse([]byte(c.doc), env(nil))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s:\n  err = %v\n  want it to contain %q", c.doc, err, c.want)
		}
	}
	// Left out, the defaults apply; an explicit 0 where 0 is in range stays 0.
	p, err := Parse([]byte("dispatch: {drain: 0s}\nbudgets: {max_model_calls: 0}\nactions: {a: {connector: worker, gate: none}}\n"), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if p.Dispatch.BatchSize != 32 || p.Dispatch.Lease.D() != 2*time.Minute || p.Actions["a"].Retry.MaxAttempts != 5 {
		t.Fatalf("defaults: batch %d, lease %s, attempts %d", p.Dispatch.BatchSize, p.Dispatch.Lease.D(), p.Actions["a"].Retry.MaxAttempts)
	}
	if p.Dispatch.Drain != 0 || p.Budgets.MaxModelCalls != 0 {
		t.Fatalf("explicit zeros in range: drain %s, max_model_calls %d (0 = unlimited)", p.Dispatch.Drain.D(), p.Budgets.MaxModelCalls)
	}
}

// A typo or an empty file is reported by its YAML path, never by a Go type or "EOF".
func TestPolicyErrorsNameTheYAMLPath(t *testing.T) {
	for _, c := range []struct{ doc, want string }{
		{"actions:\n  crm_note:\n    connector: http\n    http: {url: 'https://x/', idempotant: true}\n",
			"actions.crm_note.http.idempotant: unknown field; did you mean idempotent?"},
		{"actions:\n  crm_note:\n    conector: http\n", "actions.crm_note.conector: unknown field; did you mean connector?"},
		{"dispatch: {batchsize: 3}\n", "dispatch.batchsize: unknown field; did you mean batch_size?"},
		{"retry:\n  transport: {retry: transport, max_attempts: 2, wobble: 1}\n", "retry.transport.wobble: unknown field"},
		{"public_ur1: https://x\n", "public_ur1: unknown field; did you mean public_url?"},
		{"", "the policy file is empty"},
		{"# only a comment\n", "the policy file is empty"},
	} {
		_, err := Parse([]byte(c.doc), func(string) (string, bool) { return "", false })
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v; want %q", c.doc, err, c.want)
			continue
		}
		for _, bad := range []string{"policy.", "not found in type", "EOF"} {
			if strings.Contains(err.Error(), bad) {
				t.Errorf("%q: %v mentions %q", c.doc, err, bad)
			}
		}
	}
}

func TestMCPSectionErrorsNameTheField(t *testing.T) {
	const acts = "actions: {w: {connector: worker, gate: none}, h: {connector: http, gate: none, http: {url: \"https://x/\"}}, t: {connector: worker, gate: none, worker: {targets: [other]}}}\n"
	for _, c := range []struct{ doc, want string }{
		{`mcp: {upstreams: {}}`, "mcp.upstreams: name at least one"},
		{`mcp: {upstreams: {fs: {tools: {a: read}}}}`, "mcp.upstreams.fs: give command"},
		{`mcp: {upstreams: {fs: {command: x, url: "https://x/", tools: {a: read}}}}`, "mcp.upstreams.fs: give command or url, not both"},
		{`mcp: {upstreams: {fs: {url: "ftp://x/", tools: {a: read}}}}`, "mcp.upstreams.fs.url"},
		{`mcp: {upstreams: {fs: {command: x}}}`, "mcp.upstreams.fs.tools: classify at least one"},
		{`mcp: {upstreams: {fs: {command: x, env: {AIRLOCK_API_KEY: k}, tools: {a: read}}}}`, "mcp.upstreams.fs.env.AIRLOCK_API_KEY"},
		{`mcp: {upstreams: {fs: {command: x, tools: {a: write}}}}`, `a tool's class is "read" or a mapping`},
		{`mcp: {upstreams: {fs: {command: x, tools: {a: {effect: w, colour: red}}}}}`, "mcp.upstreams.fs.tools.a.colour: unknown field"},
		{acts + `mcp: {upstreams: {fs: {command: x, tools: {a: {effect: nope}}}}}`, "mcp.upstreams.fs.tools.a.effect: unknown action type"},
		{acts + `mcp: {upstreams: {fs: {command: x, tools: {a: {effect: h}}}}}`, "must have connector: worker"},
		{acts + `mcp: {upstreams: {fs: {command: x, tools: {a: {effect: t}}}}}`, "add the upstream's name \"fs\""},
		{acts + `mcp: {upstreams: {fs: {command: x, tools: {a: {effect: w, lookup: {tool: a}}}}}}`, "mcp.upstreams.fs.tools.a.lookup.tool: must be a tool of the same upstream classified read"},
		{acts + `mcp: {upstreams: {fs: {command: x, tools: {a: {effect: w, effect_id_argument: "a b"}}}}}`, "mcp.upstreams.fs.tools.a.effect_id_argument"},
		{acts + `mcp: {upstreams: {fs: {command: x, tools: {a: read}}, gh: {command: y, tools: {a: read}}}}`, "mcp.upstreams.gh.tools.a: also classified under upstream fs"},
	} {
		_, err := Parse([]byte(c.doc), env(nil))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s:\n  err = %v\n  want it to contain %q", c.doc, err, c.want)
		}
	}
	p, err := Parse([]byte(acts+`mcp: {upstreams: {fs: {command: x, args: [a], tools: {r: read, a: {effect: w, lookup: {tool: r, items: /results}}}}}}`), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if u := p.MCP.Upstreams["fs"]; !u.Tools["r"].Read || u.Tools["a"].Effect != "w" || u.Tools["a"].Lookup.Items != "/results" {
		t.Errorf("parsed %+v", u)
	}
}

// httpOf and smtpOf are an action type's connector section, as its kind decoded it.
func httpOf(a *Action) *httpconn.Section { return a.Section.(*httpconn.Section) }
func smtpOf(a *Action) *smtpconn.Section { return a.Section.(*smtpconn.Section) }
