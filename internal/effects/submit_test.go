package effects_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/failures"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// decisions records what the approvals service reports to its observer (metrics).
type decisions struct {
	runs.NopObserver
	mu  sync.Mutex
	got []string
}

func (d *decisions) Decision(mode, decision string, _ time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.got = append(d.got, mode+":"+decision)
}

func (d *decisions) list() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.got)
}

// submitEnv is one backend's outbox and gate, with helpers that write down what a
// request left behind.
type submitEnv struct {
	t   *testing.T
	e   *apptest.EffectsEnv
	obs *decisions
}

func (s submitEnv) claim(key string) store.Run {
	s.t.Helper()
	res, err := s.e.Runs.Claim(context.Background(), runs.ClaimRequest{Key: key, PayloadHash: "h-" + key, Actor: "test",
		TriggerSource: "zendesk", Lease: time.Hour})
	if err != nil || !res.Claimed {
		s.t.Fatalf("claim %s: %+v %v", key, res, err)
	}
	return res.Run
}

func (s submitEnv) submit(r store.Run, action, payload, gate string) (effects.Submitted, error) {
	req := effects.QueueRequest{Key: r.Key, Owner: r.LeaseOwner, Version: r.Version, ActionType: action,
		Target: "default", Actor: "apikey:n8n", Gate: gate}
	if payload != "" {
		req.Payload = json.RawMessage(payload)
	}
	return s.e.Effects.Submit(context.Background(), req)
}

func (s submitEnv) validate(r store.Run, action, output string) {
	s.t.Helper()
	res, err := s.e.Failures.Validate(context.Background(), failures.ValidateRequest{
		LeaseRequest: runs.LeaseRequest{Key: r.Key, Owner: r.LeaseOwner, Version: r.Version, Actor: "test"},
		ActionType:   action, Output: json.RawMessage(output)})
	if err != nil || !res.Valid {
		s.t.Fatalf("validate %s: %+v %v", r.Key, res, err)
	}
}

func (s submitEnv) evidence(key string, score float64) {
	s.t.Helper()
	if _, err := s.e.Approvals.RecordEvidence(context.Background(), key, "classifier", "score",
		json.RawMessage(fmt.Sprint(score)), "apikey:classifier"); err != nil {
		s.t.Fatal(err)
	}
}

// transcript is everything a run's requests wrote, in order, without the random parts
// (ids, tokens, hashes): each event as kind, actor, run version and the names of its
// detail fields (with the values that say what was decided), then each approval and
// effect with its times relative to the test clock's start.
func (s submitEnv) transcript(key string, start time.Time) string {
	s.t.Helper()
	ctx := context.Background()
	evs, err := s.e.Store.EventList(ctx, key, 0, 100)
	if err != nil {
		s.t.Fatal(err)
	}
	var b strings.Builder
	for _, ev := range evs {
		var d map[string]any
		_ = json.Unmarshal(ev.Detail, &d)
		var fields []string
		for k, v := range d {
			switch k {
			case "policy_version":
				fields = append(fields, fmt.Sprintf("%s=current:%v", k, v == s.e.Policy.Version))
			case "reason", "mode", "rule", "evidence_sources", "action_type", "executor", "to":
				fields = append(fields, fmt.Sprintf("%s=%v", k, v))
			default:
				fields = append(fields, k)
			}
		}
		slices.Sort(fields)
		fmt.Fprintf(&b, "event %s by %s v%d {%s}\n", ev.Kind, ev.Actor, ev.Version, strings.Join(fields, " "))
	}
	aps, err := s.e.Store.ApprovalsByRun(ctx, key)
	if err != nil {
		s.t.Fatal(err)
	}
	for _, a := range aps {
		fmt.Fprintf(&b, "approval %s %v expires +%s by %q sod=%v %s/%s consumed=%v\n", a.Mode, a.AllowedDecisions,
			a.ExpiresAt.Sub(start), a.RequestedBy, a.SeparationOfDuties, a.ActionType, a.Target, a.ConsumedAt != nil)
	}
	effs, err := s.e.Store.EffectList(ctx, store.EffectListParams{RunKey: key, Limit: 100})
	if err != nil {
		s.t.Fatal(err)
	}
	for _, e := range effs {
		fmt.Fprintf(&b, "effect %s %s/%s %s not_before +%s\n", e.State, e.ActionType, e.Target, e.Executor, e.NotBefore.Sub(start))
	}
	run, err := s.e.Store.RunGet(ctx, key)
	if err != nil {
		s.t.Fatal(err)
	}
	fmt.Fprintf(&b, "run %s v%d park=%q\n", run.State, run.Version, run.ParkReason)
	return b.String()
}

func (s submitEnv) want(key string, start time.Time, want string) {
	s.t.Helper()
	if got := s.transcript(key, start); got != strings.TrimLeft(want, "\n") {
		s.t.Errorf("%s wrote:\n%s\nwant:\n%s", key, got, strings.TrimLeft(want, "\n"))
	}
}

