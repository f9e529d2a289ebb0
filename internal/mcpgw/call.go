package mcpgw

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/gowebpki/jcs"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/validation"
)

// refusal is a tool error for the agent: the call did not reach the upstream.
type refusal struct {
	code, msg string
}

func (r *refusal) Error() string { return r.code + ": " + r.msg }

func refuse(code, format string, args ...any) *refusal {
	return &refusal{code: code, msg: fmt.Sprintf(format, args...)}
}

func toolError(r *refusal) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{
		Text: "airlock refused this call (" + r.code + "): " + r.msg}}}
}

// The _meta keys the gateway reads in a tool call and writes in its result.
const (
	// CallKeyMeta, in a tool call's _meta, is the agent's key for one performance of an
	// effect: the same tool and arguments with another key are another effect, performed
	// again; with the same key (or none) they are the same effect, answered from the
	// ledger. A string of 1–200 letters, digits and . _ : @ + = ~ -.
	CallKeyMeta = "airlock/call_key"
	// SourceURLMeta, in a tool call's _meta, links the record the call is about (a
	// ticket, a request): a gated call's approval card shows it as a link. An http or
	// https URL only; anything else refuses the call (invalid_source_url).
	SourceURLMeta = "airlock/source_url"
	// ReplayedMeta, in a result's _meta, marks an answer from the ledger: the upstream
	// was not called. Its value: {"effect_id", "receipt" (when one was recorded),
	// "result_recorded" (false when no result is kept)}.
	ReplayedMeta = "airlock/replayed"
)

func (g *Gateway) runID(t *policy.Tool, args json.RawMessage) (string, error) {
	if t != nil && t.RunIDArgument != "" {
		v, err := stringArg(args, t.RunIDArgument)
		if err != nil {
			return "", err
		}
		return v, nil
	}
	return g.opts.RunID, nil
}

var keyPattern = regexp.MustCompile(`^[A-Za-z0-9._:@+=~-]{1,200}$`)

func stringArg(args json.RawMessage, name string) (string, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(args, &m); err != nil {
		return "", refuse("invalid_arguments", "the arguments are not a JSON object")
	}
	var s string
	if raw, ok := m[name]; !ok || json.Unmarshal(raw, &s) != nil || !keyPattern.MatchString(s) {
		return "", refuse("invalid_arguments", "the argument %s must be a string of 1–200 letters, digits and . _ : @ + = ~ -", name)
	}
	return s, nil
}

// Identity derives an effect call's input hash — SHA-256 of the canonical JSON (RFC 8785)
// of {"tool", "arguments"} — and its effect id: the policy's effect-id argument, or
// mcp.<tool>.<first 32 hex digits of the hash>.
func Identity(tool string, t *policy.Tool, args json.RawMessage) (effectID, inputHash string, err error) {
	effectID, inputHash, _, err = identity(tool, t, args, "")
	return effectID, inputHash, err
}

// identity is Identity with the agent's call key (CallKeyMeta), which joins the input as
// "call_key", and the input itself: what the approval shows and the hash is of.
func identity(tool string, t *policy.Tool, args json.RawMessage, callKey string) (effectID, inputHash string, input json.RawMessage, err error) {
	var v any
	if err := json.Unmarshal(args, &v); err != nil {
		return "", "", nil, refuse("invalid_arguments", "the arguments are not JSON")
	}
	in := map[string]any{"tool": tool, "arguments": v}
	if callKey != "" {
		if t.EffectIDArgument != "" {
			return "", "", nil, refuse("invalid_arguments", "the effect id of %s is its argument %s: to perform it again, give another %s (not %s)", tool, t.EffectIDArgument, t.EffectIDArgument, CallKeyMeta)
		}
		in["call_key"] = callKey
	}
	b, err := json.Marshal(in)
	if err != nil {
		return "", "", nil, err
	}
	inputHash, err = canonicalHash(b)
	if err != nil {
		return "", "", nil, err
	}
	if t.EffectIDArgument != "" {
		effectID, err = stringArg(args, t.EffectIDArgument)
		return effectID, inputHash, b, err
	}
	safe := regexp.MustCompile(`[^A-Za-z0-9._:@+=~-]`).ReplaceAllString(tool, "_")
	return "mcp." + safe + "." + inputHash[:32], inputHash, b, nil
}

// callMeta is what a call's _meta tells the plan: the source record's link
// (SourceURLMeta), which airlock checks and the approval card shows. nil without one.
func callMeta(req *mcp.CallToolRequest) *client.Meta {
	if s, ok := req.Params.Meta[SourceURLMeta].(string); ok && s != "" {
		return &client.Meta{SourceURL: s}
	}
	return nil
}

