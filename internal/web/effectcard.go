package web

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/airlockhq/airlock/internal/connector"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/store"
)

// effectItem is an unknown or failed effect as the operator resolving it reads it: what
// went wrong, the key to look up at the provider, what the effect carries (as far as the
// action's log_fields allow), and what to check before resolving.
type effectItem struct {
	E store.Effect
	// Error says what airlock knows of the failure: its class and attempts.
	Error string
	// ProviderKey is the idempotency key the provider saw (effects.ProviderKey); MessageID
	// the start of an email's derived Message-ID.
	ProviderKey, MessageID string
	// Payload is the effect's payload (or, for an agent's effect, the input its approval
	// showed), field by field; a field outside the action's log_fields is shown by hash.
	Payload []cardField
	// PayloadNote says where the payload came from, or why there is none.
	PayloadNote string
	// Check is what to look for before resolving, for this executor.
	Check []string
}

// effectItems reads the details of each listed effect.
func (w *Web) effectItems(ctx context.Context, list []store.Effect) ([]effectItem, error) {
	out := make([]effectItem, 0, len(list))
	for _, e := range list {
		it, err := w.effectItem(ctx, e)
		if err != nil {
			return nil, err
		}
		out = append(out, it)
	}
	return out, nil
}

func (w *Web) effectItem(ctx context.Context, e store.Effect) (effectItem, error) {
	act := w.console.Policy.Action(e.ActionType)
	it := effectItem{E: e, ProviderKey: effects.ProviderKey(e)}
	it.Error = effectError(e)
	payload, source := e.Payload, "the effect's payload"
	if len(payload) == 0 || string(payload) == "null" {
		// An agent's effect keeps only its input's hash; a gated one's approval showed the
		// input, and holds it while retained.
		aps, err := w.store.ApprovalsByRun(ctx, e.RunKey)
		if err != nil {
			return it, fmt.Errorf("approvals of %q: %w", e.RunKey, err)
		}
		for _, a := range aps {
			if a.EffectID == e.EffectID && a.PayloadHash == e.PayloadHash && len(a.Payload) > 0 && string(a.Payload) != "null" {
				payload, source = a.Payload, "the input its approval showed"
			}
		}
	}
	if len(payload) == 0 || string(payload) == "null" {
		it.PayloadNote = "airlock holds no payload for this effect (an agent that planned it without its input, or one purged under retention); its hash is " + e.PayloadHash + "."
	} else {
		it.Payload = redactedFields(payload, act, e.Executor)
		it.PayloadNote = "From " + source + ". Fields outside the action type's log_fields are shown by their SHA-256 only."
	}
	// What airlock's dispatcher sent, its connector kind says how to find (connector.Finder).
	find := ""
	if e.Executor == store.ExecutorDispatcher && act != nil {
		find, it.MessageID, _ = act.Find(it.ProviderKey, e.Target)
	}
	it.Check = checks(e, find, it)
	return it, nil
}

// effectError is what airlock knows of an effect's failure, in words.
func effectError(e store.Effect) string {
	class := e.LastErrorClass
	if class == "" {
		class = "no error class was reported"
	}
	s := fmt.Sprintf("%s · %d attempt", class, e.Attempts)
	if e.Attempts != 1 {
		s += "s"
	}
	switch {
	case e.AmbiguousAt != nil:
		s += " · an attempt that began " + e.AmbiguousAt.UTC().Format("2006-01-02 15:04:05 MST") + " ended without a clear answer: it may have been performed"
	case e.SendStartedAt != nil:
		s += " · the last send began " + e.SendStartedAt.UTC().Format("2006-01-02 15:04:05 MST")
	}
	return s
}

// redactedFields is a payload's top-level fields, in name order: a log_fields value as
// itself, any other by the SHA-256 of its JSON. An MCP call ({tool, arguments}) shows its
// tool, and its arguments by the same rule.
func redactedFields(raw json.RawMessage, act *policy.Action, executor string) []cardField {
	var obj map[string]json.RawMessage
	if json.Unmarshal(raw, &obj) != nil || obj == nil {
		sum := sha256.Sum256(raw)
		return []cardField{{Label: "payload", Value: "not shown: sha256:" + hex.EncodeToString(sum[:]), Code: true}}
	}
	allowed := func(k string) bool { return act != nil && slices.Contains(act.LogFields, k) }
	var out []cardField
	if executor == store.ExecutorAgent {
		var tool string
		if json.Unmarshal(obj["tool"], &tool) == nil && tool != "" {
			out = append(out, cardField{Label: "tool", Value: tool, Code: true})
			var args map[string]json.RawMessage
			if json.Unmarshal(obj["arguments"], &args) == nil {
				obj = args
			} else {
				obj = map[string]json.RawMessage{}
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(obj)) {
		v := obj[k]
		if !allowed(k) {
			sum := sha256.Sum256(v)
			out = append(out, cardField{Label: k, Value: "not shown (not in log_fields): sha256:" + hex.EncodeToString(sum[:]), Code: true})
			continue
		}
		var s string
		if json.Unmarshal(v, &s) != nil {
			s = connector.PrettyJSON(v)
		}
		out = append(out, cardField{Label: k, Value: s})
	}
	return out
}

// checks is what an operator looks for at the provider before resolving the effect; find
// is the connector kind's own words for what airlock sent ("" when it has none).
func checks(e store.Effect, find string, it effectItem) []string {
	var c []string
	switch {
	case find != "":
		c = append(c, find)
	case e.Executor == store.ExecutorWorker:
		c = append(c, "In the worker's system (its log, its outbox, the provider it calls), look for the task with idempotency key "+
			it.ProviderKey+"; the worker passes that key on to the provider.")
	case e.Executor == store.ExecutorAgent:
		c = append(c, "In "+e.Target+" (the system the agent writes to), look for the change the fields below describe, made around the time above; "+
			"the agent's own log names effect id "+e.EffectID+".")
	default:
		c = append(c, "At the provider, look for the idempotency key "+it.ProviderKey+".")
	}
	c = append(c,
		"Found it: resolve as sent, with the provider's id if it gave one.",
		"Certainly not there (and nothing still in flight can deliver it): resolve as not sent — it is queued again under the same idempotency key, so a late original is de-duplicated by a provider that honours it.",
		"It must never happen now: abandon it.")
	if strings.TrimSpace(e.LastErrorClass) == effects.LeaseExpiredClass {
		c = append(c[:1], append([]string{"The sender's lease lapsed after it began sending: the sender stopped (crash, restart) before it could say what happened."}, c[1:]...)...)
	}
	return c
}
