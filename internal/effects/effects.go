// Package effects is the transactional outbox: effects queued under a run's lease, the
// kill switch that guards every send, the dispatcher that sends through connectors, the
// external-worker protocol, reconciliation of unknown outcomes and operator resolution.
//
// The rule everything here serves: an external write leaves once, or it is honestly
// marked unknown and never resent automatically unless its provider is idempotent.
package effects

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/connector"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

// Domain outcomes; the HTTP layer maps each to one status and code.
var (
	ErrUnknownActionType = errors.New("action type is not configured")
	ErrInvalidTarget     = errors.New("target is not configured for this action type")
	ErrApprovalRequired  = errors.New("this action type is gated: it needs a person's approval")
	ErrEffectMismatch    = errors.New("the effect id was queued with a different payload")
	ErrActionsDisabled   = errors.New("actions are disabled by the kill switch")
	ErrNotFound          = errors.New("effect not found")
	ErrEffectLeaseLost   = errors.New("the effect's lease is not held")
	ErrNotResolvable     = errors.New("the effect is not in a state this operation applies to")
	ErrEffectChanged     = errors.New("the effect changed since the version the decision was made on")
	ErrNotValidated      = errors.New("this action type has a schema: queue it after a passing validation on this run")
	ErrUnsendablePayload = errors.New("the payload cannot be sent by this action type's connector")
)

// Service is the outbox over a store and a policy: it embeds the Outbox (the one way
// in, shared with the approvals service) and adds the connectors, the gates and the
// kill switch.
type Service struct {
	*Outbox
	connectors map[string]connector.Connector // by action type
	approvals  *approvals.Service
	// envDisabled is AI_ACTIONS_ENABLED set to anything but "true": every send stops.
	envDisabled bool
}

// Config is what the outbox service needs beside its Base.
type Config struct {
	// Connectors send the action types airlock performs itself, by name; nil: none.
	Connectors map[string]connector.Connector
	// Approvals asks a person for the gated modes; nil: gated types are refused with
	// ErrApprovalRequired (a command that only operates the outbox).
	Approvals *approvals.Service
	// Outbox is the funnel shared with Approvals (whose decisions queue through it);
	// nil: a new one over the Base. Given, it must be over the same store.
	Outbox *Outbox
	// AIActionsEnabled is the AI_ACTIONS_ENABLED environment value and whether it is set:
	// unset or "true" lets the database's kill switch decide; anything else stops every
	// send.
	AIActionsEnabled    string
	AIActionsEnabledSet bool
}

// New builds the outbox service over b.
func New(b runs.Base, cfg Config) (*Service, error) {
	b, err := b.Fill()
	if err != nil {
		return nil, fmt.Errorf("effects: %w", err)
	}
	ob := cfg.Outbox
	switch {
	case ob == nil:
		if ob, err = NewOutbox(b); err != nil {
			return nil, err
		}
	case ob.Store != b.Store:
		return nil, errors.New("effects: Config.Outbox is over another store than the Base")
	}
	return &Service{Outbox: ob, connectors: cfg.Connectors, approvals: cfg.Approvals,
		envDisabled: cfg.AIActionsEnabledSet && cfg.AIActionsEnabled != "true"}, nil
}

// lockEffectRun reads an effect and locks its run's row, run first: every transaction
// that changes whether a run has open effects takes the run's lock before the effect's.
func (s *Service) lockEffectRun(ctx context.Context, q store.Queries, id string) (store.Effect, error) {
	e, err := q.EffectGet(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return store.Effect{}, ErrNotFound
	}
	if err != nil {
		return store.Effect{}, err
	}
	if _, err := q.RunLockKeys(ctx, []string{e.RunKey}); err != nil {
		return store.Effect{}, err
	}
	return q.EffectGet(ctx, id) // as of the lock
}

// Get returns one effect.
func (s *Service) Get(ctx context.Context, id string) (store.Effect, error) {
	e, err := s.Store.EffectGet(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return store.Effect{}, ErrNotFound
	}
	return e, err
}

// List returns effects, for a run or for operators.
func (s *Service) List(ctx context.Context, p store.EffectListParams) ([]store.Effect, error) {
	if p.Limit == 0 {
		p.Limit = 1000
	}
	return s.Store.EffectList(ctx, p)
}

