package effects

// The external-worker protocol: claim under a lease, report the outcome.

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/airlockhq/airlock/internal/connector"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

// WorkerClaim leases one due effect of the given types to an external worker. The kill
// switch is read in the claiming transaction, like a dispatcher's begin-mark.
func (s *Service) WorkerClaim(ctx context.Context, types []string, lease time.Duration, actor string) (store.Effect, bool, error) {
	for _, t := range types {
		a := s.Policy.Action(t)
		if a == nil || a.Executor() != store.ExecutorWorker {
			return store.Effect{}, false, fmt.Errorf("%w: %q is not a worker action type", ErrUnknownActionType, t)
		}
	}
	owner := "worker:" + uuid.NewString()
	var got []store.Effect
	err := s.Store.Transact(ctx, func(q store.Queries) error {
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
		return runs.Event(ctx, q, s.At(), runs.Entry{Key: e.RunKey, Kind: store.EventEffectClaimed, Actor: actor,
			Detail: map[string]any{"effect_id": e.EffectID, "action_type": e.ActionType, "attempts": e.Attempts}})
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
		if e.Executor == store.ExecutorWorker && e.State == store.EffectCompleted && res.Outcome == connector.Sent {
			return store.Effect{}, s.lateCompletion(ctx, e, res)
		}
		return store.Effect{}, ErrEffectLeaseLost
	}
	out, err := s.finish(ctx, e, owner, res, actor)
	return out, err
}

// lateCompletion answers a completion reported for an effect that another attempt has
// completed: refused, as any report without the lease, but a different receipt is a
// second performance and goes on the record (once per receipt) and to the alerter.
func (s *Service) lateCompletion(ctx context.Context, e store.Effect, res connector.Result) error {
	late, _ := connector.SafeProviderID(res.ProviderID) // as it would have been stored
	if late == e.ProviderID {
		return ErrEffectLeaseLost // the same completion again
	}
	p := SecondPerformance{RunKey: e.RunKey, EffectID: e.EffectID, State: store.EffectCompleted, LateReceipt: late,
		Source: SourceWorkerReport}
	var evidence, written bool
	err := s.Store.Transact(ctx, func(q store.Queries) error {
		evidence, written = false, false
		cur, err := q.EffectGet(ctx, e.ID)
		if err != nil {
			return err
		}
		if cur.State != store.EffectCompleted || cur.ProviderID == late {
			return nil
		}
		evidence, p.Receipt = true, cur.ProviderID
		written, err = RecordPerformedTwice(ctx, q, s.At(), p)
		return err
	})
	if err != nil {
		return fmt.Errorf("record late completion of effect %s: %w", e.ID, err)
	}
	if written {
		RaisePerformedTwice(s.Alerts)
	}
	if !evidence {
		return ErrEffectLeaseLost
	}
	return fmt.Errorf("%w: another attempt completed it with another receipt; this report was recorded as a second performance (alert %s)",
		ErrEffectLeaseLost, PerformedTwiceAlert)
}
