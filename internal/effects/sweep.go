package effects

// The sweeper: effects whose sender's lease expired.

import (
	"context"
	"errors"
	"fmt"

	"github.com/airlockhq/airlock/internal/connector"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

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
		expired, err := s.Store.EffectExpiredLeases(ctx, s.At(), 100)
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
			err := s.Store.Transact(ctx, func(q store.Queries) error {
				if _, err := q.RunLockKeys(ctx, []string{e.RunKey}); err != nil {
					return err
				}
				var err error
				out, err = s.finishIn(ctx, q, sent{e: e, owner: e.LeaseOwner, res: res, actor: "airlock", expired: true})
				return err
			})
			if err == nil {
				s.alerted(out.alert)
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
	err := s.Store.Transact(ctx, func(q store.Queries) error {
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
		return runs.Event(ctx, q, s.At(), runs.Entry{Key: e.RunKey, Kind: store.EventEffectRequeued, Actor: "airlock",
			Detail: map[string]any{"effect_id": e.EffectID, "reason": "the sender's lease expired before it began the send"}})
	})
	if err == nil {
		s.Wake()
	}
	return err
}
