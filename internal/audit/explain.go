// Package audit answers questions from the record airlock keeps: for one run, the four
// an on-call person asks — was it processed? was it sent? who approved it? which model
// drafted it? — with its timeline (Explain); and over a window of events, the weekly
// figures (Report): duplicate deliveries, gate waits, validation failures, auto versus
// human approvals, retry caps. It only reads; every figure comes from the database.
package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/validation"
)

// MaxTimeline bounds the events one explanation reads; a longer run's timeline is cut
// (TimelineTruncated) while the four answers, read from the run's own rows, stay whole.
const MaxTimeline = 10000

// Service reads the audit record of a store.
type Service struct {
	store store.Store
	runs.Clock
}

// New returns the audit service; now nil means the backend's clock.
func New(st store.Store, now func() time.Time) *Service {
	return &Service{store: st, Clock: runs.Clock{Now: now}}
}

// Explanation is `airlock explain` and GET /v1/runs/{key}/explain. Field names are a
// stable contract (openapi.json); the Answer strings are for people, not for parsing.
type Explanation struct {
	Key               string    `json:"key"`
	AsOf              time.Time `json:"as_of"`
	Processed         Processed `json:"processed"`
	Sent              Sent      `json:"sent"`
	Approved          Approved  `json:"approved"`
	Model             Model     `json:"model"`
	Timeline          []Step    `json:"timeline"`
	TimelineTruncated bool      `json:"timeline_truncated,omitempty"`
}

// Processed answers "was it processed?": the claim, the state, and the deliveries.
type Processed struct {
	Answer            string      `json:"answer"`
	Claimed           bool        `json:"claimed"`
	ClaimedAt         *time.Time  `json:"claimed_at,omitempty"`
	ClaimedBy         string      `json:"claimed_by,omitempty"`
	State             store.State `json:"state"`
	Version           int64       `json:"version"`
	ParkReason        string      `json:"park_reason,omitempty"`
	LeaseLive         bool        `json:"lease_live"`
	LeaseExpiresAt    *time.Time  `json:"lease_expires_at,omitempty"`
	FinishedAt        *time.Time  `json:"finished_at,omitempty"` // when it entered its current state, if terminal
	Reason            string      `json:"reason,omitempty"`      // that transition's reason (retry_cap, approval_expired…)
	TriggerSource     string      `json:"trigger_source,omitempty"`
	WorkflowVersion   string      `json:"workflow_version,omitempty"`
	PayloadHash       string      `json:"payload_hash"`
	Duplicates        int64       `json:"duplicates"`
	Reclaims          int64       `json:"reclaims"`
	PayloadMismatches int         `json:"payload_mismatches"`
	Claims            []Claim     `json:"claims"`
	ReplacedBy        string      `json:"replaced_by,omitempty"`
	Replaces          string      `json:"replaces,omitempty"`
}

// Claim is one taking of the run: its first claim or a reclaim after a lapsed lease.
type Claim struct {
	At      time.Time `json:"at"`
	Kind    string    `json:"kind"` // claimed | lease_reclaimed
	Actor   string    `json:"actor"`
	Version int64     `json:"version"`
}

// Sent answers "was it sent?": every effect of the run, outbox and agent alike.
type Sent struct {
	Answer  string   `json:"answer"`
	Effects []Effect `json:"effects"`
}

// Effect is one external write and what became of it.
type Effect struct {
	ID             string            `json:"id"`
	EffectID       string            `json:"effect_id"`
	ActionType     string            `json:"action_type"`
	Target         string            `json:"target"`
	Executor       string            `json:"executor"` // dispatcher | worker | agent
	State          store.EffectState `json:"state"`
	Sent           bool              `json:"sent"`
	ProviderID     string            `json:"provider_id,omitempty"` // the provider's id, or the agent's receipt
	Attempts       int               `json:"attempts"`
	LastErrorClass string            `json:"last_error_class,omitempty"`
	QueuedAt       time.Time         `json:"queued_at"`
	SentAt         *time.Time        `json:"sent_at,omitempty"`
	SentVia        string            `json:"sent_via,omitempty"` // the event that recorded it: effect_completed, effect_confirmed, effect_reconciled, effect_resolved
	SentBy         string            `json:"sent_by,omitempty"`  // that event's actor
	ApprovalID     string            `json:"approval_id,omitempty"`
	AutoApproved   bool              `json:"auto_approved,omitempty"`
}

