package mcpgw

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/policy"
)

// reconcile settles an effect whose earlier attempt stopped between plan and confirm:
// by the lookup tool when the policy gives one, else it becomes unknown for a person.
// settled means cleared: plan again.
func (g *Gateway) reconcile(ctx context.Context, tc *toolCall, owner string) (bool, *mcp.CallToolResult, error) {
	runID, effectID, call := tc.runID, tc.effectID, tc.rec
	person := fmt.Sprintf("effect %s of run %s was planned but never confirmed (or its outcome is unknown): it may or may not have happened, so it is not sent again. "+
		"A person checks upstream %s for what %s with these arguments would have made or changed (the effect's record holds them) and resolves it "+
		"(airlock effects list --state unknown; airlock effects resolve ID --outcome sent|not_sent).", effectID, runID, tc.route.upstream, tc.name)
	var found []string
	undetermined := true
	if l := tc.route.tool.Lookup; l != nil {
		var err error
		found, err = g.lookup(ctx, tc, l)
		if err != nil {
			g.opts.Log.Warn("the lookup could not decide", "run_id", runID, "effect_id", effectID, "err", err)
		} else {
			undetermined = false
		}
	}
	status, err := g.opts.Client.Reconcile(ctx, runID, effectID, owner, found, undetermined)
	switch {
	case client.IsCode(err, "not_planned"):
		call.Decision = "reconcile_first"
		return false, nil, refuse("reconcile_first", "%s", person)
	case client.IsCode(err, "not_settled"):
		// The lookup found nothing, but the earlier call may still be in progress at
		// the server: not sent again now; asked again after the settle window.
		call.Decision = "reconcile_first"
		return false, nil, refuse("reconcile_first", "effect %s of run %s was planned recently and its earlier call may still be in progress: it is not sent again yet. %v", effectID, runID, err)
	case err != nil:
		return false, nil, refuse("airlock_unavailable", "airlock could not be asked, so the call was not sent: %v", err)
	}
	switch status {
	case client.EffectCleared:
		call.Decision = "" // the executed call decides
		return true, nil, nil
	case client.EffectConfirmed:
		call.Decision = "reconciled_confirmed"
		return false, replay(effectID, found[0], nil), nil
	}
	call.Decision = "reconcile_first"
	if len(found) > 1 {
		return false, nil, refuse("reconcile_first", "the lookup found %d candidates for effect %s: a person decides. %s", len(found), effectID, person)
	}
	return false, nil, refuse("reconcile_first", "%s", person)
}

// lookup calls the policy's lookup tool and returns a receipt for each record found.
func (g *Gateway) lookup(ctx context.Context, tc *toolCall, l *policy.Lookup) ([]string, error) {
	runID, effectID, upstream, args := tc.runID, tc.effectID, tc.route.upstream, tc.args
	var callArgs map[string]any
	_ = json.Unmarshal(args, &callArgs)
	subst := func(s string) string {
		s = strings.ReplaceAll(s, "{effect_id}", effectID)
		s = strings.ReplaceAll(s, "{run_id}", runID)
		return regexp.MustCompile(`\{arg\.([A-Za-z0-9_\-]+)\}`).ReplaceAllStringFunc(s, func(m string) string {
			v, _ := callArgs[m[5:len(m)-1]].(string)
			return v
		})
	}
	var fill func(v any) any
	fill = func(v any) any {
		switch x := v.(type) {
		case string:
			return subst(x)
		case map[string]any:
			out := map[string]any{}
			for k, e := range x {
				out[k] = fill(e)
			}
			return out
		case []any:
			out := make([]any, len(x))
			for i, e := range x {
				out[i] = fill(e)
			}
			return out
		}
		return v
	}
	lookupArgs := map[string]any{}
	for k, v := range l.Arguments {
		lookupArgs[k] = fill(v)
	}
	res, err := g.ups[upstream].CallTool(ctx, &mcp.CallToolParams{Name: l.Tool, Arguments: lookupArgs})
	if err != nil {
		return nil, err
	}
	if res.IsError {
		return nil, errors.New("the lookup tool answered an error")
	}
	return Found(res, l)
}

// Found counts the records in a lookup's result (see [policy.Lookup]) and returns a
// receipt for each.
func Found(res *mcp.CallToolResult, l *policy.Lookup) ([]string, error) {
	found := []string{}
	receipt := func(v any) (string, error) {
		if m, ok := v.(map[string]any); ok && l.IDField != "" {
			if id, ok := m[l.IDField]; ok {
				return fmt.Sprint(id), nil
			}
		}
		if s, ok := v.(string); ok && l.IDField == "" {
			return s, nil
		}
		b, err := json.Marshal(v)
		if err != nil {
			return "", err
		}
		h, err := canonicalHash(b)
		return "sha256:" + h, err
	}
	if res.StructuredContent != nil {
		b, err := json.Marshal(res.StructuredContent)
		if err != nil {
			return nil, err
		}
		var v any
		if err := json.Unmarshal(b, &v); err != nil {
			return nil, err
		}
		for _, tok := range strings.Split(strings.TrimPrefix(l.Items, "/"), "/") {
			if tok == "" {
				continue
			}
			tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
			m, ok := v.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("lookup: %s does not point into the result", l.Items)
			}
			v = m[tok]
		}
		items, ok := v.([]any)
		if !ok {
			return nil, fmt.Errorf("lookup: the records at %q are not an array", l.Items)
		}
		for _, it := range items {
			r, err := receipt(it)
			if err != nil {
				return nil, err
			}
			found = append(found, r)
		}
		return found, nil
	}
	for _, c := range res.Content {
		tc, ok := c.(*mcp.TextContent)
		if !ok {
			continue
		}
		if l.None != "" && strings.TrimSpace(tc.Text) == l.None {
			continue
		}
		for line := range strings.SplitSeq(tc.Text, "\n") {
			if line = strings.TrimSpace(line); line != "" {
				found = append(found, line)
			}
		}
	}
	return found, nil
}
