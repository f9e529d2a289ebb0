package effects

// Reconciliation: unknown effects looked up at their provider.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/connector"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

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
// authoritative — twice, a settle window apart, both after the settle window that
// follows the ambiguous attempt (it stays unknown otherwise); several keep it unknown and
// alert once.
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
		err := s.Store.Transact(ctx, func(q store.Queries) error {
			var err error
			claimed, err = q.EffectClaimUnknown(ctx, types, s.At(), reconcileClaim, reconcileBatch)
			return err
		})
		if err != nil {
			return fmt.Errorf("claim unknown effects: %w", err)
		}
		s.hook("reconcile_claimed")
		// A store error on one effect does not leave the rest of the claimed batch
		// unlooked-up until their claims lapse: each answer is its own transaction, and a
		// store that blipped takes the next one.
		var first error
		for _, e := range claimed {
			lk := s.connectors[e.ActionType].(connector.Lookup)
			ids, err := lk.Lookup(ctx, connector.Request{EffectID: ProviderKey(e), RunKey: e.RunKey,
				ActionType: e.ActionType, Target: e.Target, Payload: e.Payload})
			s.hook("reconcile_looked_up")
			if err != nil {
				s.Log.WarnContext(ctx, "reconcile lookup failed", "key", e.RunKey, "effect_id", e.EffectID, "err", err)
				err = s.Store.Transact(ctx, func(q store.Queries) error { return s.checkLater(ctx, q, e) })
			} else {
				err = s.reconcileOne(ctx, e, ids, lk.Authoritative())
			}
			if err != nil && first == nil {
				first = fmt.Errorf("reconcile effect %s: %w", e.ID, err)
			}
		}
		if first != nil {
			return first
		}
		if len(claimed) < reconcileBatch {
			break
		}
	}
	return s.recheck(ctx, types)
}

// recheckGiveUp is how many failed lookups a completed effect's recheck takes before it
// is given up (logged): about an hour and a half of backoff.
const recheckGiveUp = 8

// recheck looks up, once more, completed effects that a confirmed "none" had queued
// again, a settle window after their resend: a first request held past the window and
// performed after all shows as a second record, and raises reconcile_several on the run
// (the effect stays completed: it was sent; a person sees that it was sent twice).
func (s *Service) recheck(ctx context.Context, types []string) error {
	for range reconcileClaims {
		var claimed []store.Effect
		err := s.Store.Transact(ctx, func(q store.Queries) error {
			var err error
			claimed, err = q.EffectClaimRecheck(ctx, types, s.At(), reconcileClaim, reconcileBatch)
			return err
		})
		if err != nil {
			return fmt.Errorf("claim completed effects to recheck: %w", err)
		}
		var first error
		for _, e := range claimed {
			lk := s.connectors[e.ActionType].(connector.Lookup)
			ids, err := lk.Lookup(ctx, connector.Request{EffectID: ProviderKey(e), RunKey: e.RunKey,
				ActionType: e.ActionType, Target: e.Target, Payload: e.Payload})
			if err != nil {
				s.Log.WarnContext(ctx, "recheck lookup failed", "key", e.RunKey, "effect_id", e.EffectID, "err", err)
			}
			if err := s.recheckOne(ctx, e, ids, err); err != nil && first == nil {
				first = fmt.Errorf("recheck effect %s: %w", e.ID, err)
			}
		}
		if first != nil {
			return first
		}
		if len(claimed) < reconcileBatch {
			return nil
		}
	}
	return nil
}

// recheckOne applies a recheck's lookup (lookupErr: it failed) to e, the row claimed.
func (s *Service) recheckOne(ctx context.Context, e store.Effect, ids []string, lookupErr error) error {
	const several = "reconcile_several"
	var alert bool
	err := s.Store.Transact(ctx, func(q store.Queries) error {
		alert = false
		if lookupErr != nil && e.Checks < recheckGiveUp {
			return s.checkLater(ctx, q, e)
		}
		if err := q.EffectRecheckDone(ctx, e.ID, e.Version); errors.Is(err, store.ErrNoMatch) {
			return nil // changed since the claim (an operator): the recheck is moot
		} else if err != nil {
			return err
		}
		if lookupErr != nil {
			s.Log.WarnContext(ctx, "recheck given up: its lookup kept failing", "key", e.RunKey, "effect_id", e.EffectID,
				"checks", e.Checks)
			return nil
		}
		if len(ids) < 2 {
			return nil
		}
		alert = true
		if err := runs.Event(ctx, q, s.At(), runs.Entry{Key: e.RunKey, Kind: store.EventEffectReconciled, Actor: "airlock",
			Detail: map[string]any{"effect_id": e.EffectID, "found": len(ids), "provider_ids": ids, "recheck": true,
				"provider_id": e.ProviderID}}); err != nil {
			return err
		}
		return runs.Event(ctx, q, s.At(), runs.Entry{Key: e.RunKey, Kind: store.EventAlert, Actor: "airlock",
			Detail: map[string]any{"alert": several, "effect_id": e.EffectID, "found": len(ids), "recheck": true}})
	})
	if err == nil && alert {
		s.Alerts.Wake()
	}
	return err
}