// Approved answers "who approved it?".
type Approved struct {
	Answer        string         `json:"answer"`
	Approvals     []Approval     `json:"approvals"`
	AutoApprovals []AutoApproval `json:"auto_approvals"`
	AutoDeclined  []AutoDeclined `json:"auto_approvals_declined"`
}

// Approval is a person's gate: approve_before_act, or act_with_window's cancel link.
type Approval struct {
	ID          string     `json:"id"`
	Mode        string     `json:"mode"`
	ActionType  string     `json:"action_type"`
	Target      string     `json:"target"`
	EffectID    string     `json:"effect_id"`
	RequestedBy string     `json:"requested_by"`
	RequestedAt time.Time  `json:"requested_at"`
	ExpiresAt   time.Time  `json:"expires_at"`
	Status      string     `json:"status"`             // pending | approved | rejected | expired | cancelled | window_closed
	Decision    string     `json:"decision,omitempty"` // as stored: approve, reject, cancel, expired
	Approver    string     `json:"approver,omitempty"`
	DecidedAt   *time.Time `json:"decided_at,omitempty"`
	Reason      string     `json:"reason,omitempty"`
	WaitSeconds *float64   `json:"wait_seconds,omitempty"`
}

// AutoApproval is approve_by_exception letting an effect through without a person.
type AutoApproval struct {
	At              time.Time  `json:"at"`
	EffectID        string     `json:"effect_id"`
	Rule            string     `json:"rule"`
	PolicyVersion   string     `json:"policy_version"`
	EvidenceSources []string   `json:"evidence_sources,omitempty"`
	ReviewID        string     `json:"review_id,omitempty"`
	Review          string     `json:"review,omitempty"` // pending | confirm | flag | expired
	ReviewedBy      string     `json:"reviewed_by,omitempty"`
	ReviewedAt      *time.Time `json:"reviewed_at,omitempty"`
}

// AutoDeclined is an auto-approval that did not hold, so a person was asked.
type AutoDeclined struct {
	At            time.Time `json:"at"`
	Reason        string    `json:"reason"`
	Rule          string    `json:"rule"`
	PolicyVersion string    `json:"policy_version"`
}

// Model answers "which model drafted it?" from the meta clients recorded, with the
// validation results of its output.
type Model struct {
	Answer             string       `json:"answer"`
	Models             []ModelSeen  `json:"models"`
	WorkflowVersions   []string     `json:"workflow_versions"`
	ProviderCategories []string     `json:"provider_categories"`
	Validations        []Validation `json:"validations"`
}

// ModelSeen is one model named in the run's events.
type ModelSeen struct {
	Provider  string    `json:"provider,omitempty"`
	Name      string    `json:"name,omitempty"`
	Revision  string    `json:"revision,omitempty"`
	FirstSeen time.Time `json:"first_seen"`
	LastSeen  time.Time `json:"last_seen"`
	Kinds     []string  `json:"kinds"` // the events that named it
}

// Validation is one model output checked against its action type's schema.
type Validation struct {
	At         time.Time          `json:"at"`
	ActionType string             `json:"action_type"`
	Valid      bool               `json:"valid"`
	Repaired   bool               `json:"repaired"`
	Errors     []validation.Error `json:"errors,omitempty"`
	OutputHash string             `json:"output_hash"`
	Model      *runs.Model        `json:"model,omitempty"`
}

// Step is one event of the timeline with a one-line summary.
type Step struct {
	ID      int64     `json:"id"`
	At      time.Time `json:"at"`
	Kind    string    `json:"kind"`
	Actor   string    `json:"actor,omitempty"`
	Version int64     `json:"version,omitempty"`
	Summary string    `json:"summary"`
}

