package policy

import (
	"strings"
	"testing"
)

// TestValidateReportsEveryProblemInOrder holds policy validation's whole answer to a
// document wrong in every way validate checks itself: each message, its field path, and
// their order (top-level sections first, then each action type by name, each check in
// its place), so that splitting validate into a function per section and per action
// kind changes none of them.
func TestValidateReportsEveryProblemInOrder(t *testing.T) {
	doc := `
public_url: "not a url"
notify: {webhook_url_env: HOOK}
retry:
  gremlins: {retry: transport, max_attempts: 2}
  client_error: null
  unknown_commit: {retry: transport, max_attempts: 2}
  partial_success: {retry: business, max_attempts: 2}
  server_error: {retry: transport, max_attempts: 0, backoff: 10s, max_backoff: 1s}
retention: {payloads: 1m, events: 30s, interval: 1s}
validation: {max_repairs: 21}
budgets: {max_model_calls: -1}
input_schemas: {empty: null, zendesk: {type: nope}}
dispatch: {batch_size: 5000, lease: 0s, interval: 1ms, concurrency: 2000, drain: 1h}
actions:
  Bad-Name:
    connector: worker
    gate: maybe
    retry: {max_attempts: 0, backoff: 10s, max_backoff: 1s}
    max_in_flight: 5000
    rate: -1
    sample_rate: 2
    approval_ttl: 1s
    http: {url: "https://x/"}
  w: {connector: worker, gate: act_with_window, window: 1s}
  x: {connector: http, gate: approve_by_exception}
  x2: {connector: worker, gate: approve_by_exception, reversible: true, approvers: {roles: [r]}, evidence_sources: [c], rule: "1 + 1", schema: {type: 5}}
  y: {connector: smtp, budgets: {max_model_calls: -1}}
  z: {connector: fax, gate: none}
  v: {gate: none}
  u: {connector: http, gate: none, http: {url: "https://x/", timeout: 2m}}
`
	_, err := Parse([]byte(doc), env(map[string]string{"HOOK": "ftp://x"}))
	if err == nil {
		t.Fatal("accepted")
	}
	want := `
public_url: must be an absolute http(s) URL
retry.client_error: empty
retry.gremlins: unknown failure class (valid: transport_timeout, rate_limited, server_error, client_error, parse_failure, soft_failure, partial_success, unknown_commit)
retry.partial_success.retry: must be write or never for partial_success
retry.server_error.max_attempts: must be from 1 to 100
retry.server_error.max_backoff: must not be shorter than backoff
retry.unknown_commit.retry: must be never for unknown_commit
notify.webhook_url: must be an absolute http(s) URL
retention.payloads: must be at least 1h
retention.events: must not be shorter than retention.payloads
retention.interval: must be at least 1m
validation.max_repairs: must be from 0 to 20
budgets.max_model_calls: must be ≥ 0 (0: unlimited)
input_schemas.empty: empty
input_schemas.zendesk: schema input_schemas.zendesk: not a valid JSON Schema: at "/type": value must be one of 'array', 'boolean', 'integer', 'null', 'number', 'object', 'string'
at "/type": got string, want array
dispatch.batch_size: must be from 1 to 1000
dispatch.lease: must be at least 1s
dispatch.interval: must be at least 10ms
dispatch.concurrency: must be from 1 to 1000
dispatch.drain: must be from 0s to 10m
actions.Bad-Name: an action type name is 1-64 characters of a-z, 0-9 and _, starting with a letter
actions.Bad-Name.gate: must be none, approve_before_act, act_with_window or approve_by_exception, not "maybe"
actions.Bad-Name.retry.max_attempts: must be from 1 to 100
actions.Bad-Name.max_in_flight: must be from 1 to dispatch.concurrency (2000)
actions.Bad-Name.rate: must be from 0 (no cap) to 100000 sends per second
actions.Bad-Name.timeout: 10s must be shorter than dispatch.lease (0s): a send may not outlive its lease
actions.Bad-Name.retry.max_backoff: must not be shorter than retry.backoff
actions.Bad-Name.approvers: a gated action type (gate maybe) needs approvers: roles or subjects
actions.Bad-Name.sample_rate: must be from 0 to 1
actions.Bad-Name.approval_ttl: must be from 1m to 720h
actions.Bad-Name.http: given, but the connector is "worker"
actions.u.timeout: 2m0s must be shorter than dispatch.lease (0s): a send may not outlive its lease
actions.v.connector: required: http, smtp or worker
actions.w.approvers: a gated action type (gate act_with_window) needs approvers: roles or subjects
actions.w.reversible: act_with_window is only for reversible actions: set reversible: true, or use approve_before_act
actions.w.window: act_with_window needs a window from 10s to 168h
actions.x.approvers: a gated action type (gate approve_by_exception) needs approvers: roles or subjects
actions.x.reversible: approve_by_exception is only for reversible actions: set reversible: true, or use approve_before_act
actions.x.rule: approve_by_exception needs a rule
actions.x.evidence_sources: approve_by_exception needs evidence from at least one evaluator outside the model
actions.x.schema: approve_by_exception needs a schema: validation must pass
actions.x.http: required for connector http
actions.x2.rule: the rule must be a boolean expression, not int
actions.x2.schema: schema actions.x2.schema: not a valid JSON Schema: at "/type": value must be one of 'array', 'boolean', 'integer', 'null', 'number', 'object', 'string'
at "/type": got number, want array
actions.y.approvers: a gated action type (gate approve_before_act) needs approvers: roles or subjects
actions.y.budgets.max_model_calls: must be ≥ 0 (0: unlimited)
actions.y.smtp: required for connector smtp
actions.z.connector: must be http, smtp or worker, not "fax"`
	if got := strings.Join(strings.Split(err.Error(), "; "), "\n"); got != strings.TrimPrefix(want, "\n") {
		t.Errorf("got:\n%s\nwant:\n%s", got, strings.TrimPrefix(want, "\n"))
	}
}
