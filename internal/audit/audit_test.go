package audit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/failures"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

var ctx = context.Background()

var lead = approvals.Person{Subject: "lead", Roles: []string{"support-lead"}}

func equal[T any](t *testing.T, what string, got, want T) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s = %v, want %v", what, got, want)
	}
}

func f(v float64) *float64 { return &v }

// scenario drives one environment's services as a workflow would.
type scenario struct {
	t *testing.T
	e *apptest.EffectsEnv
}

func (s scenario) claim(key string, meta *runs.Meta) runs.ClaimResult {
	s.t.Helper()
	res, err := s.e.Runs.Claim(ctx, runs.ClaimRequest{Key: key, PayloadHash: "h-" + key, Actor: "apikey:n8n", Meta: meta})
	if err != nil {
		s.t.Fatalf("claim %s: %v", key, err)
	}
	return res
}

func (s scenario) lease(key string, meta *runs.Meta) runs.LeaseRequest {
	s.t.Helper()
	run, err := s.e.Runs.Get(ctx, key)
	if err != nil {
		s.t.Fatal(err)
	}
	return runs.LeaseRequest{Key: key, Owner: run.LeaseOwner, Version: run.Version, Actor: "apikey:n8n", Meta: meta}
}

func (s scenario) validate(key, action, output string, meta *runs.Meta) bool {
	s.t.Helper()
	res, err := s.e.Failures.Validate(ctx, failures.ValidateRequest{LeaseRequest: s.lease(key, meta), ActionType: action, Output: json.RawMessage(output)})
	if err != nil {
		s.t.Fatalf("validate %s: %v", key, err)
	}
	return res.Valid
}

func (s scenario) submit(key, action, payload string, meta *runs.Meta, evidence ...approvals.Evidence) effects.Submitted {
	s.t.Helper()
	l := s.lease(key, meta)
	var p json.RawMessage
	if payload != "" {
		p = json.RawMessage(payload)
	}
	for _, ev := range evidence { // recorded by an evaluator key named after its source
		v, _ := json.Marshal(ev.Value)
		if _, err := s.e.Approvals.RecordEvidence(ctx, key, ev.Source, ev.Name, v, "apikey:"+ev.Source); err != nil {
			s.t.Fatal(err)
		}
	}
	sub, err := s.e.Effects.Submit(ctx, effects.QueueRequest{Key: key, Owner: l.Owner, Version: l.Version, ActionType: action,
		Target: "default", Payload: p, Actor: "apikey:n8n", Meta: meta})
	if err != nil {
		s.t.Fatalf("submit %s on %s: %v", action, key, err)
	}
	return sub
}

func (s scenario) tick() {
	s.t.Helper()
	if _, err := s.e.Dispatcher.Tick(ctx); err != nil {
		s.t.Fatal(err)
	}
}

