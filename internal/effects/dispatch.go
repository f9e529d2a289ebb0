package effects

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/airlockhq/airlock/internal/connector"
	"github.com/airlockhq/airlock/internal/input"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

// ProviderKey is the idempotency key a provider sees for an effect: its run key and
// effect id, so equal effect ids of different runs never collide at the provider.
func ProviderKey(e store.Effect) string { return e.RunKey + "/" + e.EffectID }

// GlobalScope is the kill switch's scope for every action type.
const GlobalScope = "global"

// ActionScope is the kill switch's scope for one action type.
func ActionScope(actionType string) string { return "action:" + actionType }

// SystemKey is the event key of changes that belong to no run (the kill switch).
const SystemKey = ""

// Enabled is the kill switch as an API read. Sends do not use it: they read the switch
// in the transaction that commits the send's begin (see enabledIn).
func (s *Service) Enabled(ctx context.Context, actionType string) (bool, string) {
	switches, err := s.store.KillSwitchList(ctx)
	return s.enabled(ctx, switches, err, actionType)
}

// enabledIn reads the kill switch inside q's transaction, holding the guard that orders it
// against changes: a change that committed first is seen, one that commits later waits.
func (s *Service) enabledIn(ctx context.Context, q store.Queries) (func(actionType string) (bool, string), error) {
	if err := q.KillSwitchGuard(ctx, false); err != nil {
		return nil, err
	}
	switches, err := q.KillSwitchList(ctx)
	return func(t string) (bool, string) { return s.enabled(ctx, switches, err, t) }, nil
}

// EnabledIn is the kill switch for one action type read inside q's transaction under its
// guard (agent plans use it, as the dispatcher's begin-mark and worker claims do).
func (s *Service) EnabledIn(ctx context.Context, q store.Queries, actionType string) (bool, string, error) {
	enabled, err := s.enabledIn(ctx, q)
	if err != nil {
		return false, "", err
	}
	ok, why := enabled(actionType)
	return ok, why, nil
}

// enabled is default-deny: a send needs a positive read of the global scope, no disabled
// row for the action type, and AI_ACTIONS_ENABLED not set to anything but "true". A read
// error means disabled.
func (s *Service) enabled(ctx context.Context, switches []store.KillSwitch, err error, actionType string) (bool, string) {
	if s.envDisabled {
		return false, "AI_ACTIONS_ENABLED is not true in airlock's environment"
	}
	if err != nil {
		s.log.WarnContext(ctx, "kill switch unreadable: treating actions as disabled", "err", err)
		return false, "the kill switch could not be read"
	}
	global := false
	for _, k := range switches {
		switch k.Scope {
		case GlobalScope:
			if !k.Enabled {
				return false, "disabled globally: " + k.Reason
			}
			global = true
		case ActionScope(actionType):
			if !k.Enabled {
				return false, "disabled for " + actionType + ": " + k.Reason
			}
		}
	}
	if !global {
		return false, "the kill switch has no global setting"
	}
	return true, ""
}

// SetKillSwitch changes one scope and records who did it and why.
func (s *Service) SetKillSwitch(ctx context.Context, scope string, enabled bool, reason, actor string) error {
	if scope != GlobalScope {
		t, ok := strings.CutPrefix(scope, "action:")
		if !ok || s.policy.Action(t) == nil {
			return fmt.Errorf("%w: kill switch scope %q (use global or action:<configured type>)", ErrUnknownActionType, scope)
		}
	}
	if strings.TrimSpace(reason) == "" {
		return &runs.FieldError{Field: "reason", Msg: "required: say why"}
	}
	return s.store.Transact(ctx, func(q store.Queries) error {
		now := s.At()
		if err := q.KillSwitchGuard(ctx, true); err != nil {
			return err
		}
		if err := q.KillSwitchSet(ctx, store.KillSwitch{Scope: scope, Enabled: enabled, Reason: reason, Actor: actor, UpdatedAt: s.AtOrZero()}); err != nil {
			return err
		}
		s.hook("kill_switch_written")
		return runs.Event(ctx, q, now, SystemKey, store.EventKillSwitch, 0, actor, nil,
			map[string]any{"scope": scope, "enabled": enabled, "reason": reason})
	})
}

