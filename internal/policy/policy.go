// Package policy is airlock's policy file (`airlock serve --config airlock.yaml`): the
// closed set of action types, each with its connector, targets, gate and send limits.
// It is validated whole at start-up, and every error names the field it is about.
// Later parts (gates, schemas, retry tables) add their sections here.
package policy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/airlockhq/airlock/internal/connector"
	"github.com/airlockhq/airlock/internal/validation"
)

// Gate modes.
const (
	GateNone               = "none"
	GateApproveBeforeAct   = "approve_before_act"
	GateActWithWindow      = "act_with_window"
	GateApproveByException = "approve_by_exception"
)

// ConnectorWorker is the kind whose effects a worker performs outside airlock (the MCP
// gateway's tools must have it). Every kind, this one included, is a row of
// internal/connector/kinds; policy knows no other by name.
const ConnectorWorker = "worker"

// Duration is a time.Duration written as "5s" in YAML.
type Duration = connector.Duration

// Policy is the whole file.
type Policy struct {
	PublicURL string             `yaml:"public_url"`
	Actions   map[string]*Action `yaml:"actions"`
	Dispatch  Dispatch           `yaml:"dispatch"`
	// Retry is the failure table: what airlock tells a client to do with each class.
	Retry      map[string]*RetryRule `yaml:"retry"`
	Budgets    Budgets               `yaml:"budgets"`
	Validation ValidationConfig      `yaml:"validation"`
	// InputSchemas check a claim's payload by its trigger_source (seed step 1).
	InputSchemas map[string]*SchemaRef `yaml:"input_schemas"`
	dir          string                // relative schema paths start here
	// Version identifies the policy file's content (recorded with auto-approvals).
	Version string `yaml:"-"`
	// Notify posts a short card (Slack-compatible JSON) when an approval is requested.
	Notify Notify `yaml:"notify"`
	// Retention bounds how long payloads and events are kept.
	Retention Retention `yaml:"retention"`

	// OIDC is single sign-on for the approval pages (optional; see oidc.go).
	OIDC *OIDC `yaml:"oidc"`
	// Console names who may act in the operator console (/console) beyond deciding
	// their own approvals: operators resolve effects and unpark runs; admins also hold
	// the kill switch.
	Console Console `yaml:"console"`

	// MCP configures the `airlock mcp` gateway (optional; see mcp.go).
	MCP *MCP `yaml:"mcp"`

	// Slack configures decisions in Slack (optional; see slack.go).
	Slack *Slack `yaml:"slack"`
}

// Console maps people to console roles, by role (local accounts' roles, or OIDC claims
// through oidc.role_map) or by subject, as approvers are named.
type Console struct {
	Operators Members `yaml:"operators"`
	Admins    Members `yaml:"admins"`
}