// callKey reads CallKeyMeta from the call's _meta ("" when absent).
func callKey(req *mcp.CallToolRequest) (string, error) {
	v, ok := req.Params.Meta[CallKeyMeta]
	if !ok {
		return "", nil
	}
	s, isString := v.(string)
	if !isString || !keyPattern.MatchString(s) {
		return "", refuse("invalid_arguments", "_meta[%q] must be a string of 1–200 letters, digits and . _ : @ + = ~ -", CallKeyMeta)
	}
	return s, nil
}

func canonicalHash(b []byte) (string, error) {
	c, err := jcs.Transform(b)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(c)
	return hex.EncodeToString(sum[:]), nil
}

// toolCall is one call of an effect tool, built once by effectSteps and passed down:
// what the agent asked (req, name, args), where it goes (route), and what airlock knows
// it by (run, effect id, input hash and the input the approval shows). rec is the
// tool_call event being filled in.
type toolCall struct {
	req       *mcp.CallToolRequest
	name      string
	route     route
	args      json.RawMessage
	runID     string
	effectID  string
	inputHash string
	input     json.RawMessage
	rec       *client.ToolCall
}

// effect runs one call of an effect tool through the ledger.
func (g *Gateway) effect(ctx context.Context, req *mcp.CallToolRequest, name string, r route, args json.RawMessage, call *client.ToolCall) (*mcp.CallToolResult, error) {
	res, err := g.effectSteps(ctx, &toolCall{req: req, name: name, route: r, args: args, rec: call})
	var rf *refusal
	if errors.As(err, &rf) {
		if call.Decision == "" {
			call.Decision = rf.code
		}
		return toolError(rf), nil
	}
	return res, err
}

// identify checks an effect call (its run, the action type's schema, its call key) and
// derives its identity.
func (g *Gateway) identify(tc *toolCall) error {
	t := tc.route.tool
	runID, err := g.runID(t, tc.args)
	if err != nil {
		return err
	}
	if runID == "" {
		return refuse("no_run", "no run: start airlock mcp with --run-id, or name run_id_argument in the policy")
	}
	if a := g.opts.Policy.Action(t.Effect); a != nil && a.Schema != nil && a.Schema.Compiled != nil {
		v, err := validation.Decode(tc.args)
		if err != nil {
			return refuse("invalid_arguments", "the arguments are not JSON")
		}
		if errs := a.Schema.Compiled.Validate(v); errs != nil {
			parts := make([]string, 0, len(errs))
			for _, e := range errs {
				parts = append(parts, e.Pointer+": "+e.Message)
			}
			return refuse("invalid_arguments", "the arguments fail the schema of %s: %s", t.Effect, strings.Join(parts, "; "))
		}
	}
	key, err := callKey(tc.req)
	if err != nil {
		return err
	}
	effectID, inputHash, input, err := identity(tc.name, t, tc.args, key)
	if err != nil {
		return err
	}
	if len(input) > MaxStoredResult {
		input = nil // airlock keeps no larger input: an approval of it shows the hash alone
	}
	tc.runID, tc.effectID, tc.inputHash, tc.input = runID, effectID, inputHash, input
	tc.rec.EffectID, tc.rec.InputHash = effectID, inputHash
	return nil
}

func (g *Gateway) effectSteps(ctx context.Context, tc *toolCall) (*mcp.CallToolResult, error) {
	if err := g.identify(tc); err != nil {
		return nil, err
	}
	rs := g.run(tc.runID)
	// One effect call of a run at a time. An agent that gives up waiting gives up the
	// call, which has not started.
	select {
	case rs.effect <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-rs.effect }()
	for attempt := 0; ; attempt++ {
		owner, err := g.claim(ctx, tc.runID, true)
		if rf := (*refusal)(nil); errors.As(err, &rf) && rf.code == "approval_pending" {
			if p, ok := g.pendingLink(tc.runID, tc.inputHash); ok {
				tc.rec.Decision = "approval_pending"
				return nil, refuse("approval_pending", "%s still waits for a person's approval; nothing was done. Approvers decide at %s (until %s). Call the tool again with the same arguments after the approval.",
					tc.route.tool.Effect, p.url, p.expires.Format(time.RFC3339))
			}
		}
		if err != nil {
			return nil, err
		}
		// From the plan on, the call is carried to its end even if the agent cancels or
		// times out: a plan left unconfirmed would make the next call reconcile first,
		// and a write cut off upstream would leave its outcome unknown. The agent's retry
		// waits for it and is answered from the ledger.
		g.inflight.Add(1)
		res, again, err := g.attempt(context.WithoutCancel(ctx), tc, owner)
		g.inflight.Done()
		switch {
		case again && attempt < 2:
			continue
		case again && err == nil:
			return nil, refuse("reconcile_first", "effect %s could not be settled", tc.effectID)
		}
		return res, err
	}
}