// replies answers the provider's sends: 503 or 500 for the runs named, else 201 with an id.
func replies(status map[string]int) func(w http.ResponseWriter, r *http.Request, n int) {
	return func(w http.ResponseWriter, r *http.Request, n int) {
		key := r.Header.Get("Idempotency-Key")
		if code, ok := status[strings.SplitN(key, "/", 2)[0]]; ok {
			w.WriteHeader(code)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"p-%s"}`, key)
	}
}

// TestReport scripts a week with known counts and checks every figure exactly.
func TestReport(t *testing.T) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			e := apptest.NewEffectsEnv(t, b, "")
			e.AddApprover(t, "lee", "support-lead")
			s := scenario{t, e}
			e.Provider.Reply = replies(map[string]int{"r2": http.StatusServiceUnavailable, "r4": http.StatusInternalServerError})

			// Outside the window: a run and a duplicate eight days ago.
			s.claim("old-1", nil)
			s.claim("old-1", nil)
			e.Clock.Advance(8 * 24 * time.Hour)

			// 10 deliveries: 7 claims, 3 duplicates.
			for i := 1; i <= 7; i++ {
				s.claim(fmt.Sprintf("r%d", i), nil)
			}
			for _, k := range []string{"r1", "r1", "r2"} {
				if s.claim(k, nil).Claimed {
					t.Fatalf("%s claimed twice", k)
				}
			}
			// 4 validations, 1 invalid.
			for _, v := range []struct {
				key, output string
				valid       bool
			}{{"r3", `{"label":"nope"}`, false}, {"r3", `{"label":"spam"}`, true}, {"r4", `{"label":"other"}`, true}, {"r5", `{"label":"duplicate"}`, true}} {
				equal(t, "valid "+v.output, s.validate(v.key, "triage", v.output, nil), v.valid)
			}
			// An auto-approval (triage's rule holds with the classifier's evidence)…
			if sub := s.submit("r3", "triage", "", nil, approvals.Evidence{Source: "classifier", Name: "score", Value: 0.97}); !sub.Created || sub.Approval != nil {
				t.Fatalf("triage was not auto-approved: %+v", sub)
			}
			// …and a person's approval, 90 seconds after the request.
			sub := s.submit("r6", "email", `{"to":"ana@example.com","text":"refund"}`, nil)
			if sub.Approval == nil {
				t.Fatal("email was not gated")
			}
			e.Clock.Advance(90 * time.Second)
			if _, err := e.Approvals.Decide(ctx, approvals.HashToken(sub.Approval.Token), approvals.Approve, "", lead); err != nil {
				t.Fatal(err)
			}
			// A run's failure table reaches its cap (parse_failure: 2 attempts).
			for i, want := range []string{failures.DecisionRetry, failures.DecisionTerminal} {
				d, err := e.Failures.Failure(ctx, failures.FailureRequest{LeaseRequest: s.lease("r7", nil), Class: "parse_failure"})
				if err != nil || d.Decision != want {
					t.Fatalf("failure %d: %+v %v", i+1, d, err)
				}
			}
			// Two notes: r2's provider answers 503 until the effect's cap (3 attempts), r4's 500 (unknown).
			s.submit("r2", "note", `{"n":2}`, nil)
			s.submit("r4", "note", `{"n":4}`, nil)
			s.tick()
			for range 2 {
				e.Clock.Advance(5 * time.Second)
				s.tick()
			}

			rep, err := audit.New(e.Store, e.Clock.Now).ReportLast(ctx, 7*24*time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			equal(t, "until", rep.Until, e.Clock.Now().UTC())
			equal(t, "since", rep.Since, e.Clock.Now().Add(-7*24*time.Hour).UTC())
			equal(t, "runs", rep.Runs, 7)
			equal(t, "new runs", rep.NewRuns, 7)
			equal(t, "claims", rep.Claims, 7)
			equal(t, "reclaims", rep.Reclaims, 0)
			equal(t, "duplicates", rep.Duplicates, 3)
			equal(t, "duplicate rate", rep.DuplicateRate, f(0.3))
			equal(t, "validations", rep.Validations, 4)
			equal(t, "invalid", rep.ValidationsInvalid, 1)
			equal(t, "validation failure rate", rep.ValidationFailureRate, f(0.25))
			equal(t, "gate wait", rep.GateWait, audit.GateWait{Decided: 1, P50Seconds: f(90), P95Seconds: f(90), MaxSeconds: f(90),
				Method: "nearest-rank over approval_requested → approval_decided"})
			equal(t, "approvals", rep.Approvals, audit.Approvals{Auto: 1, HumanApproved: 1, AutoShare: f(0.5)})
			equal(t, "retry-cap hits", rep.RetryCapHits, audit.RetryCapHits{Runs: 1, Effects: 1, Total: 2})
			equal(t, "effects", rep.Effects, audit.EffectCounts{Queued: 4, Sent: 2, Failed: 1, Unknown: 1, UnknownOutstanding: 1, FailedOutstanding: 1})
			equal(t, "alerts", rep.Alerts, map[string]int64{"retry_cap": 1, "effect_failed": 1, "effect_unknown": 1})
			equal(t, "kill switch", rep.KillSwitch, audit.KillSwitch{Enabled: true, DisabledScopes: []string{}})

			// The window starts where asked: from the beginning, the old run counts too.
			all, err := audit.New(e.Store, e.Clock.Now).Report(ctx, time.Time{})
			if err != nil {
				t.Fatal(err)
			}
			equal(t, "all-time duplicate rate", all.DuplicateRate, f(4.0/12))
			equal(t, "all-time runs", all.Runs, 8)

			// A kill switch held for one type shows.
			if err := e.Effects.SetKillSwitch(ctx, effects.ActionScope("note"), false, "CRM outage", "cli:ops"); err != nil {
				t.Fatal(err)
			}
			rep, err = audit.New(e.Store, e.Clock.Now).ReportLast(ctx, 7*24*time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			equal(t, "kill switch", rep.KillSwitch, audit.KillSwitch{Enabled: true, DisabledScopes: []string{"action:note"}})
			equal(t, "runs (the kill switch's events belong to none)", rep.Runs, 7)

			var text bytes.Buffer
			if err := audit.WriteReport(&text, rep); err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{"duplicate-delivery rate", "30.0%", "duplicates / (claims + duplicates) = 3 / (7 + 3)", "gate wait p50", "1m30s",
				"25.0%", "invalid / validations = 1 / 4", "1 : 1", "1 run (failure table) + 1 effect (outbox max_attempts)", "action:note"} {
				if !strings.Contains(text.String(), want) {
					t.Errorf("report text lacks %q:\n%s", want, text.String())
				}
			}

			// The auto-approved run explains its rule and the policy version.
			x, err := audit.New(e.Store, e.Clock.Now).Explain(ctx, "r3")
			if err != nil {
				t.Fatal(err)
			}
			if len(x.Approved.AutoApprovals) != 1 {
				t.Fatalf("auto-approvals: %+v", x.Approved)
			}
			a := x.Approved.AutoApprovals[0]
			equal(t, "rule", a.Rule, e.Policy.Action("triage").RuleSource)
			equal(t, "policy version", a.PolicyVersion, e.Policy.Version)
			equal(t, "review", a.Review, "pending") // sample_rate 1
			equal(t, "evidence sources", a.EvidenceSources, []string{"classifier"})
			if len(x.Sent.Effects) != 1 || !x.Sent.Effects[0].AutoApproved || !x.Sent.Effects[0].Sent {
				t.Fatalf("auto-approved effect: %+v", x.Sent.Effects)
			}
			if !strings.Contains(x.Approved.Answer, "auto-approved") || !strings.Contains(x.Approved.Answer, e.Policy.Version) {
				t.Fatalf("approved answer: %s", x.Approved.Answer)
			}
			// The capped run says why it ended.
			x, err = audit.New(e.Store, e.Clock.Now).Explain(ctx, "r7")
			if err != nil {
				t.Fatal(err)
			}
			equal(t, "r7 state", x.Processed.State, store.StateFailedTerminal)
			equal(t, "r7 reason", x.Processed.Reason, "retry_cap")
		})
	}
}

// TestExplain follows one run that was delivered twice, validated, had one effect
// reconciled after an unknown send and another approved by a person and sent.
func TestExplain(t *testing.T) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			e := apptest.NewEffectsEnv(t, b, "")
			e.AddApprover(t, "lee", "support-lead")
			s := scenario{t, e}
			e.Provider.Reply = replies(map[string]int{}) // the note's first send is answered 500 below
			t0 := e.Clock.Now()
			wf := &runs.Meta{WorkflowVersion: "wf-7@v3", TriggerSource: "helpdesk"}
			drafted := &runs.Meta{WorkflowVersion: "wf-7@v3", ProviderCategory: "local",
				Model: &runs.Model{Provider: "local", Name: "qwen2.5", Revision: "q4"}}

			s.claim("ticket-42", wf)
			s.claim("ticket-42", wf)
			equal(t, "invalid draft", s.validate("ticket-42", "reply", `{"label":"nope","text":"x"}`, drafted), false)
			equal(t, "valid draft", s.validate("ticket-42", "reply", `{"label":"refund","text":"Your refund is on its way"}`, drafted), true)

			// A CRM note whose send times out at the provider (500): unknown, then found by lookup.
			e.Provider.Reply = replies(map[string]int{"ticket-42": http.StatusInternalServerError})
			note := s.submit("ticket-42", "note", `{"note":"refund approved"}`, nil).Effect
			s.tick()
			e.Provider.Found[effects.ProviderKey(note)] = []string{"crm-77"}
			if err := e.Effects.Reconcile(ctx); err != nil {
				t.Fatal(err)
			}
			e.Provider.Reply = replies(map[string]int{})

			// The reply email needs a person: approved two minutes later, then sent.
			sub := s.submit("ticket-42", "email", `{"to":"ana@example.com","text":"Your refund is on its way"}`, &runs.Meta{RequestedBy: "ana"})
			e.Clock.Advance(2 * time.Minute)
			if _, err := e.Approvals.Decide(ctx, approvals.HashToken(sub.Approval.Token), approvals.Approve, "", lead); err != nil {
				t.Fatal(err)
			}
			s.tick()

			x, err := audit.New(e.Store, e.Clock.Now).Explain(ctx, "ticket-42")
			if err != nil {
				t.Fatal(err)
			}
			t1 := t0.Add(2 * time.Minute).UTC()

			// Processed?
			p := x.Processed
			equal(t, "claimed", p.Claimed, true)
			equal(t, "claimed by", p.ClaimedBy, "apikey:n8n")
			equal(t, "claimed at", *p.ClaimedAt, t0.UTC())
			equal(t, "state", p.State, store.StateCompleted)
			equal(t, "finished at", *p.FinishedAt, t1)
			equal(t, "reason", p.Reason, "effects_completed")
			equal(t, "duplicates", p.Duplicates, 1)
			equal(t, "reclaims", p.Reclaims, 0)
			equal(t, "trigger", p.TriggerSource, "helpdesk")
			equal(t, "claims", len(p.Claims), 1)
			equal(t, "processed answer", p.Answer, "yes: claimed by apikey:n8n at 2026-11-30T09:00:00Z; completed at 2026-11-30T09:02:00Z (effects_completed); 1 duplicate delivery refused, 0 reclaims")

			// Sent?
			if len(x.Sent.Effects) != 2 {
				t.Fatalf("effects: %+v", x.Sent.Effects)
			}
			n, m := x.Sent.Effects[0], x.Sent.Effects[1]
			equal(t, "note", []any{n.EffectID, n.State, n.Sent, n.ProviderID, n.SentVia, n.SentBy, n.LastErrorClass, *n.SentAt},
				[]any{note.EffectID, store.EffectCompleted, true, "crm-77", "effect_reconciled", "airlock", "http_500", t0.UTC()})
			emailID := effects.DeriveEffectID("email", "default")
			equal(t, "email", []any{m.EffectID, m.State, m.ProviderID, m.SentVia, m.ApprovalID, *m.SentAt},
				[]any{emailID, store.EffectCompleted, "p-ticket-42/" + emailID, "effect_completed", sub.Approval.Approval.ID, t1})
			equal(t, "sent answer", x.Sent.Answer, "yes: 2 of 2 effects sent")

			// Who approved?
			if len(x.Approved.Approvals) != 1 {
				t.Fatalf("approvals: %+v", x.Approved)
			}
			a := x.Approved.Approvals[0]
			equal(t, "approval", []any{a.Mode, a.Status, a.Decision, a.Approver, a.RequestedBy, a.RequestedAt, *a.DecidedAt, *a.WaitSeconds},
				[]any{"approve_before_act", "approved", "approve", "lead", "ana", t0.UTC(), t1, 120.0})
			equal(t, "approved answer", x.Approved.Answer, "approved by lead at 2026-11-30T09:02:00Z after 2m0s (approve_before_act, email)")

			// Which model?
			equal(t, "models", len(x.Model.Models), 1)
			mo := x.Model.Models[0]
			equal(t, "model", []string{mo.Provider, mo.Name, mo.Revision}, []string{"local", "qwen2.5", "q4"})
			equal(t, "workflow versions", x.Model.WorkflowVersions, []string{"wf-7@v3"})
			equal(t, "provider categories", x.Model.ProviderCategories, []string{"local"})
			if v := x.Model.Validations; len(v) != 2 || v[0].Valid || len(v[0].Errors) == 0 || !v[1].Valid || v[1].Model == nil || v[1].Model.Name != "qwen2.5" || v[1].OutputHash == "" {
				t.Fatalf("validations: %+v", v)
			}
			equal(t, "model answer", x.Model.Answer, "local/qwen2.5 (revision q4); workflow wf-7@v3; 2 validations: 1 valid, 1 invalid")

			// The timeline, in order, each step with a summary.
			var kinds []string
			for _, st := range x.Timeline {
				kinds = append(kinds, st.Kind)
				if st.Summary == "" {
					t.Errorf("%s has no summary", st.Kind)
				}
			}
			equal(t, "timeline", kinds, []string{"claimed", "duplicate", "validation", "validation", "effect_queued", "effect_unknown",
				"alert", "effect_reconciled", "approval_requested", "approval_decided", "effect_queued", "effect_completed", "transition"})
			equal(t, "decision summary", x.Timeline[9].Summary, "approve by lead")
			equal(t, "reconcile summary", x.Timeline[7].Summary, "effect "+note.EffectID+" reconciled: 1 found; provider id crm-77")

			var text bytes.Buffer
			if err := audit.WriteExplanation(&text, x); err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{"ticket-42: completed (version", "Processed?     yes: claimed by apikey:n8n", "Sent?          yes: 2 of 2 effects sent",
				"Who approved?  approved by lead", "Which model?   local/qwen2.5 (revision q4)", "EFFECTS", "crm-77", "APPROVALS", "VALIDATIONS", "TIMELINE",
				"duplicate delivery refused: the run was processing"} {
				if !strings.Contains(text.String(), want) {
					t.Errorf("text lacks %q:\n%s", want, text.String())
				}
			}
			// Payloads never appear: only hashes and log_fields.
			if strings.Contains(text.String(), "Your refund is on its way") || strings.Contains(text.String(), "ana@example.com") {
				t.Fatalf("the explanation shows a payload:\n%s", text.String())
			}

			if _, err := audit.New(e.Store, e.Clock.Now).Explain(ctx, "nobody"); !errors.Is(err, runs.ErrNotFound) {
				t.Fatalf("unknown key: %v", err)
			}
		})
	}
}

// TestExplainOtherOutcomes: a run parked for a person, then rejected; a windowed effect.
func TestExplainOtherOutcomes(t *testing.T) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			e := apptest.NewEffectsEnv(t, b, "")
			s := scenario{t, e}
			s.claim("w-1", nil)
			sub := s.submit("w-1", "email", `{"to":"x@example.com","text":"hi"}`, nil)
			x, err := audit.New(e.Store, e.Clock.Now).Explain(ctx, "w-1")
			if err != nil {
				t.Fatal(err)
			}
			equal(t, "processed", x.Processed.Answer, "waiting for a person (approval): claimed by apikey:n8n at 2026-11-30T09:00:00Z; 0 duplicate deliveries refused, 0 reclaims")
			equal(t, "sent", x.Sent.Answer, "not yet: the effect waits for a person's approval; nothing was sent")
			if !strings.HasPrefix(x.Approved.Answer, "waiting: email requested by apikey:n8n") {
				t.Fatalf("approved: %s", x.Approved.Answer)
			}
			equal(t, "model", x.Model.Answer, "not recorded: no request on this run carried meta.model; no validation")

			// Rejected: nothing was sent, and the reason is given.
			if _, err := e.Approvals.Decide(ctx, approvals.HashToken(sub.Approval.Token), approvals.Reject, "wrong customer", lead); err != nil {
				t.Fatal(err)
			}
			x, err = audit.New(e.Store, e.Clock.Now).Explain(ctx, "w-1")
			if err != nil {
				t.Fatal(err)
			}
			equal(t, "rejected: processed", x.Processed.Answer, "yes, and a person rejected it: claimed by apikey:n8n at 2026-11-30T09:00:00Z; rejected at 2026-11-30T09:00:00Z (reject); 0 duplicate deliveries refused, 0 reclaims")
			equal(t, "rejected: sent", x.Sent.Answer, "no: the run was rejected; nothing was sent")
			equal(t, "rejected: approved", x.Approved.Answer, `rejected by lead at 2026-11-30T09:00:00Z: "wrong customer" (email)`)

			// act_with_window: queued at once, and nobody has to approve it.
			s.claim("w-2", nil)
			s.submit("w-2", "digest", `{"text":"weekly"}`, nil)
			x, err = audit.New(e.Store, e.Clock.Now).Explain(ctx, "w-2")
			if err != nil {
				t.Fatal(err)
			}
			equal(t, "window: sent", x.Sent.Answer, "not yet: 0 of 1 effect sent, 1 waiting")
			equal(t, "window: approved", x.Approved.Answer, "nobody needs to: digest goes ahead when its window closes at 2026-11-30T09:10:00Z unless someone cancels it (act_with_window)")
		})
	}
}

func TestParseWindow(t *testing.T) {
	for _, c := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"7d", 7 * 24 * time.Hour, true},
		{"1d12h", 36 * time.Hour, true},
		{"1.5d", 36 * time.Hour, true},
		{"36h", 36 * time.Hour, true},
		{"90m", 90 * time.Minute, true},
		{"0d", 0, false},
		{"-7d", 0, false},
		{"7", 0, false},
		{"week", 0, false},
		{"", 0, false},
	} {
		got, err := audit.ParseWindow(c.in)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("ParseWindow(%q) = %v, %v", c.in, got, err)
		}
		if err != nil && !errors.Is(err, audit.ErrBadWindow) {
			t.Errorf("ParseWindow(%q): %v is not ErrBadWindow", c.in, err)
		}
	}
}

func TestPercentile(t *testing.T) {
	values := []float64{10, 1, 5, 3, 7, 9, 2, 8, 4, 6} // 1…10
	for _, c := range []struct{ p, want float64 }{{50, 5}, {95, 10}, {90, 9}, {10, 1}, {100, 10}} {
		if got := audit.Percentile(values, c.p); got == nil || *got != c.want {
			t.Errorf("p%v = %v, want %v", c.p, got, c.want)
		}
	}
	if audit.Percentile(nil, 50) != nil {
		t.Error("the percentile of nothing is not nil")
	}
	if !slices.Equal(values, []float64{10, 1, 5, 3, 7, 9, 2, 8, 4, 6}) {
		t.Error("Percentile sorted its input")
	}
}

// TestAuditEventsOfAnyKind reads events through the store's AuditEvents with the
// report's kinds (through events_report_kind_at, which holds no others) and with a kind
// outside them: each call returns exactly the window's events of the kinds asked, on
// both stores — the index's predicate must never drop a kind a caller asked for.
func TestAuditEventsOfAnyKind(t *testing.T) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			e := apptest.NewEnv(t, b, false)
			t0 := e.Clock.Now()
			for i, kind := range []string{"claimed", "alert", "effect_completed", "validation", "alert", "claimed"} {
				at := t0.Add(time.Duration(i-1) * time.Second) // the first is before the window
				if _, err := e.Store.EventInsert(ctx, store.EventInsertParams{RunKey: "k", Kind: kind, Actor: "test",
					Detail: json.RawMessage(`{}`), Now: &at}); err != nil {
					t.Fatal(err)
				}
			}
			for _, c := range []struct {
				kinds []string
				want  map[string]int
			}{
				{[]string{"alert", "validation"}, map[string]int{"alert": 2, "validation": 1}},
				{[]string{"claimed"}, map[string]int{"claimed": 1}},
				{[]string{"claimed", "alert", "effect_completed"}, map[string]int{"alert": 2, "claimed": 1, "effect_completed": 1}},
			} {
				got := map[string]int{}
				if err := e.Store.AuditEvents(ctx, t0, c.kinds, func(ev store.Event) error { got[ev.Kind]++; return nil }); err != nil {
					t.Fatal(err)
				}
				equal(t, fmt.Sprintf("events of %v", c.kinds), got, c.want)
			}
		})
	}
}

// TestReportFromRawEvents checks the store's window and pairing on events written
// directly: the cutoff is inclusive, and a decision whose request is gone is not ranked.
func TestReportFromRawEvents(t *testing.T) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			e := apptest.NewEnv(t, b, false)
			t0 := e.Clock.Now()
			ev := func(key, kind string, at time.Duration, detail string) {
				t.Helper()
				now := t0.Add(at)
				if _, err := e.Store.EventInsert(ctx, store.EventInsertParams{RunKey: key, Kind: kind, Actor: "test",
					Detail: json.RawMessage(detail), Now: &now}); err != nil {
					t.Fatal(err)
				}
			}
			ev("a", "duplicate", -time.Microsecond, `{}`) // just before the cutoff
			ev("a", "claimed", 0, `{}`)                   // at the cutoff: counted
			ev("a", "duplicate", time.Second, `{}`)
			ev("a", "approval_requested", 0, `{"approval_id":"a1"}`)
			ev("a", "approval_decided", 30*time.Second, `{"approval_id":"a1","decision":"approve"}`)
			ev("b", "approval_decided", time.Minute, `{"approval_id":"a2","decision":"approve"}`) // its request was purged
			ev("c", "approval_requested", 0, `{"approval_id":"a3"}`)
			ev("c", "approval_requested", 0, `{"approval_id":"a4"}`)
			ev("c", "approval_decided", 5*time.Minute, `{"approval_id":"a3","decision":"reject"}`)
			ev("b", "approval_requested", 0, `{"approval_id":"a3"}`) // the same id on another run pairs with nothing
			ev("c", "validation", 0, `{"valid":false,"errors":[]}`)
			ev("c", "validation", 0, `{"valid":true}`)
			ev("c", "effect_failed", 0, `{"effect_id":"x","retry_cap":3}`)
			ev("c", "effect_failed", 0, `{"effect_id":"y"}`) // refused, not capped
			ev("c", "effect_resolved", 0, `{"effect_id":"z","outcome":"sent"}`)
			ev("c", "effect_reconciled", 0, `{"effect_id":"w","found":2}`)
			ev("", "kill_switch", 0, `{"scope":"global","enabled":true}`)

			rep, err := audit.New(e.Store, e.Clock.Now).Report(ctx, t0)
			if err != nil {
				t.Fatal(err)
			}
			equal(t, "duplicates", rep.Duplicates, 1)
			equal(t, "duplicate rate", rep.DuplicateRate, f(0.5))
			equal(t, "runs", rep.Runs, 3)
			equal(t, "gate wait", rep.GateWait, audit.GateWait{Decided: 3, Unpaired: 1, P50Seconds: f(30), P95Seconds: f(300), MaxSeconds: f(300),
				Method: "nearest-rank over approval_requested → approval_decided"})
			equal(t, "approvals", rep.Approvals, audit.Approvals{HumanApproved: 2, HumanRejected: 1, AutoShare: f(0)})
			equal(t, "validation failure rate", rep.ValidationFailureRate, f(0.5))
			equal(t, "retry caps", rep.RetryCapHits, audit.RetryCapHits{Effects: 1, Total: 1})
			equal(t, "effects sent", rep.Effects.Sent, 1)

			empty, err := audit.New(e.Store, e.Clock.Now).Report(ctx, t0.Add(time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			if empty.DuplicateRate != nil || empty.GateWait.P50Seconds != nil || empty.ValidationFailureRate != nil || empty.Approvals.AutoShare != nil {
				t.Fatalf("an empty window has figures: %+v", empty)
			}
			raw, _ := json.Marshal(empty)
			for _, want := range []string{`"duplicate_rate":null`, `"p95_seconds":null`, `"auto_share":null`} {
				if !strings.Contains(string(raw), want) {
					t.Errorf("empty report JSON lacks %s: %s", want, raw)
				}
			}
		})
	}
}