// ActionTypes lists the configured action types by name.
func (p *Policy) ActionTypes() []string {
	out := make([]string, 0, len(p.Actions))
	for t := range p.Actions {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

// Members are people named by role or subject.
type Members struct {
	Roles    []string `yaml:"roles"`
	Subjects []string `yaml:"subjects"`
}

// Has reports whether a person with this subject and roles is a member.
func (m Members) Has(subject string, roles []string) bool {
	if subject != "" && slices.Contains(m.Subjects, subject) {
		return true
	}
	for _, r := range roles {
		if slices.Contains(m.Roles, r) {
			return true
		}
	}
	return false
}

// Failure classes: what went wrong with a step, each mapped by the retry table to retry
// or not, at which level, how often and with what backoff.
const (
	ClassTransportTimeout = "transport_timeout"
	ClassRateLimited      = "rate_limited"
	ClassServerError      = "server_error"
	ClassClientError      = "client_error"
	ClassParseFailure     = "parse_failure"
	ClassSoftFailure      = "soft_failure"
	ClassPartialSuccess   = "partial_success"
	ClassUnknownCommit    = "unknown_commit"
)

// Classes lists every failure class.
var Classes = []string{ClassTransportTimeout, ClassRateLimited, ClassServerError, ClassClientError,
	ClassParseFailure, ClassSoftFailure, ClassPartialSuccess, ClassUnknownCommit}

// Retry levels.
const (
	RetryTransport = "transport" // retry inside the same execution: lease, version and state kept
	RetryBusiness  = "business"  // give the run back: failed_retryable, the next delivery reclaims it
	RetryWrite     = "write"     // partial_success: only the failed writes are retried, through the outbox
	RetryNever     = "never"     // terminal (unknown_commit: parked for reconciliation instead)
)

// RetryRule is one row of the failure table.
type RetryRule struct {
	Retry       string   `yaml:"retry"`
	MaxAttempts int      `yaml:"max_attempts"`
	Backoff     Duration `yaml:"backoff"`
	MaxBackoff  Duration `yaml:"max_backoff"`
}

// DefaultRetry is the table a fresh install uses; the policy file overrides rows whole.
func DefaultRetry() map[string]*RetryRule {
	d := func(s string) Duration { v, _ := time.ParseDuration(s); return Duration(v) }
	return map[string]*RetryRule{
		ClassTransportTimeout: {RetryTransport, 3, d("1s"), d("10s")},
		ClassRateLimited:      {RetryTransport, 5, d("2s"), d("60s")},
		ClassServerError:      {RetryTransport, 3, d("2s"), d("30s")},
		ClassClientError:      {RetryNever, 1, 0, 0},
		ClassParseFailure:     {RetryTransport, 2, d("500ms"), d("5s")},
		ClassSoftFailure:      {RetryNever, 1, 0, 0},
		ClassPartialSuccess:   {RetryWrite, 3, d("5s"), d("60s")},
		ClassUnknownCommit:    {RetryNever, 1, 0, 0},
	}
}

// Budgets bound one run; zero means unlimited.
type Budgets struct {
	MaxModelCalls int      `yaml:"max_model_calls"`
	MaxTokens     int64    `yaml:"max_tokens"`
	RunDeadline   Duration `yaml:"run_deadline"` // from the run's first claim
}

// ValidationConfig bounds repairs of model output.
type ValidationConfig struct {
	// MaxRepairs is how many validation results per run may need fixing (extraction from
	// prose or a code fence, or a failed check the client answers with a new model call)
	// before the run fails for good. Default 2.
	MaxRepairs *int `yaml:"max_repairs"`
}

// SchemaRef is a JSON Schema given as a file path (relative to the policy file) or inline.
type SchemaRef struct {
	Path     string
	Inline   []byte
	Compiled *validation.Schema
}

func (s *SchemaRef) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		s.Path = n.Value
		return nil
	case yaml.MappingNode:
		var v any
		if err := n.Decode(&v); err != nil {
			return err
		}
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("line %d: the schema cannot be written as JSON: %v", n.Line, err)
		}
		s.Inline = b
		return nil
	}
	return fmt.Errorf("line %d: a schema is a file path or an inline mapping", n.Line)
}

func (s *SchemaRef) compile(field, dir string) error {
	var err error
	if s.Inline != nil {
		s.Compiled, err = validation.Compile(field, s.Inline)
	} else {
		path := s.Path
		if !filepath.IsAbs(path) {
			path = filepath.Join(dir, path)
		}
		s.Compiled, err = validation.CompileFile(path)
	}
	return err
}

// Dispatch tunes the dispatcher inside `airlock serve`.
type Dispatch struct {
	// Interval is the fallback poll: a dispatcher also wakes at once when an effect is
	// queued in its instance, or (PostgreSQL) in any instance.
	Interval  Duration `yaml:"interval"`   // default 500ms
	BatchSize int      `yaml:"batch_size"` // most effects leased in one statement (default 32)
	// Concurrency is how many sends one instance has in flight at once (default 32).
	Concurrency int      `yaml:"concurrency"`
	Lease       Duration `yaml:"lease"`    // how long a send may take before it counts as crashed (default 2m)
	Disabled    bool     `yaml:"disabled"` // run no dispatcher in this instance
	// Drain is how long a stopping instance lets its in-flight sends finish (default 30s).
	Drain Duration `yaml:"drain"`
	// ReconcileInterval is how often unknown effects are looked up (default 30s).
	ReconcileInterval Duration `yaml:"reconcile_interval"`
}

