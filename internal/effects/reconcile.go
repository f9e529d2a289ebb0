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
				map[string]any{"alert": several, "effect_id": e.EffectID, "found": len(ids)}); err != nil {
				return err
			}
			return s.checkLater(ctx, q, moved)
		}
		return nil
	})
	if err == nil && alert {
		s.alerts.Wake()
	}
	if err == nil && len(ids) == 0 && authoritative {
		s.Wake()
	}
	return err
}
