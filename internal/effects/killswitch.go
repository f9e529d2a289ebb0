package effects

// The kill switch: default-deny, read by sends inside the transaction that begins them.

import (
	"context"
	"fmt"
	"strings"
	"time"

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
	switches, err := s.Store.KillSwitchList(ctx)
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
		s.Log.WarnContext(ctx, "kill switch unreadable: treating actions as disabled", "err", err)
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
		if !ok || s.Policy.Action(t) == nil {
			return fmt.Errorf("%w: kill switch scope %q (use global or action:<configured type>)", ErrUnknownActionType, scope)
		}
	}
	if strings.TrimSpace(reason) == "" {
		return &runs.FieldError{Field: "reason", Msg: "required: say why"}
	}
	return s.Store.Transact(ctx, func(q store.Queries) error {
		now := s.At()
		if err := q.KillSwitchGuard(ctx, true); err != nil {
			return err
		}
		if err := q.KillSwitchSet(ctx, store.KillSwitch{Scope: scope, Enabled: enabled, Reason: reason, Actor: actor, UpdatedAt: s.AtOrZero()}); err != nil {
			return err
		}
		s.hook("kill_switch_written")
		return runs.Event(ctx, q, now, runs.Entry{Key: SystemKey, Kind: store.EventKillSwitch, Actor: actor,
			Detail: map[string]any{"scope": scope, "enabled": enabled, "reason": reason}})
	})
}

// KillSwitch returns every scope's setting and whether the environment overrides them.
func (s *Service) KillSwitch(ctx context.Context) ([]store.KillSwitch, bool, error) {
	k, err := s.Store.KillSwitchList(ctx)
	return k, s.envDisabled, err
}

// blockedRetry is how long a send held by the kill switch waits before it is tried (and
// recorded as blocked) again.
const blockedRetry = 5 * time.Second