// Action is one action type.
type Action struct {
	Name      string `yaml:"-"`
	Connector string `yaml:"connector"`
	Gate      string `yaml:"gate"`
	// Section is the connector kind's own section (actions.<type>.<connector>: the
	// kind's YAML key), decoded, defaulted and validated by its row of
	// internal/connector/kinds; nil when the connector is unknown.
	Section connector.Section `yaml:"-"`
	// sections are every kind's section the file gives, by kind (one that is not the
	// connector's is reported).
	sections map[string]connector.Section
	Retry    ActionRetry `yaml:"retry"`
	// MaxInFlight caps this type's sends in flight per instance, so a slow or hanging
	// provider cannot take every slot (default: dispatch.concurrency when this is the only
	// type airlock sends, half of it otherwise).
	MaxInFlight int `yaml:"max_in_flight"`
	// Rate caps this type's sends per second per instance (0: no cap).
	Rate float64 `yaml:"rate"`
	// SettleWindow is how long after an ambiguous attempt began its request may still
	// reach the provider (queued in its accept backlog, a load balancer, a retrying
	// proxy): a lookup's "none" before then proves nothing and is asked again later.
	// Default: the connector's timeout plus DefaultSettleGrace.
	SettleWindow Duration `yaml:"settle_window"`
	// Schema validates the model output this action type sends (POST /validate); with
	// one, an effect queues only a validated value.
	Schema *SchemaRef `yaml:"schema"`
	// Budgets override the global ones for runs of this type (fields that are set).
	Budgets *Budgets `yaml:"budgets"`
	// Approvers may decide this type's approvals; a gated type must name some.
	Approvers Approvers `yaml:"approvers"`
	// Notify names the webhooks (Policy.Notify.Webhooks) that announce this action
	// type's approvals.
	Notify []string `yaml:"notify"`
	// ApprovalTTL is how long an approval stays open (default 24h).
	ApprovalTTL Duration `yaml:"approval_ttl"`
	// Approval configures what happens to a pending approval nobody answers: a warning
	// before it lapses, and an optional escalation to a second role.
	Approval ApprovalSteps `yaml:"approval"`
	// Reversible is required for act_with_window and approve_by_exception.
	Reversible bool `yaml:"reversible"`
	// LogFields are the payload fields that may appear in notifications (and, later, in
	// events and logs); every other field stays out.
	LogFields []string `yaml:"log_fields"`
	// Window is act_with_window's delay: the effect waits this long, cancellable, before
	// the dispatcher may take it.
	Window Duration `yaml:"window"`
	// RuleSource, EvidenceSources and SampleRate configure approve_by_exception: the rule
	// must hold, validation must have passed, and the request must carry evidence from
	// every listed source (evaluators outside the model); a sample of auto-approvals goes
	// to post-hoc review.
	RuleSource      string   `yaml:"rule"`
	EvidenceSources []string `yaml:"evidence_sources"`
	SampleRate      float64  `yaml:"sample_rate"`
	Rule            *Rule    `yaml:"-"`
	// QualifiedReview names the role that must approve medical, legal, regulated-financial,
	// child-safety or structural decisions: it forces approve_before_act by that role.
	QualifiedReview string `yaml:"qualified_review"`
}

// Retention: payloads (effect and approval payloads, run results, validated values,
// ledgers of finished runs) and events are removed when older than these; hashes and ids
// stay. Defaults apply on a fresh install.
type Retention struct {
	Payloads Duration `yaml:"payloads"` // default 30 days
	Events   Duration `yaml:"events"`   // default 400 days
	Interval Duration `yaml:"interval"` // how often each instance purges; default 1h
}

// Notify is the approval notification webhook. Its URL is a secret (Slack webhooks are
// bearer URLs), so it comes from the environment or a file.
type Notify struct {
	WebhookURLEnv  string `yaml:"webhook_url_env"`
	WebhookURLFile string `yaml:"webhook_url_file"`
	WebhookURL     string `yaml:"-"`
	// Webhooks are named chat webhooks (Slack or Microsoft Teams incoming webhooks); an
	// action type names the ones its approvals are announced on (Action.Notify).
	Webhooks map[string]*Webhook `yaml:"webhooks"`
}

// Webhook formats.
const (
	WebhookSlack = "slack" // Slack incoming webhook: text + Block Kit blocks
	WebhookTeams = "teams" // Microsoft Teams incoming webhook / Workflows: an Adaptive Card
)

// Webhook is one chat webhook. Its URL is a bearer secret, so it comes from the
// environment or a file, like the other secrets.
type Webhook struct {
	Name    string `yaml:"-"`
	Format  string `yaml:"format"` // slack (default) or teams
	URLEnv  string `yaml:"url_env"`
	URLFile string `yaml:"url_file"`
	URL     string `yaml:"-"`
}

