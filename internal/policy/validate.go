package policy

import (
	"errors"
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"
)

var namePattern = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`)

// errs collects every problem, each prefixed with its field path.
type errs []string

func (e *errs) add(field, format string, args ...any) {
	*e = append(*e, field+": "+fmt.Sprintf(format, args...))
}

// validate checks the whole document after its defaults are filled, and reports every
// problem at once, in the document's order: the top-level sections, then each action
// type by name. It also resolves what the checks read (secrets, compiled schemas and
// rules).
func (p *Policy) validate(lookupEnv func(string) (string, bool)) error {
	var e errs
	p.validatePublicURL(&e)
	p.validateRetryTable(&e)
	p.validateNotify(&e, lookupEnv)
	p.Retention.validate("retention", &e)
	if n := *p.Validation.MaxRepairs; n < 0 || n > 20 {
		e.add("validation.max_repairs", "must be from 0 to 20")
	}
	p.Budgets.validate("budgets", &e)
	p.validateInputSchemas(&e)
	p.Dispatch.validate("dispatch", &e)
	for _, name := range p.ActionNames() {
		p.validateAction(name, &e, lookupEnv)
	}
	p.OIDC.validate("oidc", &e, lookupEnv)
	p.MCP.validate(p, &e)
	p.Slack.validate("slack", &e, lookupEnv)
	for _, name := range p.ActionNames() {
		p.validateDecideIn("actions."+name+".approval.decide_in", p.Actions[name], &e)
	}
	if len(e) > 0 {
		return errors.New(strings.Join(e, "; "))
	}
	return nil
}

func (p *Policy) validatePublicURL(e *errs) {
	if p.PublicURL == "" {
		return
	}
	if u, err := url.Parse(p.PublicURL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		e.add("public_url", "must be an absolute http(s) URL")
	}
}

// validateRetryTable checks each row of the retry table, by failure class.
func (p *Policy) validateRetryTable(e *errs) {
	for _, class := range sortedRuleKeys(p.Retry) {
		validateRetryRule(class, p.Retry[class], e)
	}
}

// validateRetryRule checks one failure class's row: a known class, a retry kind the class
// allows, and its attempts and backoff.
func validateRetryRule(class string, r *RetryRule, e *errs) {
	f := "retry." + class
	if !slices.Contains(Classes, class) {
		e.add(f, "unknown failure class (valid: %s)", strings.Join(Classes, ", "))
		return
	}
	if r == nil {
		e.add(f, "empty")
		return
	}
	allowed := []string{RetryTransport, RetryBusiness, RetryNever}
	switch class {
	case ClassPartialSuccess:
		allowed = []string{RetryWrite, RetryNever}
	case ClassUnknownCommit:
		allowed = []string{RetryNever} // never retried: the run is parked for reconciliation
	}
	if !slices.Contains(allowed, r.Retry) {
		e.add(f+".retry", "must be %s for %s", strings.Join(allowed, " or "), class)
	}
	if r.Retry != RetryNever && (r.MaxAttempts < 1 || r.MaxAttempts > 100) {
		e.add(f+".max_attempts", "must be from 1 to 100")
	}
	if r.MaxBackoff < r.Backoff {
		e.add(f+".max_backoff", "must not be shorter than backoff")
	}
}

// validateNotify resolves the notification webhook's URL (a secret) and checks it.
func (p *Policy) validateNotify(e *errs, lookupEnv func(string) (string, bool)) {
	if p.Notify.WebhookURLEnv != "" || p.Notify.WebhookURLFile != "" {
		p.Notify.WebhookURL = secret("notify", "webhook_url", p.Notify.WebhookURLEnv, p.Notify.WebhookURLFile, e, lookupEnv)
		if u, err := url.Parse(p.Notify.WebhookURL); p.Notify.WebhookURL != "" && (err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http")) {
			e.add("notify.webhook_url", "must be an absolute http(s) URL")
		}
	}
	for _, name := range slices.Sorted(maps.Keys(p.Notify.Webhooks)) {
		validateWebhook(name, p.Notify.Webhooks[name], e, lookupEnv)
	}
}

// validateWebhook checks one named chat webhook and reads its URL (a bearer secret).
func validateWebhook(name string, w *Webhook, e *errs, lookupEnv func(string) (string, bool)) {
	f := "notify.webhooks." + name
	if w == nil {
		e.add(f, "is empty")
		return
	}
	w.Name = name
	if w.Format == "" {
		w.Format = WebhookSlack
	}
	if w.Format != WebhookSlack && w.Format != WebhookTeams {
		e.add(f+".format", "must be slack or teams, not %q", w.Format)
	}
	if w.URLEnv == "" && w.URLFile == "" {
		e.add(f, "needs url_env or url_file")
		return
	}
	w.URL = secret(f, "url", w.URLEnv, w.URLFile, e, lookupEnv)
	if u, err := url.Parse(w.URL); w.URL != "" && (err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http")) {
		e.add(f+".url", "must be an absolute http(s) URL")
	}
}

func (r Retention) validate(f string, e *errs) {
	if r.Payloads.D() < time.Hour {
		e.add(f+".payloads", "must be at least 1h")
	}
	if r.Events.D() < r.Payloads.D() {
		e.add(f+".events", "must not be shorter than retention.payloads")
	}
	if r.Interval.D() < time.Minute {
		e.add(f+".interval", "must be at least 1m")
	}
}

// validateInputSchemas compiles each trigger source's input schema.
func (p *Policy) validateInputSchemas(e *errs) {
	for _, src := range sortedRefKeys(p.InputSchemas) {
		if ref := p.InputSchemas[src]; ref == nil {
			e.add("input_schemas."+src, "empty")
		} else if err := ref.compile("input_schemas."+src, p.dir); err != nil {
			e.add("input_schemas."+src, "%v", err)
		}
	}
}

func (d Dispatch) validate(f string, e *errs) {
	if d.BatchSize < 1 || d.BatchSize > 1000 {
		e.add(f+".batch_size", "must be from 1 to 1000")
	}
	if d.Lease.D() < time.Second {
		e.add(f+".lease", "must be at least 1s")
	}
	if d.Interval.D() < 10*time.Millisecond {
		e.add(f+".interval", "must be at least 10ms")
	}
	if d.Concurrency < 1 || d.Concurrency > 1000 {
		e.add(f+".concurrency", "must be from 1 to 1000")
	}
	if d.Drain.D() < 0 || d.Drain.D() > 10*time.Minute {
		e.add(f+".drain", "must be from 0s to 10m")
	}
}

// gateModes are the gate modes an action type may name.
var gateModes = []string{GateNone, GateApproveBeforeAct, GateActWithWindow, GateApproveByException}

// validateAction checks one action type: its name and gate mode, how it is sent, its
// gate's configuration, its schema and budgets, then its connector.
func (p *Policy) validateAction(name string, e *errs, lookupEnv func(string) (string, bool)) {
	a, f := p.Actions[name], "actions."+name
	if !namePattern.MatchString(name) {
		e.add(f, "an action type name is 1-64 characters of a-z, 0-9 and _, starting with a letter")
	}
	if !slices.Contains(gateModes, a.Gate) {
		e.add(f+".gate", "must be none, approve_before_act, act_with_window or approve_by_exception, not %q", a.Gate)
	}
	a.validateSending(f, p.Dispatch, e)
	a.validateGate(f, e)
	for _, w := range a.Notify {
		if p.Notify.Webhooks[w] == nil {
			e.add(f+".notify", "names %q, which notify.webhooks does not define", w)
		}
	}
	if a.Schema != nil {
		if err := a.Schema.compile(f+".schema", p.dir); err != nil {
			e.add(f+".schema", "%v", err)
		}
	}
	if a.Budgets != nil {
		a.Budgets.validate(f+".budgets", e)
	}
	a.validateConnector(f, e, lookupEnv)
}

// validateSending checks how the dispatcher sends the type: retries, its share of the
// instance's sends, its rate, and a send timeout inside the dispatch lease.
func (a *Action) validateSending(f string, d Dispatch, e *errs) {
	if a.Retry.MaxAttempts < 1 || a.Retry.MaxAttempts > 100 {
		e.add(f+".retry.max_attempts", "must be from 1 to 100")
	}
	if a.MaxInFlight < 1 || a.MaxInFlight > d.Concurrency {
		e.add(f+".max_in_flight", "must be from 1 to dispatch.concurrency (%d)", d.Concurrency)
	}
	if a.Rate < 0 || a.Rate > 100000 {
		e.add(f+".rate", "must be from 0 (no cap) to 100000 sends per second")
	}
	// A send that outlives its lease could be taken for crashed and its effect marked
	// unknown (or, before it began, queued again) while it is still in flight.
	if t := a.SendTimeout(); t > 0 && t >= d.Lease.D() {
		e.add(f+".timeout", "%s must be shorter than dispatch.lease (%s): a send may not outlive its lease", t, d.Lease.D())
	}
	// A "none" before the send could have timed out is no evidence at all.
	t := a.SendTimeout()
	if a.Kind().Outside {
		t = 0 // performed outside airlock: no timeout of airlock's bounds it
	}
	if a.SettleWindow.D() < t || a.SettleWindow.D() > 24*time.Hour {
		e.add(f+".settle_window", "must be from the connector's timeout (%s) to 24h", t)
	}
	if a.Retry.MaxBackoff < a.Retry.Backoff {
		e.add(f+".retry.max_backoff", "must not be shorter than retry.backoff")
	}
}

// validateGate checks the configuration the type's gate mode needs: approvers for any
// gate, reversibility for the modes that act before a person looks, act_with_window's
// window, approve_by_exception's rule, evidence and schema; and the sample rate and the
// approval's lifetime, which every type may set.
func (a *Action) validateGate(f string, e *errs) {
	if a.Gate != GateNone && len(a.Approvers.Roles) == 0 && len(a.Approvers.Subjects) == 0 {
		e.add(f+".approvers", "a gated action type (gate %s) needs approvers: roles or subjects", a.Gate)
	}
	if (a.Gate == GateActWithWindow || a.Gate == GateApproveByException) && !a.Reversible {
		e.add(f+".reversible", "%s is only for reversible actions: set reversible: true, or use approve_before_act", a.Gate)
	}
	switch a.Gate {
	case GateActWithWindow:
		a.validateWindow(f, e)
	case GateApproveByException:
		a.validateException(f, e)
	}
	if a.SampleRate < 0 || a.SampleRate > 1 {
		e.add(f+".sample_rate", "must be from 0 to 1")
	}
	if a.ApprovalTTL.D() < time.Minute || a.ApprovalTTL.D() > 30*24*time.Hour {
		e.add(f+".approval_ttl", "must be from 1m to 720h")
	}
	a.validateSteps(f+".approval", e)
}

// validateSteps checks the expiry warning and the escalation: both must fall inside the
// approval's lifetime, and an escalation names valid roles other than the approvers'.
func (a *Action) validateSteps(f string, e *errs) {
	if a.Approval.WarnBefore >= a.ApprovalTTL && a.ApprovalTTL > 0 {
		e.add(f+".warn_before", "must be shorter than approval_ttl (%s): the warning comes before the approval lapses (0s: no warning)", a.ApprovalTTL.D())
	}
	switch a.Approval.OnReject {
	case "", OnRejectEndRun, OnRejectSkipEffect:
	default:
		e.add(f+".on_reject", "must be %s or %s", OnRejectEndRun, OnRejectSkipEffect)
	}
	x := a.Approval.Escalate
	if x == nil {
		return
	}
	if a.Gate == GateNone || a.Gate == GateActWithWindow {
		e.add(f+".escalate", "gate %s has no approval to escalate", a.Gate)
	}
	if x.After <= 0 || x.After >= a.ApprovalTTL {
		e.add(f+".escalate.after", "must be more than 0s and shorter than approval_ttl (%s)", a.ApprovalTTL.D())
	}
	if len(x.Roles) == 0 {
		e.add(f+".escalate.roles", "name at least one role that may also decide after the wait")
	}
	for _, r := range x.Roles {
		switch {
		case !ValidRole(r):
			e.add(f+".escalate.roles", "%q is not a role: give one role, without commas", r)
		case slices.Contains(a.Approvers.Roles, r):
			e.add(f+".escalate.roles", "%q already approves this type: escalate to another role", r)
		}
	}
}

func (a *Action) validateWindow(f string, e *errs) {
	if a.Window.D() < 10*time.Second || a.Window.D() > 7*24*time.Hour {
		e.add(f+".window", "act_with_window needs a window from 10s to 168h")
	}
}

// validateException compiles approve_by_exception's rule (into Rule) and checks that it
// has evidence from outside the model and a schema to validate against.
func (a *Action) validateException(f string, e *errs) {
	if a.RuleSource == "" {
		e.add(f+".rule", "approve_by_exception needs a rule")
	} else if r, err := compileRule(a.RuleSource); err != nil {
		e.add(f+".rule", "%v", err)
	} else {
		a.Rule = r
	}
	if len(a.EvidenceSources) == 0 {
		e.add(f+".evidence_sources", "approve_by_exception needs evidence from at least one evaluator outside the model")
	}
	if a.Schema == nil {
		e.add(f+".schema", "approve_by_exception needs a schema: validation must pass")
	}
}
