package effects

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/google/uuid"

	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/tracing"
)

// Outbox is the one way into the outbox and the outbox's rules about a run it changes:
// Enter (insert, notify, effect_queued) for every effect that is queued — by Submit, or
// by an approval (Approved) — the cancel link's withdrawal (Withdraw), settling an
// approved run once its effects are done, and waking this instance's dispatcher. As
// River's insertManyShared is the one funnel into its jobs table, nothing else inserts
// an effect, so the paths cannot drift apart.
//
// It is built before the approvals service, which is given it (approvals.Config.Outbox:
// a decision and its effect commit in one transaction), and the outbox service embeds
// the same one (Config.Outbox).
type Outbox struct {
	runs.Base
	// Hook, when set, is called at named points between statements (settle_counted and
	// the outbox service's own points): tests force interleavings with it. Never set in
	// production.
	Hook func(point string)
	// wake tells this instance's dispatcher that an effect is due (nil: none runs).
	wake atomic.Pointer[func()]
}

// NewOutbox builds the funnel over b.
func NewOutbox(b runs.Base) (*Outbox, error) {
	b, err := b.Fill()
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	return &Outbox{Base: b}, nil
}

func (o *Outbox) hook(point string) {
	if o.Hook != nil {
		o.Hook(point)
	}
}

// Wake tells this instance's dispatcher, if one runs, to look for due effects now.
func (o *Outbox) Wake() {
	if f := o.wake.Load(); f != nil {
		(*f)()
	}
}

// Entry is one effect entering the outbox.
type Entry struct {
	// Effect is what enters: its run, effect id, action type, target, executor, payload,
	// payload hash and not_before (the zero time: now); Enter gives it an id, the pending
	// state, its creation time and the caller's trace.
	Effect store.Effect
	// Version is the run's version the effect_queued event names; Actor and Meta, who
	// asked.
	Version int64
	Actor   string
	Meta    *runs.Meta
	// ApprovalID is the approval that let it in ("" for none).
	ApprovalID string
}

// Enter inserts the effect inside the caller's transaction, which holds its run's lock;
// for a new one it also notifies every instance's dispatcher (at commit) and writes its
// effect_queued event: effect id, action type, target, executor, payload hash,
// not_before, payload_fields (the payload as the policy logs it) and, when an approval
// let it in, approval_id. The same effect id again returns the stored effect (created
// false) and writes nothing: the caller compares it.
func (o *Outbox) Enter(ctx context.Context, q store.Queries, in Entry) (e store.Effect, created bool, err error) {
	e = in.Effect
	e.ID, e.State, e.CreatedAt, e.TraceParent = uuid.NewString(), store.EffectPending, o.AtOrZero(), tracing.Parent(ctx)
	if e.NotBefore.IsZero() {
		e.NotBefore = o.AtOrZero()
	}
	e, created, err = q.EffectInsert(ctx, e)
	if err != nil || !created {
		return e, false, err
	}
	if err := q.EffectNotify(ctx); err != nil { // every instance's dispatcher, at commit
		return e, true, err
	}
	a := o.Policy.Action(e.ActionType)
	if a == nil {
		a = &policy.Action{} // no longer in the policy: every field is logged as its hash
	}
	detail := map[string]any{
		"effect_id": e.EffectID, "action_type": e.ActionType, "target": e.Target,
		"executor": e.Executor, "payload_hash": e.PayloadHash, "not_before": e.NotBefore,
		"payload_fields": a.Redact(e.Payload),
	}
	if in.ApprovalID != "" {
		detail["approval_id"] = in.ApprovalID
	}
	return e, true, runs.Event(ctx, q, o.At(), runs.Entry{Key: e.RunKey, Kind: store.EventEffectQueued, Version: in.Version, Actor: in.Actor, Meta: in.Meta, Detail: detail})
}