// ApprovalSteps are the one-time steps of a pending approval.
type ApprovalSteps struct {
	// WarnBefore is how long before the approval lapses its approvers are warned (default:
	// a quarter of approval_ttl, at most 1h; 0s: no warning).
	WarnBefore Duration `yaml:"warn_before"`
	// Escalate, when set, lets Roles also decide after After, and announces it.
	Escalate *Escalate `yaml:"escalate"`
	// DecideIn are the places a decision may be made: page (always, the default) and
	// slack (buttons in the Slack message; see slack.go).
	DecideIn []string `yaml:"decide_in"`
	// OnReject is what a person's reject of an effect an agent performs itself (an MCP
	// gateway's or an agent's plan) does to its run: end_run (the default: the run ends
	// rejected, and every later plan in it is refused run_finished) or skip_effect (only
	// that effect is refused — effect_rejected, with who and why — and the run goes on).
	// Effects airlock sends itself always end their run on a reject.
	OnReject string `yaml:"on_reject"`
}

// What a reject of an agent's effect does to its run (ApprovalSteps.OnReject).
const (
	OnRejectEndRun     = "end_run"
	OnRejectSkipEffect = "skip_effect"
)

// Escalate is the escalation of a pending approval to a second role.
type Escalate struct {
	After Duration `yaml:"after"`
	Roles []string `yaml:"roles"`
}

// Approvers are the people who may decide an approval.
type Approvers struct {
	Roles    []string `yaml:"roles"`
	Subjects []string `yaml:"subjects"`
	// SeparationOfDuties (default true) forbids the requester to approve.
	SeparationOfDuties *bool `yaml:"separation_of_duties"`
}

// ActionRetry bounds the dispatcher's retries of definite, retryable send failures.
type ActionRetry struct {
	MaxAttempts int      `yaml:"max_attempts"` // sends before the effect is failed (default 5)
	Backoff     Duration `yaml:"backoff"`      // first delay, doubled each attempt (default 2s)
	MaxBackoff  Duration `yaml:"max_backoff"`  // (default 5m)
}

// Empty is the policy of a server started without --config: no action type is
// configured, so every effect is refused.
func Empty() *Policy {
	p := &Policy{Actions: map[string]*Action{}}
	p.defaults(func(...string) bool { return false })
	_ = p.validate(func(string) (string, bool) { return "", false })
	return p
}

// Load reads and validates the file. lookupEnv resolves *_env secrets.
func Load(path string, lookupEnv func(string) (string, bool)) (*Policy, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	p, err := parse(b, filepath.Dir(path), lookupEnv)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", path, err)
	}
	return p, nil
}

// LoadWithoutSecrets reads and validates the file like Load but resolves no secret (no
// *_env variable, no *_file): for operator commands, which send nothing. Every field is
// still checked; the secrets stay empty.
func LoadWithoutSecrets(path string) (*Policy, error) {
	return Load(path, nil)
}

// Parse validates a policy document; relative schema paths start at the working directory.
func Parse(b []byte, lookupEnv func(string) (string, bool)) (*Policy, error) {
	return parse(b, ".", lookupEnv)
}