// event is a stored event with its JSON decoded once.
type event struct {
	store.Event
	meta   runs.Meta
	detail map[string]any
}

func (e event) str(k string) string {
	switch v := e.detail[k].(type) {
	case string:
		return v
	case nil:
		return ""
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	default:
		return fmt.Sprint(v)
	}
}

func (e event) has(k string) bool { _, ok := e.detail[k]; return ok }

func (e event) time(k string) *time.Time {
	t, err := time.Parse(time.RFC3339Nano, e.str(k))
	if err != nil {
		return nil
	}
	return &t
}

// Explain gathers the run's answers; runs.ErrNotFound when there is no such run.
func (s *Service) Explain(ctx context.Context, key string) (Explanation, error) {
	run, err := s.store.RunGet(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return Explanation{}, runs.ErrNotFound
	}
	if err != nil {
		return Explanation{}, fmt.Errorf("explain %q: %w", key, err)
	}
	now, err := s.Read(ctx, s.store)
	if err != nil {
		return Explanation{}, fmt.Errorf("explain %q: %w", key, err)
	}
	evs, truncated, err := s.events(ctx, key)
	if err != nil {
		return Explanation{}, fmt.Errorf("explain %q: %w", key, err)
	}
	effs, err := s.store.EffectList(ctx, store.EffectListParams{RunKey: key}) // every effect: "Sent?" needs all
	if err != nil {
		return Explanation{}, fmt.Errorf("explain %q: %w", key, err)
	}
	aps, err := s.store.ApprovalsByRun(ctx, key)
	if err != nil {
		return Explanation{}, fmt.Errorf("explain %q: %w", key, err)
	}
	x := Explanation{Key: key, AsOf: now.UTC(), TimelineTruncated: truncated, Timeline: make([]Step, 0, len(evs))}
	x.Processed = processed(run, evs, now)
	for _, byNew := range []bool{false, true} {
		r, err := s.store.ReplacementFind(ctx, key, byNew)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return Explanation{}, fmt.Errorf("explain %q: %w", key, err)
		}
		if byNew {
			x.Processed.Replaces = r.OldKey
		} else {
			x.Processed.ReplacedBy = r.NewKey
		}
	}
	x.Approved = approved(aps, evs)
	x.Sent = sent(effs, evs, x.Approved, run)
	x.Model = model(run, evs)
	for _, e := range evs {
		x.Timeline = append(x.Timeline, Step{ID: e.ID, At: e.At.UTC(), Kind: e.Kind, Actor: e.Actor, Version: e.Version, Summary: Summary(e.Event)})
	}
	return x, nil
}

// events reads the run's whole timeline, up to MaxTimeline events.
func (s *Service) events(ctx context.Context, key string) ([]event, bool, error) {
	var out []event
	after := int64(0)
	for len(out) < MaxTimeline {
		page, err := s.store.EventList(ctx, key, after, min(1000, MaxTimeline-len(out)))
		if err != nil {
			return nil, false, err
		}
		for _, e := range page {
			out = append(out, decode(e))
		}
		if len(page) < 1000 {
			return out, false, nil
		}
		after = page[len(page)-1].ID
	}
	more, err := s.store.EventList(ctx, key, after, 1)
	return out, len(more) > 0, err
}

func decode(e store.Event) event {
	ev := event{Event: e}
	_ = json.Unmarshal(e.Meta, &ev.meta)     // a meta that does not decode names no model
	_ = json.Unmarshal(e.Detail, &ev.detail) // a detail that does not decode summarises as its kind
	return ev
}

func terminal(s store.State) bool {
	return s == store.StateCompleted || s == store.StateFailedTerminal || s == store.StateRejected
}