// TestSubmitPerGateMode holds what Submit writes for each gate mode — events in order,
// approvals, effects and the run — and what the same request sent again answers, on
// every backend: the refactor of Submit into one type per gate mode must leave each
// transcript as it is.
func TestSubmitPerGateMode(t *testing.T) {
	storetest.Each(t, func(t *testing.T, b storetest.Backend) {
		e := apptest.NewEffectsEnv(t, b, "")
		e.AddApprover(t, "lee", "support-lead")
		obs := &decisions{}
		e.Approvals.Observer = obs
		s := submitEnv{t: t, e: e, obs: obs}
		start := e.Clock.Now()
		ctx := context.Background()

		// none: queued now.
		r := s.claim("none")
		sub, err := s.submit(r, "note", `{"n":1}`, "")
		if err != nil || !sub.Created || sub.Approval != nil || sub.Run.Version != r.Version {
			t.Fatalf("none: %+v %v", sub, err)
		}
		again, err := s.submit(r, "note", `{"n":1}`, "")
		if err != nil || again.Created || again.Approval != nil || again.Effect.ID != sub.Effect.ID {
			t.Fatalf("none again: %+v %v", again, err)
		}
		if _, err := s.submit(r, "note", `{"n":2}`, ""); !errors.Is(err, effects.ErrEffectMismatch) {
			t.Fatalf("none, another payload: %v", err)
		}
		s.want("none", start, `
event claimed by test v1 {lease_expires_at payload_hash}
event effect_queued by apikey:n8n v1 {action_type=note effect_id executor=dispatcher not_before payload_fields payload_hash target}
effect pending note/default dispatcher not_before +0s
run processing v1 park=""
`)
		// A gated type without the approvals service is refused before anything is written.
		r = s.claim("nogate")
		if _, err := e.NewService(e.Store, e.Clock.Now).Submit(ctx, effects.QueueRequest{Key: r.Key, Owner: r.LeaseOwner, Version: r.Version,
			ActionType: "email", Target: "default", Payload: json.RawMessage(`{"text":"x"}`), Actor: "apikey:n8n"}); !errors.Is(err, effects.ErrApprovalRequired) {
			t.Fatalf("gated without approvals: %v", err)
		}
		// A client may ask for a stricter gate, never a weaker one.
		if _, err := s.submit(r, "email", `{"text":"x"}`, policy.GateNone); !errors.Is(err, policy.ErrGateTooWeak) {
			t.Fatalf("weaker gate: %v", err)
		}
		var fe *runs.FieldError
		if _, err := s.submit(r, "note", `{"n":1}`, policy.GateApproveBeforeAct); !errors.As(err, &fe) || fe.Field != "gate" {
			t.Fatalf("stricter gate without approvers: %v", err)
		}
		s.want("nogate", start, `
event claimed by test v1 {lease_expires_at payload_hash}
run processing v1 park=""
`)

		// approve_before_act: held for a person; nothing enters the outbox. The same
		// request again (its 202 lost) gets a fresh link; with another payload it is refused.
		r = s.claim("before")
		sub, err = s.submit(r, "email", `{"text":"hi"}`, "")
		if err != nil || sub.Approval == nil || sub.Created || sub.Approval.Reissued || sub.Run.State != store.StateAwaitingHuman {
			t.Fatalf("before: %+v %v", sub, err)
		}
		again, err = s.submit(r, "email", `{"text":"hi"}`, "")
		if err != nil || again.Approval == nil || !again.Approval.Reissued || again.Approval.Approval.ID != sub.Approval.Approval.ID ||
			again.Approval.Token == sub.Approval.Token || again.Run.Version != sub.Run.Version {
			t.Fatalf("before again: %+v %v", again, err)
		}
		if _, err := s.submit(r, "email", `{"text":"other"}`, ""); !errors.Is(err, effects.ErrEffectMismatch) {
			t.Fatalf("before, another payload: %v", err)
		}
		s.want("before", start, `
event claimed by test v1 {lease_expires_at payload_hash}
event approval_requested by apikey:n8n v2 {action_type=email approval_id approver_roles approver_subjects effect_id expires_at mode=approve_before_act payload_fields payload_hash requested_by requesters target}
event approval_link_reissued by apikey:n8n v2 {approval_id effect_id expires_at mode=approve_before_act}
approval approve_before_act [approve reject] expires +1h0m0s by "apikey:n8n" sod=true email/default consumed=false
run awaiting_human v2 park="approval"
`)
		// A stricter gate than the type's: digest (act_with_window) held before it acts.
		r = s.claim("stricter")
		if sub, err := s.submit(r, "digest", `{"w":1}`, policy.GateApproveBeforeAct); err != nil || sub.Approval == nil || sub.Created {
			t.Fatalf("stricter: %+v %v", sub, err)
		}
		s.want("stricter", start, `
event claimed by test v1 {lease_expires_at payload_hash}
event approval_requested by apikey:n8n v2 {action_type=digest approval_id approver_roles approver_subjects effect_id expires_at mode=approve_before_act payload_fields payload_hash requested_by requesters target}
approval approve_before_act [approve reject] expires +24h0m0s by "apikey:n8n" sod=true digest/default consumed=false
run awaiting_human v2 park="approval"
`)

		// act_with_window: queued to leave when the window closes, with a cancel link;
		// the same request again while it is pending gets a fresh cancel link.
		r = s.claim("window")
		sub, err = s.submit(r, "digest", `{"w":1}`, "")
		if err != nil || !sub.Created || sub.Approval == nil || sub.Approval.Reissued || !sub.Effect.NotBefore.Equal(start.Add(10*time.Minute)) {
			t.Fatalf("window: %+v %v", sub, err)
		}
		again, err = s.submit(r, "digest", `{"w":1}`, "")
		if err != nil || again.Created || again.Approval == nil || !again.Approval.Reissued || again.Approval.Approval.ID != sub.Approval.Approval.ID {
			t.Fatalf("window again: %+v %v", again, err)
		}
		if _, err := s.submit(r, "digest", `{"w":2}`, ""); !errors.Is(err, effects.ErrEffectMismatch) {
			t.Fatalf("window, another payload: %v", err)
		}
		s.want("window", start, `
event claimed by test v1 {lease_expires_at payload_hash}
event effect_queued by apikey:n8n v1 {action_type=digest effect_id executor=dispatcher not_before payload_fields payload_hash target}
event cancel_window_opened by apikey:n8n v1 {approval_id effect_id not_before}
event approval_link_reissued by apikey:n8n v1 {approval_id effect_id expires_at mode=act_with_window}
approval act_with_window [cancel] expires +10m0s by "apikey:n8n" sod=false digest/default consumed=false
effect pending digest/default dispatcher not_before +10m0s
run processing v1 park=""
`)
		// Once the window has closed (its link expired), the same request again is the
		// stored effect, with no link.
		e.Clock.Advance(11 * time.Minute)
		again, err = s.submit(r, "digest", `{"w":1}`, "")
		if err != nil || again.Created || again.Approval != nil {
			t.Fatalf("window closed, again: %+v %v", again, err)
		}
		start = start.Add(11 * time.Minute)

		// approve_by_exception, the rule holding over recorded evidence: queued now,
		// auto-approved and (sample_rate 1) put on the review list.
		r = s.claim("auto")
		s.validate(r, "triage", `{"label":"spam"}`)
		s.evidence("auto", 0.99)
		sub, err = s.submit(r, "triage", "", "")
		if err != nil || !sub.Created || sub.Approval != nil {
			t.Fatalf("auto: %+v %v", sub, err)
		}
		again, err = s.submit(r, "triage", "", "")
		if err != nil || again.Created || again.Approval != nil {
			t.Fatalf("auto again: %+v %v", again, err)
		}
		s.want("auto", start, `
event claimed by test v1 {lease_expires_at payload_hash}
event validation by test v1 {action_type=triage max_repairs output_hash repaired repairs valid}
event evidence_recorded by apikey:classifier v1 {name source value}
event effect_queued by apikey:n8n v1 {action_type=triage effect_id executor=dispatcher not_before payload_fields payload_hash target}
event auto_approved by airlock v1 {effect_id evidence_sources=[classifier] policy_version=current:true review_id rule=output.label in ["duplicate", "spam"] && evidence["classifier"]["score"] >= 0.95}
approval review [confirm flag] expires +168h0m0s by "airlock" sod=false triage/default consumed=false
effect pending triage/default dispatcher not_before +0s
run processing v1 park=""
`)
		// Any doubt (here the evaluator's score is too low): a person decides, and the
		// approval keeps the type's mode.
		r = s.claim("declined")
		s.validate(r, "triage", `{"label":"spam"}`)
		s.evidence("declined", 0.5)
		sub, err = s.submit(r, "triage", "", "")
		if err != nil || sub.Created || sub.Approval == nil || sub.Run.State != store.StateAwaitingHuman {
			t.Fatalf("declined: %+v %v", sub, err)
		}
		again, err = s.submit(r, "triage", "", "")
		if err != nil || again.Approval == nil || !again.Approval.Reissued {
			t.Fatalf("declined again: %+v %v", again, err)
		}
		s.want("declined", start, `
event claimed by test v1 {lease_expires_at payload_hash}
event validation by test v1 {action_type=triage max_repairs output_hash repaired repairs valid}
event evidence_recorded by apikey:classifier v1 {name source value}
event auto_approval_declined by airlock v1 {policy_version=current:true reason=rule_false rule=output.label in ["duplicate", "spam"] && evidence["classifier"]["score"] >= 0.95}
event approval_requested by apikey:n8n v2 {action_type=triage approval_id approver_roles approver_subjects effect_id expires_at mode=approve_by_exception payload_fields payload_hash requested_by requesters target}
event approval_link_reissued by apikey:n8n v2 {approval_id effect_id expires_at mode=approve_by_exception}
approval approve_by_exception [approve reject] expires +24h0m0s by "apikey:n8n" sod=true triage/default consumed=false
run awaiting_human v2 park="approval"
`)
		// Only the auto-approval is a decision the gate reports by itself.
		if got := obs.list(); !slices.Equal(got, []string{"approve_by_exception:auto"}) {
			t.Errorf("observed decisions %v", got)
		}
	})
}