func parse(b []byte, dir string, lookupEnv func(string) (string, bool)) (*Policy, error) {
	sum := sha256.Sum256(b)
	p := Policy{dir: dir, Version: hex.EncodeToString(sum[:6])}
	if err := checkShape(b); err != nil {
		return nil, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("%s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	if p.Actions == nil {
		p.Actions = map[string]*Action{}
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("%s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	p.defaults(func(path ...string) bool { return given(&doc, path) })
	if err := p.validate(lookupEnv); err != nil {
		return nil, err
	}
	return &p, nil
}

// given reports whether the document names the field at path (a key under each mapping),
// whatever its value: a default fills only what was left out, and an explicit 0 stays 0
// for validation to judge.
func given(n *yaml.Node, path []string) bool {
	if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		n = n.Content[0]
	}
	for _, key := range path {
		if n.Kind != yaml.MappingNode {
			return false
		}
		var next *yaml.Node
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == key {
				next = n.Content[i+1]
			}
		}
		if next == nil {
			return false
		}
		n = next
	}
	return true
}

// defaults fills the fields the document left out; set says whether it named one.
func (p *Policy) defaults(set func(path ...string) bool) {
	table := DefaultRetry()
	for class, rule := range p.Retry {
		table[class] = rule // a row given replaces the default row whole
	}
	p.Retry = table
	p.OIDC.defaults()
	if p.Budgets == (Budgets{}) && !set("budgets", "max_model_calls") {
		p.Budgets.MaxModelCalls = 50
	}
	if p.Retention.Payloads == 0 && !set("retention", "payloads") {
		p.Retention.Payloads = Duration(30 * 24 * time.Hour)
	}
	if p.Retention.Events == 0 && !set("retention", "events") {
		p.Retention.Events = Duration(400 * 24 * time.Hour)
	}
	if p.Retention.Interval == 0 && !set("retention", "interval") {
		p.Retention.Interval = Duration(time.Hour)
	}
	if p.Validation.MaxRepairs == nil {
		two := 2
		p.Validation.MaxRepairs = &two
	}
	d := &p.Dispatch
	if d.Interval == 0 && !set("dispatch", "interval") {
		d.Interval = Duration(500 * time.Millisecond)
	}
	if d.BatchSize == 0 && !set("dispatch", "batch_size") {
		d.BatchSize = 32
	}
	if d.Concurrency == 0 && !set("dispatch", "concurrency") {
		d.Concurrency = 32
	}
	if d.Drain == 0 && !set("dispatch", "drain") {
		d.Drain = Duration(30 * time.Second)
	}
	if d.Lease == 0 && !set("dispatch", "lease") {
		d.Lease = Duration(2 * time.Minute)
	}
	if d.ReconcileInterval == 0 {
		d.ReconcileInterval = Duration(30 * time.Second)
	}
	for name, a := range p.Actions {
		if a == nil {
			a = &Action{}
			p.Actions[name] = a
		}
		a.Name = name
		if a.Gate == "" {
			a.Gate = GateApproveBeforeAct
		}
		if a.Retry.MaxAttempts == 0 && !set("actions", name, "retry", "max_attempts") {
			a.Retry.MaxAttempts = 5
		}
		if a.QualifiedReview != "" {
			// Whatever else is configured: a qualified person approves before anything acts.
			a.Gate, a.Approvers.Roles, a.Approvers.Subjects = GateApproveBeforeAct, []string{a.QualifiedReview}, nil
		}
		if a.ApprovalTTL == 0 && !set("actions", name, "approval_ttl") {
			a.ApprovalTTL = Duration(24 * time.Hour)
		}
		if a.Approval.WarnBefore == 0 && !set("actions", name, "approval", "warn_before") {
			a.Approval.WarnBefore = min(a.ApprovalTTL/4, Duration(time.Hour))
		}
		if a.Approvers.SeparationOfDuties == nil {
			yes := true
			a.Approvers.SeparationOfDuties = &yes
		}
		if a.Retry.Backoff == 0 {
			a.Retry.Backoff = Duration(2 * time.Second)
		}
		if a.Retry.MaxBackoff == 0 {
			a.Retry.MaxBackoff = Duration(5 * time.Minute)
		}
		a.defaultSections(func(path ...string) bool { return set(append([]string{"actions", name}, path...)...) })
		if a.SettleWindow == 0 && !set("actions", name, "settle_window") && !a.Kind().Outside {
			// A worker or agent type sets its own: how long a call its performer made may
			// still reach the provider (0: a search's "none" clears the effect at once).
			a.SettleWindow = Duration(a.SendTimeout() + DefaultSettleGrace)
		}
	}
	// One type alone may use every slot; beside others, half, so a provider that hangs
	// leaves the rest of the instance's sends going.
	sent := 0
	for _, a := range p.Actions {
		if a.Executor() == "dispatcher" {
			sent++
		}
	}
	for _, a := range p.Actions {
		if a.MaxInFlight == 0 && !set("actions", a.Name, "max_in_flight") {
			a.MaxInFlight = d.Concurrency
			if sent > 1 {
				a.MaxInFlight = max(1, d.Concurrency/2)
			}
		}
	}
}

// secret resolves a secret from an environment variable or a file, never from the policy
// file itself.
// A nil lookupEnv (LoadWithoutSecrets) resolves nothing.
func secret(f, what, env, file string, e *errs, lookupEnv func(string) (string, bool)) string {
	switch {
	case env != "" && file != "":
		e.add(f+"."+what+"_env", "give %s_env or %s_file, not both", what, what)
	case lookupEnv == nil:
	case env != "":
		v, ok := lookupEnv(env)
		if !ok || v == "" {
			e.add(f+"."+what+"_env", "environment variable %s is not set", env)
		}
		return v
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			e.add(f+"."+what+"_file", "cannot read %s", file)
			return ""
		}
		return strings.TrimSpace(string(b))
	}
	return ""
}

func (b Budgets) validate(f string, e *errs) {
	if b.MaxModelCalls < 0 {
		e.add(f+".max_model_calls", "must be ≥ 0 (0: unlimited)")
	}
	if b.MaxTokens < 0 {
		e.add(f+".max_tokens", "must be ≥ 0 (0: unlimited)")
	}
}