func processed(run store.Run, evs []event, now time.Time) Processed {
	p := Processed{State: run.State, Version: run.Version, ParkReason: run.ParkReason, TriggerSource: run.TriggerSource,
		WorkflowVersion: run.WorkflowVersion, PayloadHash: run.PayloadHash, Duplicates: run.Duplicates,
		Reclaims: run.Reclaims, LeaseLive: run.LeaseLive(now), Claims: []Claim{}}
	if p.LeaseLive {
		p.LeaseExpiresAt = utc(run.LeaseExpiresAt)
	}
	for _, e := range evs {
		switch e.Kind {
		case "claimed", "lease_reclaimed":
			p.Claims = append(p.Claims, Claim{At: e.At.UTC(), Kind: e.Kind, Actor: e.Actor, Version: e.Version})
		case "payload_mismatch":
			p.PayloadMismatches++
		case "transition":
			if e.str("to") == string(run.State) && terminal(run.State) {
				p.FinishedAt, p.Reason = utc(&e.At), e.str("reason")
			}
		case "approval_decided":
			if e.str("to") == string(run.State) && terminal(run.State) {
				p.FinishedAt, p.Reason = utc(&e.At), e.str("decision")
			}
		case "run_unparked":
			if e.str("to") == string(run.State) && terminal(run.State) {
				p.FinishedAt, p.Reason = utc(&e.At), "unparked by "+e.Actor
			}
		}
	}
	if len(p.Claims) > 0 {
		p.Claimed = true
		p.ClaimedAt, p.ClaimedBy = &p.Claims[0].At, p.Claims[0].Actor
	}
	if run.LeaseOwner != "" {
		p.Claimed = true // its claim event may have outlived retention; the row remembers
	}
	by := "claimed"
	if p.ClaimedBy != "" {
		by += " by " + p.ClaimedBy
	}
	if p.ClaimedAt != nil {
		by += " at " + stamp(*p.ClaimedAt)
	}
	finished := ""
	if p.FinishedAt != nil {
		finished = " at " + stamp(*p.FinishedAt)
	}
	if p.Reason != "" {
		finished += " (" + p.Reason + ")"
	}
	var a string
	switch {
	case !p.Claimed:
		a = "no: the key is known but was never claimed"
	case run.State == store.StateProcessing && p.LeaseLive:
		a = "in progress: " + by + "; its lease is held until " + stamp(*p.LeaseExpiresAt)
	case run.State == store.StateProcessing:
		a = "stalled: " + by + "; the lease lapsed, so the next delivery of the key reclaims it"
	case run.State == store.StateCompleted:
		a = "yes: " + by + "; completed" + finished
	case run.State == store.StateFailedTerminal:
		a = "yes, and it failed for good: " + by + "; failed_terminal" + finished
	case run.State == store.StateRejected:
		a = "yes, and a person rejected it: " + by + "; rejected" + finished
	case run.State == store.StateFailedRetryable:
		a = "not finished: " + by + "; it failed and may be retried: the next delivery of the key reclaims it"
	case run.State == store.StateAwaitingHuman:
		a = "waiting for a person (" + run.ParkReason + "): " + by
	case run.State == store.StateApproved:
		a = "approved and waiting for its effects to be sent: " + by
	default:
		a = by + "; now " + string(run.State)
	}
	p.Answer = fmt.Sprintf("%s; %s refused, %s", a, plural(int(run.Duplicates), "duplicate delivery", "duplicate deliveries"),
		plural(int(run.Reclaims), "reclaim", "reclaims"))
	if p.PayloadMismatches > 0 {
		p.Answer += fmt.Sprintf(", %s with another payload refused", plural(p.PayloadMismatches, "delivery", "deliveries"))
	}
	return p
}