// KillSwitch returns every scope's setting and whether the environment overrides them.
func (s *Service) KillSwitch(ctx context.Context) ([]store.KillSwitch, bool, error) {
	k, err := s.store.KillSwitchList(ctx)
	return k, s.envDisabled, err
}

// blockedRetry is how long a send held by the kill switch waits before it is tried (and
// recorded as blocked) again.
const blockedRetry = 5 * time.Second

// LeaseExpiredClass is the error class of an effect the sweeper marked unknown because
// its sender's lease lapsed.
const LeaseExpiredClass = "lease_expired"

// LateOutcomeSource is the source, on its effect_reconciled event, of a dispatcher's
// outcome applied after its lease had lapsed.
const LateOutcomeSource = "dispatcher's late outcome"

// SweepExpired handles effects whose sender's lease expired. A dispatcher that died before
// it began the send provably sent nothing: the effect is queued again. One that died after
// may have sent it: unknown (an idempotent connector's effect is queued again instead, to
// be resent with the same key). An external worker's lapsed lease is always unknown.
// Every instance sweeps, dispatching or not. Each effect changes in its own transaction,
// and each change re-checks, in its statement, that the lease is still expired and (for a
// requeue) that the send never began: a row read earlier decides nothing.
func (s *Service) SweepExpired(ctx context.Context) error {
	for range 10 { // up to 1,000 a round; the next round takes the rest
		expired, err := s.store.EffectExpiredLeases(ctx, s.At(), 100)
		if err != nil {
			return fmt.Errorf("find expired effect leases: %w", err)
		}
		s.hook("sweep_listed")
		for _, e := range expired {
			if e.Executor == store.ExecutorDispatcher && e.SendStartedAt == nil {
				if err := s.requeueUnsent(ctx, e); err != nil && !errors.Is(err, store.ErrNoMatch) {
					return err
				}
				continue
			}
			res := connector.Result{Outcome: connector.Ambiguous, Class: LeaseExpiredClass}
			var out outcome
			err := s.store.Transact(ctx, func(q store.Queries) error {
				if _, err := q.RunLockKeys(ctx, []string{e.RunKey}); err != nil {
					return err
				}
				var err error
				out, err = s.finishIn(ctx, q, e, e.LeaseOwner, res, "airlock", true)
				return err
			})
			if err == nil {
				s.raise(ctx, e, res, out.alert)
			}
			if err != nil && !errors.Is(err, ErrEffectLeaseLost) {
				return err
			}
		}
		if len(expired) < 100 {
			return nil
		}
	}
	return nil
}

// requeueUnsent returns an effect whose sender died before sending to pending.
func (s *Service) requeueUnsent(ctx context.Context, e store.Effect) error {
	err := s.store.Transact(ctx, func(q store.Queries) error {
		now, err := s.Read(ctx, q)
		if err != nil {
			return err
		}
		class := "sender_lost_before_send"
		if _, err := q.EffectUpdate(ctx, store.EffectUpdateParams{ID: e.ID, From: []store.EffectState{store.EffectSending},
			Owner: e.LeaseOwner, To: store.EffectPending, NotBefore: &now, ErrorClass: &class, ReleaseAttempt: true,
			LeaseExpired: true, NotStarted: true, Now: s.At()}); err != nil {
			return err
		}
		if err := q.EffectNotify(ctx); err != nil {
			return err
		}
		return runs.Event(ctx, q, s.At(), e.RunKey, store.EventEffectRequeued, 0, "airlock", nil,
			map[string]any{"effect_id": e.EffectID, "reason": "the sender's lease expired before it began the send"})
	})
	if err == nil {
		s.Wake()
	}
	return err
}