// Approved is "approved → queued" (approvals.Outbox): inside the decision's transaction,
// the effect the approval held enters the outbox, due now; run is as the decision left
// it. It was never queued before: finding it there is an error, and the decision rolls
// back.
func (o *Outbox) Approved(ctx context.Context, q store.Queries, a store.Approval, run store.Run, actor string) error {
	_, created, err := o.Enter(ctx, q, Entry{Effect: store.Effect{RunKey: a.RunKey, EffectID: a.EffectID,
		ActionType: a.ActionType, Target: a.Target, Executor: a.Executor, Payload: a.Payload, PayloadHash: a.PayloadHash},
		Version: run.Version, Actor: actor, ApprovalID: a.ID})
	if err == nil && !created {
		err = fmt.Errorf("approve: effect %s of run %s is already in the outbox", a.EffectID, a.RunKey)
	}
	return err
}

// Withdraw is the cancel link's decision (approvals.Outbox): an act_with_window effect
// that is still pending and unleased is cancelled, and its run settled; once the
// dispatcher has it, it is too late (approvals.ErrTooLate) and nothing changes. The
// caller holds the run's lock (taken before the approval's), which the rule against
// write skew in settle also needs before effects change openness.
func (o *Outbox) Withdraw(ctx context.Context, q store.Queries, a store.Approval, d approvals.Decision) error {
	e, err := q.EffectByRunEffectID(ctx, a.RunKey, a.EffectID)
	if errors.Is(err, store.ErrNotFound) {
		return approvals.ErrTooLate
	}
	if err != nil {
		return err
	}
	class := "cancelled_in_window"
	if _, err := q.EffectUpdate(ctx, store.EffectUpdateParams{ID: e.ID, From: []store.EffectState{store.EffectPending},
		To: store.EffectCancelled, ErrorClass: &class, Now: o.At()}); errors.Is(err, store.ErrNoMatch) {
		return approvals.ErrTooLate
	} else if err != nil {
		return err
	}
	if err := runs.Event(ctx, q, o.At(), runs.Entry{Key: a.RunKey, Kind: store.EventEffectCancelled, Actor: d.Actor(), Detail: map[string]any{
		"effect_id": e.EffectID, "approval_id": a.ID, "by": d.Who.Subject, "reason": d.Reason,
	}}); err != nil {
		return err
	}
	return o.settle(ctx, q, a.RunKey, store.EffectCancelled)
}

// settle finishes an approved run once its effects have: completed when none is open any
// more, failed_terminal when one failed for good (its other pending effects are
// cancelled: nothing of a failed run leaves), or when the last open one was cancelled or
// abandoned (an approved run never hangs in approved). A run still processing is its
// client's to finish. The caller holds the run's lock (RunLockKeys), so two effects
// finishing at once cannot each see the other still open.
func (o *Outbox) settle(ctx context.Context, q store.Queries, key string, effect store.EffectState) error {
	if effect != store.EffectCompleted && effect != store.EffectFailed && effect != store.EffectCancelled {
		return nil
	}
	run, err := q.RunGet(ctx, key)
	if err != nil || run.State != store.StateApproved {
		return err
	}
	to := store.StateFailedTerminal
	if effect != store.EffectFailed {
		n, err := q.RunOpenEffects(ctx, key)
		o.hook("settle_counted")
		if err != nil || n > 0 {
			return err
		}
		all, err := q.EffectList(ctx, store.EffectListParams{RunKey: key, Limit: 1000})
		if err != nil {
			return err
		}
		effect = store.EffectCompleted
		if slices.ContainsFunc(all, func(e store.Effect) bool { return e.State == store.EffectCancelled }) {
			effect = store.EffectCancelled // something approved was not sent: not a completion
		} else {
			to = store.StateCompleted
		}
	}
	var result json.RawMessage
	if to == store.StateFailedTerminal {
		result, _ = json.Marshal(map[string]string{"reason": "effects_" + string(effect)})
	}
	run, err = q.RunSetState(ctx, store.RunSetStateParams{Key: key, From: store.StateApproved, To: to, Result: result, Now: o.At()})
	if err != nil {
		return err
	}
	if err := runs.Event(ctx, q, o.At(), runs.Entry{Key: key, Kind: store.EventTransition, Version: run.Version, Actor: "airlock", Detail: map[string]any{"from": store.StateApproved, "to": to, "reason": "effects_" + string(effect)}}); err != nil {
		return err
	}
	if to == store.StateFailedTerminal {
		return runs.CancelPending(ctx, q, o.At(), key)
	}
	return nil
}