// sentKinds are the events that record an effect as done, and how to read them.
func sentBy(e event) (providerID string, ok bool) {
	switch e.Kind {
	case "effect_completed":
		return e.str("provider_id"), true
	case "effect_confirmed":
		return e.str("receipt"), true
	case "effect_reconciled":
		if e.str("provider_id") != "" || e.str("source") != "" { // a lookup found exactly one, or the dispatcher's late 2xx
			return e.str("provider_id"), true
		}
		if e.str("status") == "confirmed" { // the agent found exactly one
			if r, ok := e.detail["receipts"].([]any); ok && len(r) == 1 {
				return fmt.Sprint(r[0]), true
			}
			return "", true
		}
	case "effect_resolved":
		if e.str("outcome") == "sent" {
			return e.str("provider_id"), true
		}
	}
	return "", false
}

func sent(effs []store.Effect, evs []event, ap Approved, run store.Run) Sent {
	out := Sent{Effects: make([]Effect, 0, len(effs))}
	counts := map[string]int{}
	for _, e := range effs {
		v := Effect{ID: e.ID, EffectID: e.EffectID, ActionType: e.ActionType, Target: e.Target, Executor: e.Executor,
			State: e.State, Sent: e.State == store.EffectCompleted, ProviderID: e.ProviderID, Attempts: e.Attempts,
			LastErrorClass: e.LastErrorClass, QueuedAt: e.CreatedAt.UTC()}
		for _, ev := range evs {
			if ev.str("effect_id") != e.EffectID {
				continue
			}
			if _, ok := sentBy(ev); ok && v.Sent {
				v.SentAt, v.SentVia, v.SentBy = utc(&ev.At), ev.Kind, ev.Actor
			}
			if ev.Kind == "effect_queued" && ev.str("approval_id") != "" {
				v.ApprovalID = ev.str("approval_id")
			}
		}
		if v.Sent && v.SentAt == nil {
			v.SentAt = utc(&e.UpdatedAt) // its event outlived retention; the row remembers when
		}
		for _, a := range ap.AutoApprovals {
			v.AutoApproved = v.AutoApproved || a.EffectID == e.EffectID
		}
		out.Effects = append(out.Effects, v)
		switch e.State {
		case store.EffectCompleted:
			counts["sent"]++
		case store.EffectUnknown:
			counts["unknown"]++
		case store.EffectFailed:
			counts["failed"]++
		case store.EffectCancelled:
			counts["cancelled"]++
		default: // pending, sending, planned
			counts["waiting"]++
		}
	}
	n := len(effs)
	parts := []string{fmt.Sprintf("%d of %s sent", counts["sent"], plural(n, "effect", "effects"))}
	for _, k := range []string{"unknown", "failed", "waiting", "cancelled"} {
		if counts[k] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", counts[k], k))
		}
	}
	detail := strings.Join(parts, ", ")
	pending := slices.ContainsFunc(ap.Approvals, func(a Approval) bool { return a.Status == "pending" && a.Mode == policy.GateApproveBeforeAct })
	switch {
	case n == 0 && pending:
		out.Answer = "not yet: the effect waits for a person's approval; nothing was sent"
	case n == 0 && run.State == store.StateRejected:
		out.Answer = "no: the run was rejected; nothing was sent"
	case n == 0:
		out.Answer = "no: the run queued no effects"
	case counts["unknown"] > 0:
		out.Answer = "unknown: " + detail + " — an unknown effect may or may not have happened: check the provider, then `airlock effects resolve`"
	case counts["failed"] > 0:
		out.Answer = "no: " + detail
	case counts["waiting"] > 0:
		out.Answer = "not yet: " + detail
	case counts["sent"] == n:
		out.Answer = "yes: " + detail
		if n == 1 {
			e := out.Effects[0]
			out.Answer += fmt.Sprintf(" (%s → %s", e.ActionType, e.Target)
			if e.ProviderID != "" {
				out.Answer += ", provider id " + e.ProviderID
			}
			out.Answer += ", at " + stamp(*e.SentAt) + ")"
		}
	case counts["sent"] > 0:
		out.Answer = "partly: " + detail
	default:
		out.Answer = "no: " + detail
	}
	return out
}

