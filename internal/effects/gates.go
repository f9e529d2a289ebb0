package effects

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

// gate is one gate mode (policy's gate): what an effect request needs between Submit's
// claim check and the outbox, inside its transaction, under the run's lock.
type gate interface {
	// admit decides the checked request: it enters the outbox, to leave at notBefore, or
	// (held) a person decides first and nothing is queued.
	admit(ctx context.Context, t *submission) (notBefore time.Time, held bool, err error)
	// queued writes what the mode keeps beside an effect admit let into the outbox;
	// created is false when the same request had queued it before.
	queued(ctx context.Context, t *submission, e store.Effect, created bool) error
	// resent answers a request whose lease check failed because the same request had
	// been held for a person before (its 202 lost): that approval with a fresh link, or
	// nil when it is not such a request.
	resent(ctx context.Context, t *submission) (*approvals.Requested, error)
}

// gateFor is the gate of mode. Every mode but none needs the approvals service.
func gateFor(mode string, ap *approvals.Service) (gate, error) {
	if mode == policy.GateNone {
		return noGate{}, nil
	}
	if ap == nil {
		return nil, fmt.Errorf("%w (gate %s)", ErrApprovalRequired, mode)
	}
	switch mode {
	case policy.GateActWithWindow:
		return actWithWindow{person{ap}}, nil
	case policy.GateApproveByException:
		return approveByException{person{ap}}, nil
	default: // approve_before_act, and whatever the policy would not know: the strictest
		return approveBeforeAct{person{ap}}, nil
	}
}

// noGate (none) queues the effect now.
type noGate struct{}

func (noGate) admit(_ context.Context, t *submission) (time.Time, bool, error) {
	return t.s.AtOrZero(), false, nil
}

func (noGate) queued(context.Context, *submission, store.Effect, bool) error { return nil }

func (noGate) resent(context.Context, *submission) (*approvals.Requested, error) { return nil, nil }

// approveBeforeAct holds every request for a person; their approval queues the effect
// (approvals.Decide).
type approveBeforeAct struct{ person }

func (g approveBeforeAct) admit(ctx context.Context, t *submission) (time.Time, bool, error) {
	return time.Time{}, true, g.ask(ctx, t, "")
}

func (approveBeforeAct) queued(context.Context, *submission, store.Effect, bool) error { return nil }

// actWithWindow queues the effect to leave when its window closes, with a cancel link
// approvers may use until the dispatcher takes it.
type actWithWindow struct{ person }

func (actWithWindow) admit(ctx context.Context, t *submission) (time.Time, bool, error) {
	now, err := t.s.Read(ctx, t.q)
	if err != nil {
		return time.Time{}, false, err
	}
	return now.Add(t.a.Window.D()), false, nil // the dispatcher cannot take it before the window closes
}

func (g actWithWindow) queued(ctx context.Context, t *submission, e store.Effect, created bool) error {
	if !created {
		if e.State != store.EffectPending {
			return nil
		}
		// The same request again: a fresh cancel link while the window is open.
		w, err := g.reissueWindow(ctx, t, e)
		t.sub.Approval = w
		return err
	}
	w, err := g.approvals.Window(ctx, t.q, t.run, e, t.ask())
	t.sub.Approval = &w
	return err
}

// reissueWindow reissues the cancel link of e's open act_with_window approval; nil, nil
// when the window is closed.
func (g actWithWindow) reissueWindow(ctx context.Context, t *submission, e store.Effect) (*approvals.Requested, error) {
	all, err := t.q.ApprovalsByRun(ctx, e.RunKey)
	if err != nil {
		return nil, err
	}
	for _, ap := range all {
		if ap.ConsumedAt != nil || ap.EffectID != e.EffectID || !slices.Equal(ap.AllowedDecisions, []string{approvals.Cancel}) {
			continue
		}
		r, err := g.approvals.ReissueIn(ctx, t.q, ap.ID, t.req.Actor)
		if errors.Is(err, approvals.ErrNotPending) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		return &r, nil
	}
	return nil, nil
}

// approveByException queues the effect now when every evaluator gave evidence and the
// rule holds (approvals.ByException), recording the auto-approval and, at the policy's
// sample rate, putting it on the review list; any doubt, a person decides first.
type approveByException struct{ person }