// attempt plans the call once under owner's lease and acts on the answer; again asks for
// another plan.
func (g *Gateway) attempt(ctx context.Context, tc *toolCall, owner string) (res *mcp.CallToolResult, again bool, err error) {
	t, runID := tc.route.tool, tc.runID
	plan, err := g.opts.Client.Plan(ctx, runID, tc.effectID, client.PlanRequest{LeaseOwner: owner, Action: t.Effect,
		Target: tc.route.upstream, InputHash: tc.inputHash, Input: tc.input, Meta: callMeta(tc.req)})
	var ae *client.APIError
	switch {
	case client.IsCode(err, "lease_lost") || client.IsCode(err, "version_conflict"):
		g.drop(runID)
		return nil, true, refuse("lease_lost", "another process holds run %s", runID)
	case client.IsCode(err, "reconcile_first"):
		settled, res, err := g.reconcile(ctx, tc, owner)
		if err != nil || !settled {
			return res, false, err
		}
		return nil, true, nil // cleared: plan again
	case errors.As(err, &ae):
		if ae.Code == "input_mismatch" || ae.Code == "budget_exhausted" {
			g.drop(runID) // the run is parked or finished
		}
		return nil, false, refuse(ae.Code, "%s", ae.Message)
	case err != nil:
		tc.rec.Decision = "airlock_unavailable"
		return nil, false, refuse("airlock_unavailable", "airlock could not be asked, so the call was not sent: %v", err)
	case plan.Approval != nil:
		g.drop(runID) // the run waits for a person now
		g.keepLink(runID, tc.inputHash, pendingApproval{url: plan.Approval.ApproveURL, expires: plan.Approval.ExpiresAt})
		tc.rec.Decision = "approval_pending"
		return nil, false, refuse("approval_pending", "%s needs a person's approval before it is performed; nothing was done. Approvers decide at %s (until %s). Call the tool again with the same arguments after the approval.",
			t.Effect, plan.Approval.ApproveURL, plan.Approval.ExpiresAt.Format(time.RFC3339))
	case !plan.Execute:
		g.forgetLink(runID, tc.inputHash)
		tc.rec.Decision = "replayed"
		return replay(tc.effectID, plan.Receipt, plan.Result), false, nil
	}
	g.forgetLink(runID, tc.inputHash)
	res, err = g.execute(ctx, tc, owner)
	return res, false, err
}

// pendingKey names a pending approval by its run and the input it is bound to.
func pendingKey(runID, inputHash string) string { return runID + "\x00" + inputHash }

func (g *Gateway) keepLink(runID, inputHash string, p pendingApproval) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.pending[pendingKey(runID, inputHash)] = p
}

func (g *Gateway) forgetLink(runID, inputHash string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.pending, pendingKey(runID, inputHash))
}

func (g *Gateway) pendingLink(runID, inputHash string) (pendingApproval, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	p, ok := g.pending[pendingKey(runID, inputHash)]
	return p, ok && time.Now().Before(p.expires)
}

// execute forwards a planned call and confirms it with its result.
func (g *Gateway) execute(ctx context.Context, tc *toolCall, owner string) (*mcp.CallToolResult, error) {
	runID, effectID, upstream := tc.runID, tc.effectID, tc.route.upstream
	if err := g.hook("mcp_after_plan"); err != nil {
		return nil, err
	}
	params := &mcp.CallToolParams{Name: tc.name, Arguments: tc.args, Meta: traceMeta(ctx)}
	done := g.progress.forward(tc.req, params)
	res, err := g.ups[upstream].CallTool(ctx, params)
	done()
	if err != nil {
		// It may or may not have happened: the effect stays planned, and the next call of
		// it is settled before anything is sent again.
		tc.rec.Decision = "upstream_error"
		return nil, fmt.Errorf("upstream %s: %w (airlock keeps effect %s as planned: it may have happened)", upstream, err, effectID)
	}
	if err := g.hook("mcp_after_upstream"); err != nil {
		return nil, err
	}
	if res.IsError {
		// The upstream says the tool failed: nothing was done, and the same call may run again.
		if _, err := g.opts.Client.Reconcile(ctx, runID, effectID, owner, []string{}, false); err != nil {
			g.opts.Log.Warn("could not clear the effect the upstream refused", "run_id", runID, "effect_id", effectID, "err", err)
		}
		tc.rec.Decision = "upstream_refused"
		return res, nil
	}
	raw, err := json.Marshal(res)
	if err != nil {
		return nil, err
	}
	h, err := canonicalHash(raw)
	if err != nil {
		return nil, err
	}
	if err := g.confirm(ctx, tc, owner, "sha256:"+h, raw); err != nil {
		g.opts.Log.Error("the effect happened but its confirmation was not recorded: the next call of it is reconciled first", "run_id", runID, "effect_id", effectID, "err", err)
		tc.rec.Decision = "executed_unconfirmed"
		return res, nil
	}
	tc.rec.Decision = "executed"
	return res, nil
}