func approved(aps []store.Approval, evs []event) Approved {
	out := Approved{Approvals: []Approval{}, AutoApprovals: []AutoApproval{}, AutoDeclined: []AutoDeclined{}}
	reviews := map[string]store.Approval{}
	for _, a := range aps {
		if a.Mode == approvals.ModeReview {
			reviews[a.ID] = a
			continue
		}
		v := Approval{ID: a.ID, Mode: a.Mode, ActionType: a.ActionType, Target: a.Target, EffectID: a.EffectID,
			RequestedBy: a.RequestedBy, RequestedAt: a.CreatedAt.UTC(), ExpiresAt: a.ExpiresAt.UTC(), Decision: a.Decision,
			Reason: a.Reason, DecidedAt: utc(a.ConsumedAt)}
		switch {
		case a.ConsumedAt == nil:
			v.Status = "pending"
		case a.Decision == approvals.Approve:
			v.Status = "approved"
		case a.Decision == approvals.Reject:
			v.Status = "rejected"
		case a.Decision == approvals.Cancel:
			v.Status = "cancelled"
		case a.Decision == "expired" && a.Mode == policy.GateActWithWindow:
			v.Status = "window_closed" // nobody cancelled: the effect went ahead
		default:
			v.Status = a.Decision
		}
		if a.ConsumedAt != nil && a.Decision != "expired" {
			v.Approver = a.ApproverSubject
			w := a.ConsumedAt.Sub(a.CreatedAt).Seconds()
			v.WaitSeconds = &w
		}
		out.Approvals = append(out.Approvals, v)
	}
	for _, e := range evs {
		switch e.Kind {
		case "auto_approved":
			a := AutoApproval{At: e.At.UTC(), EffectID: e.str("effect_id"), Rule: e.str("rule"),
				PolicyVersion: e.str("policy_version"), ReviewID: e.str("review_id")}
			if src, ok := e.detail["evidence_sources"].([]any); ok {
				for _, s := range src {
					a.EvidenceSources = append(a.EvidenceSources, fmt.Sprint(s))
				}
			}
			if r, ok := reviews[a.ReviewID]; ok {
				a.Review = "pending"
				if r.ConsumedAt != nil {
					a.Review, a.ReviewedBy, a.ReviewedAt = r.Decision, r.ApproverSubject, utc(r.ConsumedAt)
				}
			}
			out.AutoApprovals = append(out.AutoApprovals, a)
		case "auto_approval_declined":
			out.AutoDeclined = append(out.AutoDeclined, AutoDeclined{At: e.At.UTC(), Reason: e.str("reason"),
				Rule: e.str("rule"), PolicyVersion: e.str("policy_version")})
		}
	}
	var parts []string
	for _, a := range out.Approvals {
		switch a.Status {
		case "approved":
			parts = append(parts, fmt.Sprintf("approved by %s at %s after %s (%s, %s)", a.Approver, stamp(*a.DecidedAt),
				seconds(*a.WaitSeconds), a.Mode, a.ActionType))
		case "rejected":
			parts = append(parts, fmt.Sprintf("rejected by %s at %s: %q (%s)", a.Approver, stamp(*a.DecidedAt), a.Reason, a.ActionType))
		case "cancelled":
			parts = append(parts, fmt.Sprintf("cancelled in its window by %s at %s (%s)", a.Approver, stamp(*a.DecidedAt), a.ActionType))
		case "window_closed":
			parts = append(parts, fmt.Sprintf("nobody cancelled %s in its window (act_with_window, closed %s)", a.ActionType, stamp(a.ExpiresAt)))
		case "pending":
			if a.Mode == policy.GateActWithWindow {
				parts = append(parts, fmt.Sprintf("nobody needs to: %s goes ahead when its window closes at %s unless someone cancels it (act_with_window)",
					a.ActionType, stamp(a.ExpiresAt)))
				continue
			}
			parts = append(parts, fmt.Sprintf("waiting: %s requested by %s at %s (%s), expires %s", a.ActionType, a.RequestedBy,
				stamp(a.RequestedAt), a.Mode, stamp(a.ExpiresAt)))
		case "expired":
			parts = append(parts, fmt.Sprintf("nobody decided: the approval of %s expired at %s", a.ActionType, stamp(a.ExpiresAt)))
		default:
			parts = append(parts, fmt.Sprintf("%s: %s", a.ActionType, a.Status))
		}
	}
	for _, a := range out.AutoApprovals {
		s := fmt.Sprintf("auto-approved %s by rule %q (policy version %s) at %s", a.EffectID, a.Rule, a.PolicyVersion, stamp(a.At))
		if a.Review != "" {
			s += ", review " + a.Review
			if a.ReviewedBy != "" {
				s += " by " + a.ReviewedBy
			}
		}
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		out.Answer = "nobody: no approval was needed (no gated action was asked for)"
	} else {
		out.Answer = strings.Join(parts, "; ")
	}
	return out
}