// finish applies a send's outcome to the effect (a compare-and-set on its lease) and
// writes the event on its run, in one transaction that holds the run's lock.
func (s *Service) finish(ctx context.Context, e store.Effect, owner string, res connector.Result, actor string) (store.Effect, error) {
	var out outcome
	err := s.Store.Transact(ctx, func(q store.Queries) error {
		if _, err := q.RunLockKeys(ctx, []string{e.RunKey}); err != nil {
			return err
		}
		var err error
		out, err = s.finishIn(ctx, q, sent{e: e, owner: owner, res: res, actor: actor})
		return err
	})
	if err != nil {
		return store.Effect{}, fmt.Errorf("record outcome of effect %s: %w", e.ID, err)
	}
	s.alerted(out.alert)
	return out.effect, nil
}

// outcome is what recording a send's result did.
type outcome struct {
	effect store.Effect      // the effect as recorded (only where the store read it back)
	state  store.EffectState // the state it was recorded in
	alert  string            // the kind of the alert event it wrote, if any
}

// alerted wakes the alert relay after a commit that wrote an alert event (alert != "").
func (s *Service) alerted(alert string) {
	if alert != "" {
		s.Alerts.Wake()
	}
}

// sent is one send's result on its way to the outbox, carried from the send through
// finishIn and planOutcome: the effect, the lease owner that sent it, the connector's
// result and who records it. expired (the sweeper) records it only if the lease has
// lapsed at the statement.
type sent struct {
	e       store.Effect
	owner   string
	res     connector.Result
	actor   string
	expired bool
}

// finishIn records a send's outcome inside q's transaction; the caller holds the run's
// lock.
func (s *Service) finishIn(ctx context.Context, q store.Queries, o sent) (outcome, error) {
	return s.finishInRun(ctx, q, o, true)
}

// finishInRun is finishIn; settle false skips settleApproved, for a caller whose lock on
// the run showed it is not approved (then recording cannot settle it: see finishBatch).
func (s *Service) finishInRun(ctx context.Context, q store.Queries, o sent, settle bool) (outcome, error) {
	e := o.e
	now, err := s.Read(ctx, q)
	if err != nil {
		return outcome{}, err
	}
	pl := s.planOutcome(o, now, s.At())
	out := outcome{alert: pl.alert}
	out.effect, err = q.EffectUpdate(ctx, pl.update)
	if errors.Is(err, store.ErrNoMatch) && pl.reconcilable {
		// Our lease lapsed before the outcome was recorded (mid-send, or while the store
		// refused writes) and the sweeper marked it unknown: a 2xx with its receipt is
		// proof, so we reconcile it — but only the effect exactly as our lease left it
		// (unknown for lease_expired, no lease since: the same attempt count), never one a
		// person or a later send has moved on.
		pl.reconcile()
		out.effect, err = q.EffectUpdate(ctx, pl.update)
	}
	if errors.Is(err, store.ErrNoMatch) {
		return outcome{}, ErrEffectLeaseLost
	}
	if err != nil {
		return outcome{}, err
	}
	out.state = out.effect.State
	// The outcome's event, the run's settling (its transition), then the alert's event.
	evs := pl.events()
	if err := evs[0].insert(ctx, q, e.RunKey); err != nil {
		return outcome{}, err
	}
	if settle {
		if err := s.settle(ctx, q, e.RunKey, pl.update.To); err != nil {
			return outcome{}, err
		}
	}
	for _, ev := range evs[1:] {
		if err := ev.insert(ctx, q, e.RunKey); err != nil {
			return outcome{}, err
		}
	}
	return out, nil
}

// outcomePlan is what recording one send's outcome writes: the effect's compare-and-set
// and the events that follow it. Planning reads nothing, so a group of outcomes can be
// written with one statement per kind of row (record.go).
type outcomePlan struct {
	e            store.Effect
	update       store.EffectUpdateParams
	kind         store.EventKind
	actor        string
	detail       outcomeDetail
	alert        string // the alert to raise after commit (and its event), if any
	class        string
	at           *time.Time
	reconcilable bool // a Sent outcome whose compare-and-set may find the effect unknown by our lapsed lease
}

