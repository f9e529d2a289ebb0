package effects

// An operator's decision on an unknown or failed effect.

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/airlockhq/airlock/internal/input"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
)

// Resolve outcomes an operator may record.
const (
	OutcomeSent    = "sent"     // it happened: completed, with the provider id if known
	OutcomeNotSent = "not_sent" // it did not: queue it again under the same effect id
	OutcomeAbandon = "abandon"  // give it up: cancelled
)

// Resolution is an operator's decision on an unknown or failed effect.
type Resolution struct {
	Outcome    string // OutcomeSent, OutcomeNotSent or OutcomeAbandon
	ProviderID string // with OutcomeSent, the provider's id
	// NoProviderID, with OutcomeSent, says the provider gave no id: "sent" needs one of
	// the two, so a missing id is a decision the operator made, not a field left empty.
	NoProviderID bool
	Note         string // what the operator checked: required
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
	if r.Outcome != OutcomeSent && (r.ProviderID != "" || r.NoProviderID) {
		return store.Effect{}, &runs.FieldError{Field: "provider_id", Msg: "only with outcome sent"}
	}
	if r.Outcome == OutcomeSent && r.ProviderID == "" && !r.NoProviderID {
		return store.Effect{}, &runs.FieldError{Field: "provider_id", Msg: "required with outcome sent: the provider's id, or no_provider_id if the provider gave none"}
	}
	if r.ProviderID != "" && r.NoProviderID {
		return store.Effect{}, &runs.FieldError{Field: "no_provider_id", Msg: "not with a provider_id"}
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
	err := s.Store.Transact(ctx, func(q store.Queries) error {
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
			// The operator checked: absence is proven, as by a confirmed lookup.
			p.NotBefore, p.Unambiguous = &now, true
		}
		s.hook("resolve_read")
		out, err = q.EffectUpdate(ctx, p)
		if errors.Is(err, store.ErrNoMatch) {
			return fmt.Errorf("%w: it is %s; only unknown or failed effects are resolved", ErrNotResolvable, e.State)
		}
		if err != nil {
			return err
		}
		if err := s.settle(ctx, q, e.RunKey, to); err != nil {
			return err
		}
		if to == store.EffectPending {
			if err := q.EffectNotify(ctx); err != nil {
				return err
			}
		}
		detail := map[string]any{"effect_id": e.EffectID, "from": e.State, "outcome": r.Outcome, "provider_id": r.ProviderID,
			"note": r.Note, "version": e.Version}
		if r.NoProviderID {
			detail["provider_id_absent"] = true
		}
		return runs.Event(ctx, q, s.At(), runs.Entry{Key: e.RunKey, Kind: store.EventEffectResolved, Actor: actor, Detail: detail})
	})
	if err != nil {
		return store.Effect{}, fmt.Errorf("resolve effect %s: %w", id, err)
	}
	return out, nil
}