func model(run store.Run, evs []event) Model {
	out := Model{Models: []ModelSeen{}, WorkflowVersions: []string{}, ProviderCategories: []string{}, Validations: []Validation{}}
	addUnique := func(list *[]string, v string) {
		if v != "" && !slices.Contains(*list, v) {
			*list = append(*list, v)
		}
	}
	addUnique(&out.WorkflowVersions, run.WorkflowVersion)
	for _, e := range evs {
		addUnique(&out.WorkflowVersions, e.meta.WorkflowVersion)
		addUnique(&out.ProviderCategories, e.meta.ProviderCategory)
		if m := e.meta.Model; m != nil && *m != (runs.Model{}) {
			i := slices.IndexFunc(out.Models, func(s ModelSeen) bool {
				return s.Provider == m.Provider && s.Name == m.Name && s.Revision == m.Revision
			})
			if i < 0 {
				out.Models = append(out.Models, ModelSeen{Provider: m.Provider, Name: m.Name, Revision: m.Revision, FirstSeen: e.At.UTC(), Kinds: []string{}})
				i = len(out.Models) - 1
			}
			out.Models[i].LastSeen = e.At.UTC()
			addUnique(&out.Models[i].Kinds, e.Kind)
		}
		if e.Kind == "validation" {
			v := Validation{At: e.At.UTC(), ActionType: e.str("action_type"), Valid: e.detail["valid"] == true,
				Repaired: e.detail["repaired"] == true, OutputHash: e.str("output_hash"), Model: e.meta.Model}
			if raw, err := json.Marshal(e.detail["errors"]); err == nil {
				_ = json.Unmarshal(raw, &v.Errors)
			}
			out.Validations = append(out.Validations, v)
		}
	}
	var parts []string
	if len(out.Models) == 0 {
		parts = append(parts, "not recorded: no request on this run carried meta.model")
	} else {
		var names []string
		for _, m := range out.Models {
			names = append(names, ModelName(m.Provider, m.Name, m.Revision))
		}
		parts = append(parts, strings.Join(names, ", "))
	}
	if len(out.WorkflowVersions) > 0 {
		parts = append(parts, "workflow "+strings.Join(out.WorkflowVersions, ", "))
	}
	if n := len(out.Validations); n > 0 {
		valid, repaired := 0, 0
		for _, v := range out.Validations {
			if v.Valid {
				valid++
			}
			if v.Repaired {
				repaired++
			}
		}
		s := fmt.Sprintf("%s: %d valid, %d invalid", plural(n, "validation", "validations"), valid, n-valid)
		if repaired > 0 {
			s += fmt.Sprintf(" (%d repaired)", repaired)
		}
		parts = append(parts, s)
	} else {
		parts = append(parts, "no validation")
	}
	out.Answer = strings.Join(parts, "; ")
	return out
}

// ModelName is provider/name (revision r).
func ModelName(provider, name, revision string) string {
	s := name
	if provider != "" {
		s = provider + "/" + s
	}
	if revision != "" {
		s += " (revision " + revision + ")"
	}
	return s
}

func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func seconds(s float64) string {
	return (time.Duration(s * float64(time.Second))).Round(time.Second).String()
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