// planOutcome decides how a send's result is recorded, given the transaction's now.
func (s *Service) planOutcome(o sent, now time.Time, at *time.Time) outcomePlan {
	e, owner, res, actor, expired := o.e, o.owner, o.res, o.actor, o.expired
	a := s.Policy.Action(e.ActionType)
	retry := policy.ActionRetry{MaxAttempts: 1, Backoff: policy.Duration(time.Second), MaxBackoff: policy.Duration(time.Second)}
	idempotent := false
	if a != nil {
		retry = a.Retry
	}
	if c := s.connectors[e.ActionType]; c != nil && e.Executor == store.ExecutorDispatcher {
		idempotent = c.Idempotent()
	}
	if res.Outcome == connector.Sent {
		// Whatever the connector: an id that some store cannot keep is kept in a safe form.
		if id, note := connector.SafeProviderID(res.ProviderID); note != "" {
			res.ProviderID, res.Note = id, note
		}
	}
	pl := outcomePlan{e: e, actor: actor, class: res.Class, at: at}
	pl.update = store.EffectUpdateParams{ID: e.ID, From: []store.EffectState{store.EffectSending}, Owner: owner, ErrorClass: &pl.class,
		LeaseExpired: expired, Ambiguous: res.Outcome == connector.Ambiguous, Now: at}
	pl.detail = outcomeDetail{EffectID: e.EffectID, ActionType: e.ActionType, Target: e.Target, Attempts: e.Attempts,
		ErrorClass: pl.class}
	switch {
	case res.Outcome == connector.Sent:
		id := res.ProviderID
		pl.update.To, pl.update.ProviderID, pl.kind = store.EffectCompleted, &id, store.EventEffectCompleted
		if e.NoneConfirmedAt != nil {
			// Sent again because a lookup twice said "none": look it up once more later.
			pl.update.RecheckAfter = s.Policy.Settle(e.ActionType)
		}
		pl.detail.ProviderID, pl.detail.ProviderIDNote = &id, res.Note
		pl.reconcilable = !expired
	case (res.Outcome == connector.Retryable || res.Outcome == connector.Ambiguous && idempotent) && e.Attempts < retry.MaxAttempts:
		wait := policy.Backoff(retry.Backoff, retry.MaxBackoff, e.Attempts, res.RetryAfter)
		nb := now.Add(wait)
		pl.update.To, pl.update.NotBefore, pl.kind = store.EffectPending, &nb, store.EventEffectRetryScheduled
		ms := wait.Milliseconds()
		pl.detail.RetryInMS = &ms
		// Ambiguous: resent with the same idempotency key, the provider de-duplicates.
		pl.detail.Ambiguous = res.Outcome == connector.Ambiguous
	case res.Outcome == connector.Ambiguous:
		pl.update.To, pl.kind, pl.alert = store.EffectUnknown, store.EventEffectUnknown, "effect_unknown"
	case e.AmbiguousAt != nil:
		// Refused, or retryable past the cap, after an earlier attempt was ambiguous: this
		// answer is about this request only. The earlier one may have been performed (a
		// provider still processing it answers a resend "409 in progress", say), so
		// "failed" — definitely not performed — is not proven: a lookup or a person decides.
		pl.update.To, pl.kind, pl.alert = store.EffectUnknown, store.EventEffectUnknown, "effect_unknown"
		pl.detail.AfterAmbiguous = true
	default: // refused, or retryable past the cap
		pl.update.To, pl.kind, pl.alert = store.EffectFailed, store.EventEffectFailed, "effect_failed"
		if res.Outcome == connector.Retryable {
			maxAttempts := retry.MaxAttempts
			pl.detail.RetryCap = &maxAttempts
		}
	}
	return pl
}

// outcomeDetail is an outcome event's detail. Its JSON is what a map of the same keys
// would give (the keys in sorted order, an optional one only when set): encoded without
// a map, and the reflection over one, per outcome.
type outcomeDetail struct {
	ActionType     string            `json:"action_type"`
	AfterAmbiguous bool              `json:"after_ambiguous,omitempty"` // a refusal recorded unknown: an earlier attempt was ambiguous
	Ambiguous      bool              `json:"ambiguous,omitempty"`       // only ever true when present
	Attempts       int               `json:"attempts"`
	EffectID       string            `json:"effect_id"`
	ErrorClass     string            `json:"error_class,omitempty"`
	Found          int               `json:"found,omitempty"` // a reconciliation: 1
	From           store.EffectState `json:"from,omitempty"`
	ProviderID     *string           `json:"provider_id,omitempty"` // a Sent outcome's, even if empty
	ProviderIDNote string            `json:"provider_id_note,omitempty"`
	RetryCap       *int              `json:"retry_cap,omitempty"`
	RetryInMS      *int64            `json:"retry_in_ms,omitempty"`
	Source         string            `json:"source,omitempty"`
	Target         string            `json:"target"`
}

// alertDetail is an outcome's alert event's detail (keys sorted, as a map's).
type alertDetail struct {
	Alert      string `json:"alert"`
	EffectID   string `json:"effect_id"`
	ErrorClass string `json:"error_class"`
}