// LookupNoneClass is the error class of an unknown effect whose authoritative lookup
// answered "none" once after its settle window: a second "none", a settle window later,
// queues it again.
const LookupNoneClass = "lookup_none"

// settleFrom is when e's settle window starts: when its latest ambiguous attempt began,
// or, for an effect that became unknown before airlock kept that, when it became unknown.
func settleFrom(e store.Effect) time.Time {
	if e.AmbiguousAt != nil {
		return *e.AmbiguousAt
	}
	return e.UpdatedAt
}

// checkLater puts a still-unknown effect, still at e's version, behind the others: the
// next check waits twice as long each time, from 30 s up to 1 h. An effect that moved on
// is left as it is.
func (s *Service) checkLater(ctx context.Context, q store.Queries, e store.Effect) error {
	now, err := s.Read(ctx, q)
	if err != nil {
		return err
	}
	return checkAt(ctx, q, e, now.Add(min(30*time.Second<<min(e.Checks, 7), time.Hour)))
}

// checkAt puts a still-unknown effect, still at e's version, behind the others until at.
func checkAt(ctx context.Context, q store.Queries, e store.Effect, at time.Time) error {
	if err := q.EffectCheckLater(ctx, e.ID, e.Version, at); err != nil && !errors.Is(err, store.ErrNoMatch) {
		return err
	}
	return nil
}

// reconcileOne applies a lookup's answer to e, the row that was claimed, by
// compare-and-set on its version.
func (s *Service) reconcileOne(ctx context.Context, e store.Effect, ids []string, authoritative bool) error {
	const several = "reconcile_several"
	var alert bool
	err := s.Store.Transact(ctx, func(q store.Queries) error {
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
			// "None" proves absence only once the request can no longer arrive: until the
			// settle window has passed since the ambiguous attempt began, the provider may
			// still be processing it, or it may wait in a queue. And one answer may lag
			// (a search index behind its records): a second "none", a settle window later,
			// confirms it.
			window := s.Policy.Settle(e.ActionType)
			settled := settleFrom(e).Add(window)
			if now.Before(settled) {
				return checkAt(ctx, q, e, settled)
			}
			if e.LastErrorClass != LookupNoneClass {
				class := LookupNoneClass
				moved, err := q.EffectUpdate(ctx, store.EffectUpdateParams{ID: e.ID, From: []store.EffectState{store.EffectUnknown},
					Version: e.Version, To: store.EffectUnknown, ErrorClass: &class, Now: s.At()})
				if errors.Is(err, store.ErrNoMatch) {
					return nil // changed during the lookup: the answer is stale
				}
				if err != nil {
					return err
				}
				return checkAt(ctx, q, moved, now.Add(window))
			}
			p.To, p.NotBefore, p.Unambiguous, p.NoneConfirmed = store.EffectPending, &now, true, true
			detail["settle_window_ms"] = window.Milliseconds()
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
			s.Log.InfoContext(ctx, "reconcile answer dropped: the effect changed during the lookup",
				"key", e.RunKey, "effect_id", e.EffectID, "found", len(ids))
			return nil
		}
		if err != nil {
			return err
		}
		if err := s.settle(ctx, q, e.RunKey, p.To); err != nil {
			return err
		}
		if p.To == store.EffectPending {
			if err := q.EffectNotify(ctx); err != nil {
				return err
			}
		}
		if err := runs.Event(ctx, q, s.At(), runs.Entry{Key: e.RunKey, Kind: store.EventEffectReconciled, Actor: "airlock", Detail: detail}); err != nil {
			return err
		}
		if alert {
			if err := runs.Event(ctx, q, s.At(), runs.Entry{Key: e.RunKey, Kind: store.EventAlert, Actor: "airlock",
				Detail: map[string]any{"alert": several, "effect_id": e.EffectID, "found": len(ids)}}); err != nil {
				return err
			}
			return s.checkLater(ctx, q, moved)
		}
		return nil
	})
	if err == nil && alert {
		s.Alerts.Wake()
	}
	if err == nil && len(ids) == 0 && authoritative {
		s.Wake()
	}
	return err
}