// WorkerClaim leases one due effect of the given types to an external worker. The kill
// switch is read in the claiming transaction, like a dispatcher's begin-mark.
func (s *Service) WorkerClaim(ctx context.Context, types []string, lease time.Duration, actor string) (store.Effect, bool, error) {
	for _, t := range types {
		a := s.policy.Action(t)
		if a == nil || a.Executor() != store.ExecutorWorker {
			return store.Effect{}, false, fmt.Errorf("%w: %q is not a worker action type", ErrUnknownActionType, t)
		}
	}
	owner := "worker:" + uuid.NewString()
	var got []store.Effect
	err := s.store.Transact(ctx, func(q store.Queries) error {
		enabled, err := s.enabledIn(ctx, q)
		if err != nil {
			return err
		}
		caps := map[string]int{}
		for _, t := range types {
			if ok, _ := enabled(t); ok {
				caps[t] = 1
			}
		}
		if len(caps) == 0 {
			_, why := enabled(types[0])
			return fmt.Errorf("%w: %s", ErrActionsDisabled, why)
		}
		got, err = q.EffectLease(ctx, store.EffectLeaseParams{Executor: store.ExecutorWorker, Caps: caps,
			Owner: owner, Lease: lease, Limit: 1, Now: s.At()})
		if err != nil || len(got) == 0 {
			return err
		}
		e := got[0]
		return runs.Event(ctx, q, s.At(), e.RunKey, store.EventEffectClaimed, 0, actor, nil,
			map[string]any{"effect_id": e.EffectID, "action_type": e.ActionType, "attempts": e.Attempts})
	})
	if err != nil || len(got) == 0 {
		return store.Effect{}, false, err
	}
	return got[0], true, nil
}

// WorkerReport records an external worker's outcome for an effect it holds.
func (s *Service) WorkerReport(ctx context.Context, id, owner string, res connector.Result, actor string) (store.Effect, error) {
	e, err := s.Get(ctx, id)
	if err != nil {
		return store.Effect{}, err
	}
	if e.Executor != store.ExecutorWorker || e.State != store.EffectSending || e.LeaseOwner != owner {
		return store.Effect{}, ErrEffectLeaseLost
	}
	out, err := s.finish(ctx, e, owner, res, actor)
	return out, err
}

// Resolve outcomes an operator may record.
const (
	OutcomeSent    = "sent"     // it happened: completed, with the provider id if known
	OutcomeNotSent = "not_sent" // it did not: queue it again under the same effect id
	OutcomeAbandon = "abandon"  // give it up: cancelled
)

// Resolution is an operator's decision on an unknown or failed effect.
type Resolution struct {
	Outcome    string // OutcomeSent, OutcomeNotSent or OutcomeAbandon
	ProviderID string // with OutcomeSent, the provider's id if known
	Note       string // what the operator checked: required
	// Version is the effect's version the operator looked at: the decision applies only
	// if the effect is still that row (ErrEffectChanged otherwise). 0 applies it to the
	// effect as it is now, if it is unknown or failed.
	Version int64
}