// BudgetsFor returns the budgets of a run of actionType ("" for the global ones): the
// action type's fields that are set override the global ones.
func (p *Policy) BudgetsFor(actionType string) Budgets {
	b := p.Budgets
	if a := p.Action(actionType); a != nil && a.Budgets != nil {
		if a.Budgets.MaxModelCalls > 0 {
			b.MaxModelCalls = a.Budgets.MaxModelCalls
		}
		if a.Budgets.MaxTokens > 0 {
			b.MaxTokens = a.Budgets.MaxTokens
		}
		if a.Budgets.RunDeadline > 0 {
			b.RunDeadline = a.Budgets.RunDeadline
		}
	}
	return b
}

func sortedRuleKeys(m map[string]*RetryRule) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func sortedRefKeys(m map[string]*SchemaRef) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// ActionNames returns the configured action types in order.
func (p *Policy) ActionNames() []string {
	names := make([]string, 0, len(p.Actions))
	for n := range p.Actions {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Action returns the configured action type, or nil.
func (p *Policy) Action(name string) *Action { return p.Actions[name] }

// DefaultSettleGrace is what the default settle window adds to the connector's timeout:
// a request the client gave up on may still wait in the provider's accept queue, a load
// balancer or a proxy (whose own timeouts are commonly 60 s) and be performed after the
// lookup said "none"; two minutes covers such a queue twice.
const DefaultSettleGrace = 2 * time.Minute

// Settle is the settle window of an action type (actionType unknown to p: the default
// grace alone).
func (p *Policy) Settle(actionType string) time.Duration {
	if a := p.Action(actionType); a != nil {
		return a.SettleWindow.D()
	}
	return DefaultSettleGrace
}

// Backoff is the delay before the next attempt after attempts failures: exponential from
// base, capped at limit, with jitter (half fixed, half random) so retries do not align;
// never shorter than the provider's retryAfter.
func Backoff(base, limit Duration, attempts int, retryAfter time.Duration) time.Duration {
	d := base.D()
	for i := 1; i < attempts && d < limit.D(); i++ {
		d *= 2
	}
	d = min(d, limit.D())
	if d > 0 {
		d = d/2 + rand.N(d/2+1)
	}
	return max(d, retryAfter)
}

// gateStrictness orders the gate modes: a client may ask for a stricter gate than its
// action type's, never a weaker one. act_with_window ranks above approve_by_exception
// because every one of its effects waits for a person's chance to cancel.
var gateStrictness = map[string]int{GateNone: 0, GateApproveByException: 1, GateActWithWindow: 2, GateApproveBeforeAct: 3}

// WithGate returns the action type with a client's requested gate: the same when gate is
// "" or equal; a copy with the stricter gate; or an error (weaker, unknown, or a mode the
// type lacks the configuration for).
func (a *Action) WithGate(gate string) (*Action, error) {
	if gate == "" || gate == a.Gate {
		return a, nil
	}
	want, ok := gateStrictness[gate]
	if !ok {
		return nil, fmt.Errorf("unknown gate %q", gate)
	}
	if want < gateStrictness[a.Gate] {
		return nil, ErrGateTooWeak
	}
	if len(a.Approvers.Roles) == 0 && len(a.Approvers.Subjects) == 0 {
		return nil, fmt.Errorf("%s has no approvers configured for a stricter gate", a.Name)
	}
	if (gate == GateActWithWindow && a.Window == 0) || (gate == GateApproveByException && a.Rule == nil) {
		return nil, fmt.Errorf("%s is not configured for %s", a.Name, gate)
	}
	c := *a
	c.Gate = gate
	return &c, nil
}

// ErrGateTooWeak: a client asked for a weaker gate than its action type's policy.
var ErrGateTooWeak = errors.New("a client may ask for a stricter gate, never a weaker one")

// Redact is what events and logs may say of a payload of this action type: the values of
// its log_fields, and for every other top-level field only the SHA-256 of its JSON value.
func (a *Action) Redact(payload json.RawMessage) map[string]any {
	var fields map[string]json.RawMessage
	if json.Unmarshal(payload, &fields) != nil {
		return nil
	}
	out := make(map[string]any, len(fields))
	for k, v := range fields {
		if slices.Contains(a.LogFields, k) {
			out[k] = v
			continue
		}
		sum := sha256.Sum256(v)
		out[k] = "sha256:" + hex.EncodeToString(sum[:])
	}
	return out
}
