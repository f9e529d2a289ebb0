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

// Enabled is the kill switch read at the send boundary. It is default-deny: a send needs
// a positive read of the global scope, no disabled row for the action type, and
// AI_ACTIONS_ENABLED not set to anything but "true". A read error means disabled.
func (s *Service) Enabled(ctx context.Context, actionType string) (bool, string) {
	if s.envDisabled {
		return false, "AI_ACTIONS_ENABLED is not true in airlock's environment"
	}
	switches, err := s.store.KillSwitchList(ctx)
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
		if err := q.KillSwitchSet(ctx, store.KillSwitch{Scope: scope, Enabled: enabled, Reason: reason, Actor: actor, UpdatedAt: s.AtOrZero()}); err != nil {
			return err
		}
		return runs.Event(ctx, q, now, SystemKey, "kill_switch", 0, actor, nil,
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

// Dispatcher sends due effects through their connectors. Any number may run, in one
// process or many, against one database.
type Dispatcher struct {
	*Service
	BatchSize int
	Lease     time.Duration
	Interval  time.Duration
	// Crash, when set, is called at the named points (after_lease, after_send): the crash
	// tests use it to SIGKILL the process there. Never set in production.
	Crash func(point string)
}

// Run dispatches until ctx ends.
func (d *Dispatcher) Run(ctx context.Context) {
	t := time.NewTicker(d.Interval)
	defer t.Stop()
	for {
		if _, err := d.Tick(ctx); err != nil && ctx.Err() == nil {
			d.log.ErrorContext(ctx, "dispatch round failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Tick runs one round: expired leases become unknown, then one batch of due effects is
// leased and sent. It returns how many effects it leased.
func (d *Dispatcher) Tick(ctx context.Context) (int, error) {
	if err := d.SweepExpired(ctx); err != nil {
		return 0, err
	}
	owner := "dispatcher:" + uuid.NewString()
	var batch []store.Effect
	err := d.store.Transact(ctx, func(q store.Queries) error {
		var err error
		batch, err = q.EffectLease(ctx, store.EffectLeaseParams{Executor: store.ExecutorDispatcher,
			Owner: owner, Lease: d.Lease, Limit: d.BatchSize, Now: d.At()})
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("lease effects: %w", err)
	}
	for _, e := range batch {
		if err := d.send(ctx, e, owner); err != nil {
			d.log.ErrorContext(ctx, "dispatch", "key", e.RunKey, "effect_id", e.EffectID, "err", err)
		}
	}
	return len(batch), nil
}

func (d *Dispatcher) crash(point string) {
	if d.Crash != nil {
		d.Crash(point)
	}
}

func (d *Dispatcher) send(ctx context.Context, e store.Effect, owner string) error {
	if ok, why := d.Enabled(ctx, e.ActionType); !ok {
		return d.block(ctx, e, owner, why)
	}
	c := d.connectors[e.ActionType]
	if c == nil {
		// Configured once, removed from the policy since: nothing can send it safely.
		_, _, err := d.finish(ctx, e, owner, connector.Result{Outcome: connector.Refused, Class: "no_connector"}, "airlock")
		return err
	}
	d.crash("after_lease")
	// Commit "the send begins" first: a sender that dies before this point provably sent
	// nothing, and the sweeper can queue its effect again instead of calling it unknown.
	err := d.store.Transact(ctx, func(q store.Queries) error {
		_, err := q.EffectUpdate(ctx, store.EffectUpdateParams{ID: e.ID, From: []store.EffectState{store.EffectSending},
			Owner: owner, To: store.EffectSending, Started: true, Now: d.At()})
		return err
	})
	if err != nil {
		return fmt.Errorf("mark send started: %w", err) // lease lost: someone else decides now
	}
	start := time.Now()
	sendCtx, cancel := context.WithTimeout(ctx, d.Lease)
	res := c.Send(sendCtx, connector.Request{EffectID: ProviderKey(e), RunKey: e.RunKey,
		ActionType: e.ActionType, Target: e.Target, Payload: e.Payload})
	cancel()
	if d.Observe != nil {
		d.Observe(res.Outcome.String(), time.Since(start))
	}
	d.crash("after_send")
	_, _, err = d.finish(ctx, e, owner, res, "airlock")
	return err
}

// block returns a leased effect to pending untouched, and records the blocked attempt.
func (d *Dispatcher) block(ctx context.Context, e store.Effect, owner, why string) error {
	return d.store.Transact(ctx, func(q store.Queries) error {
		now, err := d.Read(ctx, q)
		if err != nil {
			return err
		}
		nb, class := now.Add(blockedRetry), "actions_disabled"
		_, err = q.EffectUpdate(ctx, store.EffectUpdateParams{ID: e.ID, From: []store.EffectState{store.EffectSending},
			Owner: owner, To: store.EffectPending, NotBefore: &nb, ErrorClass: &class, ReleaseAttempt: true, Now: d.At()})
		if err != nil {
			return err
		}
		return runs.Event(ctx, q, d.At(), e.RunKey, "send_blocked", 0, "airlock", nil,
			map[string]any{"effect_id": e.EffectID, "action_type": e.ActionType, "reason": why})
	})
}

// SweepExpired handles effects whose sender's lease expired. A dispatcher that died before
// it began the send provably sent nothing: the effect is queued again. One that died after
// may have sent it: unknown (an idempotent connector's effect is queued again instead, to
// be resent with the same key). An external worker's lapsed lease is always unknown.
// Each effect changes in its own transaction, on its own run key.
func (s *Service) SweepExpired(ctx context.Context) error {
	expired, err := s.store.EffectExpiredLeases(ctx, s.At(), 100)
	if err != nil {
		return fmt.Errorf("find expired effect leases: %w", err)
	}
	for _, e := range expired {
		if e.Executor == store.ExecutorDispatcher && e.SendStartedAt == nil {
			if err := s.requeueUnsent(ctx, e); err != nil && !errors.Is(err, store.ErrNoMatch) {
				return err
			}
			continue
		}
		res := connector.Result{Outcome: connector.Ambiguous, Class: "lease_expired"}
		if _, _, err := s.finish(ctx, e, e.LeaseOwner, res, "airlock"); err != nil && !errors.Is(err, ErrEffectLeaseLost) {
			return err
		}
	}
	return nil
}

// requeueUnsent returns an effect whose sender died before sending to pending.
func (s *Service) requeueUnsent(ctx context.Context, e store.Effect) error {
	return s.store.Transact(ctx, func(q store.Queries) error {
		now, err := s.Read(ctx, q)
		if err != nil {
			return err
		}
		class := "sender_lost_before_send"
		if _, err := q.EffectUpdate(ctx, store.EffectUpdateParams{ID: e.ID, From: []store.EffectState{store.EffectSending},
			Owner: e.LeaseOwner, To: store.EffectPending, NotBefore: &now, ErrorClass: &class, ReleaseAttempt: true, Now: s.At()}); err != nil {
			return err
		}
		return runs.Event(ctx, q, s.At(), e.RunKey, "effect_requeued", 0, "airlock", nil,
			map[string]any{"effect_id": e.EffectID, "reason": "the sender's lease expired before it began the send"})
	})
}

// WorkerClaim leases one due effect of the given types to an external worker.
func (s *Service) WorkerClaim(ctx context.Context, types []string, lease time.Duration, actor string) (store.Effect, bool, error) {
	var allowed []string
	for _, t := range types {
		a := s.policy.Action(t)
		if a == nil || a.Executor() != store.ExecutorWorker {
			return store.Effect{}, false, fmt.Errorf("%w: %q is not a worker action type", ErrUnknownActionType, t)
		}
		if ok, _ := s.Enabled(ctx, t); ok {
			allowed = append(allowed, t)
		}
	}
	if len(allowed) == 0 {
		_, why := s.Enabled(ctx, types[0])
		return store.Effect{}, false, fmt.Errorf("%w: %s", ErrActionsDisabled, why)
	}
	owner := "worker:" + uuid.NewString()
	var got []store.Effect
	err := s.store.Transact(ctx, func(q store.Queries) error {
		var err error
		got, err = q.EffectLease(ctx, store.EffectLeaseParams{Executor: store.ExecutorWorker, Types: allowed,
			Owner: owner, Lease: lease, Limit: 1, Now: s.At()})
		if err != nil || len(got) == 0 {
			return err
		}
		e := got[0]
		return runs.Event(ctx, q, s.At(), e.RunKey, "effect_claimed", 0, actor, nil,
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
	out, _, err := s.finish(ctx, e, owner, res, actor)
	return out, err
}

// Resolve outcomes an operator may record.
const (
	OutcomeSent    = "sent"     // it happened: completed, with the provider id if known
	OutcomeNotSent = "not_sent" // it did not: queue it again under the same effect id
	OutcomeAbandon = "abandon"  // give it up: cancelled
)

// Resolve is an operator's decision on an unknown or failed effect, audited on its run.
func (s *Service) Resolve(ctx context.Context, id, outcome, providerID, note, actor string) (store.Effect, error) {
	to := map[string]store.EffectState{OutcomeSent: store.EffectCompleted, OutcomeNotSent: store.EffectPending, OutcomeAbandon: store.EffectCancelled}[outcome]
	if to == "" {
		return store.Effect{}, &runs.FieldError{Field: "outcome", Msg: "must be sent, not_sent or abandon"}
	}
	if strings.TrimSpace(note) == "" {
		return store.Effect{}, &runs.FieldError{Field: "note", Msg: "required: say what you checked"}
	}
	if providerID != "" && outcome != OutcomeSent {
		return store.Effect{}, &runs.FieldError{Field: "provider_id", Msg: "only with outcome sent"}
	}
	var out store.Effect
	err := s.store.Transact(ctx, func(q store.Queries) error {
		e, err := q.EffectGet(ctx, id)
		if errors.Is(err, store.ErrNotFound) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		now, err := s.Read(ctx, q)
		if err != nil {
			return err
		}
		p := store.EffectUpdateParams{ID: id, From: []store.EffectState{store.EffectUnknown, store.EffectFailed}, To: to, Now: s.At()}
		if outcome == OutcomeSent {
			p.ProviderID = &providerID
		}
		if outcome == OutcomeNotSent {
			p.NotBefore = &now
		}
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
		return runs.Event(ctx, q, s.At(), e.RunKey, "effect_resolved", 0, actor, nil, map[string]any{
			"effect_id": e.EffectID, "from": e.State, "outcome": outcome, "provider_id": providerID, "note": note,
		})
	})
	if err != nil {
		return store.Effect{}, fmt.Errorf("resolve effect %s: %w", id, err)
	}
	return out, nil
}

// Reconcile asks connectors with a lookup about unknown effects: one match completes the
// effect; none queues it again under the same effect id where the lookup is
// authoritative (it stays unknown otherwise); several keep it unknown and alert once.
func (s *Service) Reconcile(ctx context.Context) error {
	unknown, err := s.store.EffectList(ctx, store.EffectListParams{States: []store.EffectState{store.EffectUnknown}, Limit: 100})
	if err != nil {
		return fmt.Errorf("list unknown effects: %w", err)
	}
	for _, e := range unknown {
		lk, ok := s.connectors[e.ActionType].(connector.Lookup)
		if !ok || e.Executor != store.ExecutorDispatcher {
			continue
		}
		if h, ok := lk.(interface{ HasLookup() bool }); ok && !h.HasLookup() {
			continue
		}
		ids, err := lk.Lookup(ctx, connector.Request{EffectID: ProviderKey(e), RunKey: e.RunKey,
			ActionType: e.ActionType, Target: e.Target, Payload: e.Payload})
		if err != nil {
			s.log.WarnContext(ctx, "reconcile lookup failed", "key", e.RunKey, "effect_id", e.EffectID, "err", err)
			continue
		}
		if err := s.reconcileOne(ctx, e, ids, lk.Authoritative()); err != nil {
			return err
		}
	}
	return nil
}

func (s *Service) reconcileOne(ctx context.Context, e store.Effect, ids []string, authoritative bool) error {
	const several = "reconcile_several"
	var alert bool
	err := s.store.Transact(ctx, func(q store.Queries) error {
		now, err := s.Read(ctx, q)
		if err != nil {
			return err
		}
		p := store.EffectUpdateParams{ID: e.ID, From: []store.EffectState{store.EffectUnknown}, Now: s.At()}
		detail := map[string]any{"effect_id": e.EffectID, "found": len(ids)}
		switch {
		case len(ids) == 1:
			p.To, p.ProviderID = store.EffectCompleted, &ids[0]
			detail["provider_id"] = ids[0]
		case len(ids) == 0 && authoritative:
			p.To, p.NotBefore = store.EffectPending, &now
		case len(ids) == 0:
			return nil // not proof of absence: a person decides
		default:
			if e.LastErrorClass == several {
				return nil // already alerted
			}
			class := several
			p.To, p.ErrorClass, alert = store.EffectUnknown, &class, true
			detail["provider_ids"] = ids
		}
		if _, err := q.EffectUpdate(ctx, p); err != nil {
			if errors.Is(err, store.ErrNoMatch) {
				return nil // resolved meanwhile
			}
			return err
		}
		if err := s.settleApproved(ctx, q, e.RunKey, p.To); err != nil {
			return err
		}
		if err := runs.Event(ctx, q, s.At(), e.RunKey, "effect_reconciled", 0, "airlock", nil, detail); err != nil {
			return err
		}
		if alert {
			return runs.Event(ctx, q, s.At(), e.RunKey, "alert", 0, "airlock", nil,
				map[string]any{"alert": several, "effect_id": e.EffectID})
		}
		return nil
	})
	if err == nil && alert {
		s.alerts.Alert(ctx, several, e.RunKey, slog.String("effect_id", e.EffectID), slog.Int("found", len(ids)))
	}
	return err
}