func (g approveByException) admit(ctx context.Context, t *submission) (time.Time, bool, error) {
	auto, why, err := approvals.ByException(ctx, t.q, t.run, t.a, t.req.Payload)
	if err != nil {
		return time.Time{}, false, err
	}
	if !auto {
		return time.Time{}, true, g.ask(ctx, t, why)
	}
	return t.s.AtOrZero(), false, nil
}

func (g approveByException) queued(ctx context.Context, t *submission, e store.Effect, created bool) error {
	if !created {
		return nil // auto-approved when it was queued
	}
	detail := map[string]any{"effect_id": e.EffectID, "rule": t.a.RuleSource, "policy_version": t.s.Policy.Version,
		"evidence_sources": t.a.EvidenceSources}
	if rand.Float64() < t.a.SampleRate {
		r, err := g.approvals.Sample(ctx, t.q, t.run, t.a, e)
		if err != nil {
			return err
		}
		detail["review_id"] = r.ID
	}
	t.committed = append(t.committed, func() { g.approvals.Observer.Decision(policy.GateApproveByException, "auto", 0) })
	return runs.Event(ctx, t.q, t.now, runs.Entry{Key: t.req.Key, Kind: store.EventAutoApproved, Version: t.run.Version, Actor: "airlock", Detail: detail})
}

// person is what the gated modes share: the approvals service that asks a person.
type person struct{ approvals *approvals.Service }

// ask holds the request for a person: the run waits in awaiting_human on a new approval
// and nothing enters the outbox. declined is why approve_by_exception did not approve it
// by itself ("" for approve_before_act).
func (p person) ask(ctx context.Context, t *submission, declined string) error {
	req := t.req
	if declined != "" {
		if err := runs.Event(ctx, t.q, t.now, runs.Entry{Key: req.Key, Kind: store.EventAutoApprovalDeclined, Version: t.run.Version, Actor: "airlock",
			Detail: map[string]any{"reason": declined, "rule": t.a.RuleSource, "policy_version": t.s.Policy.Version}}); err != nil {
			return err
		}
	}
	if _, err := t.q.RunCount(ctx, store.RunCountParams{Key: req.Key, ActionType: req.ActionType}); err != nil {
		return err
	}
	r, err := p.approvals.Request(ctx, t.q, t.run, approvals.Proposed{ActionType: req.ActionType, Target: req.Target,
		EffectID: req.EffectID, Executor: t.a.Executor(), Payload: req.Payload, PayloadHash: t.hash}, t.ask())
	t.sub.Approval, t.run = &r, r.Run
	return err
}

// resent answers the same effect request sent again after its approval was opened (the
// 202 lost on the way): when the run waits in awaiting_human on an approval its request
// opened — same lease owner, the version that request produced, same effect id — it
// reissues that approval's link (the old one stops working) if the payload is the same,
// and refuses with ErrEffectMismatch if it differs. nil, nil: not such a request (the
// caller diagnoses it as usual).
func (p person) resent(ctx context.Context, t *submission) (*approvals.Requested, error) {
	req, q := t.req, t.q
	cur, err := q.RunGet(ctx, req.Key)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if cur.State != store.StateAwaitingHuman || cur.LeaseOwner != req.Owner || cur.Version != req.Version+1 {
		return nil, nil
	}
	all, err := q.ApprovalsByRun(ctx, req.Key)
	if err != nil {
		return nil, err
	}
	var open *store.Approval
	for i, ap := range all {
		if ap.ConsumedAt == nil && slices.Contains(ap.AllowedDecisions, approvals.Approve) {
			open = &all[i]
		}
	}
	if open == nil || open.EffectID != req.EffectID {
		return nil, nil
	}
	hash := t.hash
	if t.a.Schema != nil {
		_, h, err := validatedValue(ctx, q, req)
		if errors.Is(err, store.ErrNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		if !samePayload(req.Payload, h) {
			return nil, fmt.Errorf("%w: %s", ErrEffectMismatch, req.EffectID)
		}
		hash = h
	}
	if open.PayloadHash != hash || open.ActionType != req.ActionType || open.Target != req.Target {
		return nil, fmt.Errorf("%w: %s", ErrEffectMismatch, req.EffectID)
	}
	r, err := p.approvals.ReissueIn(ctx, q, open.ID, req.Actor)
	if errors.Is(err, approvals.ErrNotPending) {
		return nil, nil // expired meanwhile: the usual answer
	}
	if err != nil {
		return nil, err
	}
	return &r, nil
}