// Resolve is an operator's decision on an unknown or failed effect, audited on its run.
func (s *Service) Resolve(ctx context.Context, id string, r Resolution, actor string) (store.Effect, error) {
	to := map[string]store.EffectState{OutcomeSent: store.EffectCompleted, OutcomeNotSent: store.EffectPending, OutcomeAbandon: store.EffectCancelled}[r.Outcome]
	if to == "" {
		return store.Effect{}, &runs.FieldError{Field: "outcome", Msg: "must be sent, not_sent or abandon"}
	}
	if strings.TrimSpace(r.Note) == "" {
		return store.Effect{}, &runs.FieldError{Field: "note", Msg: "required: say what you checked"}
	}
	if r.ProviderID != "" && r.Outcome != OutcomeSent {
		return store.Effect{}, &runs.FieldError{Field: "provider_id", Msg: "only with outcome sent"}
	}
	if r.Version < 0 {
		return store.Effect{}, &runs.FieldError{Field: "version", Msg: "must be the version the effect had when you checked it (GET /v1/runs/{key} lists it)"}
	}
	// Every caller (API, console, CLI) gets the same rule: PostgreSQL cannot store a NUL
	// or invalid UTF-8, and an id is shown to people as it is.
	if err := input.Text(r.ProviderID, input.Rule{Max: 200, Visible: true}); err != nil {
		return store.Effect{}, &runs.FieldError{Field: "provider_id", Msg: err.Error()}
	}
	var out store.Effect
	err := s.store.Transact(ctx, func(q store.Queries) error {
		e, err := s.lockEffectRun(ctx, q, id)
		if err != nil {
			return err
		}
		if r.Version != 0 && e.Version != r.Version {
			return fmt.Errorf("%w: you decided on version %d; it is now %s at version %d: look again", ErrEffectChanged, r.Version, e.State, e.Version)
		}
		now, err := s.Read(ctx, q)
		if err != nil {
			return err
		}
		// The row just read, under its run's lock, is the row decided on.
		p := store.EffectUpdateParams{ID: id, From: []store.EffectState{store.EffectUnknown, store.EffectFailed}, Version: e.Version, To: to, Now: s.At()}
		if r.Outcome == OutcomeSent {
			p.ProviderID = &r.ProviderID
		}
		if r.Outcome == OutcomeNotSent {
			p.NotBefore = &now
		}
		s.hook("resolve_read")
		out, err = q.EffectUpdate(ctx, p)
		if errors.Is(err, store.ErrNoMatch) {
			return fmt.Errorf("%w: it is %s; only unknown or failed effects are resolved", ErrNotResolvable, e.State)
		}
		if err != nil {
			return err
		}
		if err := s.settleApproved(ctx, q, e.RunKey, to); err != nil {
			return err
		}
		if to == store.EffectPending {
			if err := q.EffectNotify(ctx); err != nil {
				return err
			}
		}
		return runs.Event(ctx, q, s.At(), e.RunKey, store.EventEffectResolved, 0, actor, nil, map[string]any{
			"effect_id": e.EffectID, "from": e.State, "outcome": r.Outcome, "provider_id": r.ProviderID, "note": r.Note,
			"version": e.Version,
		})
	})
	if err != nil {
		return store.Effect{}, fmt.Errorf("resolve effect %s: %w", id, err)
	}
	return out, nil
}

// reconcileBatch is how many unknown effects one claim takes, and reconcileClaims how
// many claims one reconciliation round makes at most.
const (
	reconcileBatch  = 10
	reconcileClaims = 10
)

// reconcileClaim keeps a claimed unknown effect from other instances' reconciliation while
// this one looks it up: longer than a batch of lookups takes (10 × the default 10 s
// timeout). A claim that lapses (its instance died) makes the effect due again; one that
// lapses mid-lookup costs a second lookup, never a second send: every answer is applied
// by compare-and-set on the version the claim returned.
const reconcileClaim = 5 * time.Minute

// Reconcile asks connectors with a lookup about unknown effects that are due: one match
// completes the effect; none queues it again under the same effect id where the lookup is
// authoritative (it stays unknown otherwise); several keep it unknown and alert once.
//
// Each effect is claimed in the statement that lists it, so two instances never look up
// the same one at once, and the answer is applied only to the row that was claimed: if
// the effect changed meanwhile — an operator resolved it, or it was queued, sent and
// became unknown again — the answer is about a send that is no longer the latest, and is
// dropped (the effect is due again for a fresh lookup). Every effect that stays unknown is
// checked again later, with backoff, and goes behind the others: effects that can never
// be settled automatically cannot starve newer ones.
func (s *Service) Reconcile(ctx context.Context) error {
	var types []string
	for t, c := range s.connectors {
		if lk, ok := c.(connector.Lookup); ok {
			if h, ok := lk.(interface{ HasLookup() bool }); !ok || h.HasLookup() {
				types = append(types, t)
			}
		}
	}
	if len(types) == 0 {
		return nil
	}
	for range reconcileClaims {
		var claimed []store.Effect
		err := s.store.Transact(ctx, func(q store.Queries) error {
			var err error
			claimed, err = q.EffectClaimUnknown(ctx, types, s.At(), reconcileClaim, reconcileBatch)
			return err
		})
		if err != nil {
			return fmt.Errorf("claim unknown effects: %w", err)
		}
		s.hook("reconcile_claimed")
		for _, e := range claimed {
			lk := s.connectors[e.ActionType].(connector.Lookup)
			ids, err := lk.Lookup(ctx, connector.Request{EffectID: ProviderKey(e), RunKey: e.RunKey,
				ActionType: e.ActionType, Target: e.Target, Payload: e.Payload})
			s.hook("reconcile_looked_up")
			if err != nil {
				s.log.WarnContext(ctx, "reconcile lookup failed", "key", e.RunKey, "effect_id", e.EffectID, "err", err)
				err = s.store.Transact(ctx, func(q store.Queries) error { return s.checkLater(ctx, q, e) })
			} else {
				err = s.reconcileOne(ctx, e, ids, lk.Authoritative())
			}
			if err != nil {
				return err
			}
		}
		if len(claimed) < reconcileBatch {
			return nil
		}
	}
	return nil
}