// reconcile turns a Sent plan whose compare-and-set found no lease into the
// reconciliation of the unknown effect our lapsed lease left (see finishIn).
func (pl *outcomePlan) reconcile() {
	pl.update.From, pl.update.Owner, pl.update.LeaseExpired = []store.EffectState{store.EffectUnknown}, "", false
	pl.update.Attempts, pl.update.FromErrorClass = pl.e.Attempts, LeaseExpiredClass
	pl.kind, pl.detail.From, pl.detail.Found, pl.detail.Source = store.EventEffectReconciled, store.EffectUnknown, 1, LateOutcomeSource
	pl.reconcilable = false
}

type plannedEvent struct {
	kind   store.EventKind
	actor  string
	detail any // outcomeDetail or alertDetail
	at     *time.Time
}

// events are the events of a recorded outcome, in order: the outcome's, then its alert's.
func (pl *outcomePlan) events() []plannedEvent {
	evs := []plannedEvent{{kind: pl.kind, actor: pl.actor, detail: &pl.detail, at: pl.at}}
	if pl.alert != "" {
		evs = append(evs, plannedEvent{kind: store.EventAlert, actor: "airlock", at: pl.at,
			detail: &alertDetail{Alert: pl.alert, EffectID: pl.e.EffectID, ErrorClass: pl.class}})
	}
	return evs
}

// insert writes a planned event on key's run (as runs.Event, with its detail encoded).
func (ev plannedEvent) insert(ctx context.Context, q store.Queries, key string) error {
	detail, err := json.Marshal(ev.detail)
	if err != nil {
		return err
	}
	_, err = q.EventInsert(ctx, store.EventInsertParams{RunKey: key, Kind: string(ev.kind), Actor: ev.actor,
		Detail: detail, Now: ev.at})
	return err
}

// Canceller is who withdraws an effect: the holder of the run's live lease (Owner), or
// an operator.
type Canceller struct {
	Owner    string
	Operator bool
}

// Cancel withdraws a pending act_with_window effect that no sender has taken yet: by the
// holder of its run's live lease or by an operator (approvers use the cancel link). Any
// other effect was approved, or needed no approval, and is not the workflow's to
// withdraw; once leased it is too late. The cancel link dies with it, and an approved
// run whose last open effect this was settles.
func (s *Service) Cancel(ctx context.Context, id, reason, actor string, by Canceller) (store.Effect, error) {
	var out store.Effect
	err := s.Store.Transact(ctx, func(q store.Queries) error {
		e, err := s.lockEffectRun(ctx, q, id)
		if err != nil {
			return err
		}
		s.hook("cancel_run_locked")
		aps, err := q.ApprovalsByRun(ctx, e.RunKey)
		if err != nil {
			return err
		}
		var window *store.Approval
		for i, ap := range aps {
			if ap.Mode == policy.GateActWithWindow && ap.EffectID == e.EffectID {
				window = &aps[i]
			}
		}
		if window == nil {
			return fmt.Errorf("%w: only an act_with_window effect can be cancelled (an operator abandons an unknown or failed one with resolve)", ErrNotResolvable)
		}
		if !by.Operator {
			run, err := q.RunGet(ctx, e.RunKey)
			if err != nil {
				return err
			}
			if _, err := q.RunLock(ctx, store.RunLockParams{Key: run.Key, Owner: by.Owner, Version: run.Version, Now: s.At()}); errors.Is(err, store.ErrNoMatch) {
				return runs.Diagnose(ctx, q, s.Now, 0, runs.LeaseRequest{Key: run.Key, Owner: by.Owner, Version: run.Version})
			} else if err != nil {
				return err
			}
		}
		class := "cancelled"
		out, err = q.EffectUpdate(ctx, store.EffectUpdateParams{ID: id, From: []store.EffectState{store.EffectPending},
			To: store.EffectCancelled, ErrorClass: &class, Now: s.At()})
		if errors.Is(err, store.ErrNoMatch) {
			return fmt.Errorf("%w: it is %s; only a pending effect no sender has taken can be cancelled", ErrNotResolvable, e.State)
		}
		if err != nil {
			return err
		}
		if _, err := q.ApprovalConsume(ctx, store.ApprovalConsumeParams{TokenHash: window.TokenHash, Decision: approvals.Cancel,
			Subject: actor, Reason: reason, Now: s.At()}); err != nil && !errors.Is(err, store.ErrNoMatch) {
			return err
		}
		if err := runs.Event(ctx, q, s.At(), runs.Entry{Key: e.RunKey, Kind: store.EventEffectCancelled, Actor: actor,
			Detail: map[string]any{"effect_id": e.EffectID, "reason": reason, "by": actor}}); err != nil {
			return err
		}
		return s.settle(ctx, q, e.RunKey, store.EffectCancelled)
	})
	if err != nil {
		return store.Effect{}, fmt.Errorf("cancel effect %s: %w", id, err)
	}
	return out, nil
}