// checkLater puts a still-unknown effect, still at e's version, behind the others: the
// next check waits twice as long each time, from 30 s up to 1 h. An effect that moved on
// is left as it is.
func (s *Service) checkLater(ctx context.Context, q store.Queries, e store.Effect) error {
	now, err := s.Read(ctx, q)
	if err != nil {
		return err
	}
	wait := min(30*time.Second<<min(e.Checks, 7), time.Hour)
	if err := q.EffectCheckLater(ctx, e.ID, e.Version, now.Add(wait)); err != nil && !errors.Is(err, store.ErrNoMatch) {
		return err
	}
	return nil
}

// reconcileOne applies a lookup's answer to e, the row that was claimed, by
// compare-and-set on its version.
func (s *Service) reconcileOne(ctx context.Context, e store.Effect, ids []string, authoritative bool) error {
	const several = "reconcile_several"
	var alert bool
	err := s.store.Transact(ctx, func(q store.Queries) error {
		alert = false // Transact may run this again
		if _, err := q.RunLockKeys(ctx, []string{e.RunKey}); err != nil {
			return err
		}
		now, err := s.Read(ctx, q)
		if err != nil {
			return err
		}
		p := store.EffectUpdateParams{ID: e.ID, From: []store.EffectState{store.EffectUnknown}, Version: e.Version, Now: s.At()}
		detail := map[string]any{"effect_id": e.EffectID, "found": len(ids)}
		switch {
		case len(ids) == 1:
			p.To, p.ProviderID = store.EffectCompleted, &ids[0]
			detail["provider_id"] = ids[0]
		case len(ids) == 0 && authoritative:
			p.To, p.NotBefore = store.EffectPending, &now
		case len(ids) == 0:
			return s.checkLater(ctx, q, e) // not proof of absence: a person decides
		default:
			if e.LastErrorClass == several {
				return s.checkLater(ctx, q, e) // already alerted
			}
			class := several
			p.To, p.ErrorClass, alert = store.EffectUnknown, &class, true
			detail["provider_ids"] = ids
		}
		moved, err := q.EffectUpdate(ctx, p)
		if errors.Is(err, store.ErrNoMatch) {
			// Resolved, or queued and sent again, since the claim: the answer is stale.
			s.log.InfoContext(ctx, "reconcile answer dropped: the effect changed during the lookup",
				"key", e.RunKey, "effect_id", e.EffectID, "found", len(ids))
			return nil
		}
		if err != nil {
			return err
		}
		if err := s.settleApproved(ctx, q, e.RunKey, p.To); err != nil {
			return err
		}
		if p.To == store.EffectPending {
			if err := q.EffectNotify(ctx); err != nil {
				return err
			}
		}
		if err := runs.Event(ctx, q, s.At(), e.RunKey, store.EventEffectReconciled, 0, "airlock", nil, detail); err != nil {
			return err
		}
		if alert {
			if err := runs.Event(ctx, q, s.At(), e.RunKey, store.EventAlert, 0, "airlock", nil,
				map[string]any{"alert": several, "effect_id": e.EffectID}); err != nil {
				return err
			}
			return s.checkLater(ctx, q, moved)
		}
		return nil
	})
	if err == nil && alert {
		s.alerts.Alert(ctx, several, e.RunKey, slog.String("effect_id", e.EffectID), slog.Int("found", len(ids)))
	}
	if err == nil && len(ids) == 0 && authoritative {
		s.Wake()
	}
	return err
}
