// Package mcpgw is `airlock mcp`: an MCP server that fronts the upstream MCP servers a
// policy names and puts every tool call of an agent through airlock's work ledger.
//
// The gateway runs next to the agent and talks to an airlock server over its HTTP API
// with an API key (the runs scope): the server keeps the ledger, the gates, the kill
// switch and the budgets, and several agents (each with its gateway) share one server.
// Read tools pass through; an effect tool is planned in the run's ledger first (kill
// switch, budget and gate), forwarded upstream only when the plan says execute, and
// confirmed with a receipt (the hash of the upstream's result) and the result itself,
// so the same call later is answered from the ledger instead of reaching the upstream
// again (marked so in its _meta). A call whose earlier attempt stopped between plan and
// confirm is never sent: it is settled by the policy's lookup tool, or left to a person.
// Resources and prompts are reads: they pass through.
package mcpgw

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/gowebpki/jcs"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/validation"
)

// Options configure a gateway.
type Options struct {
	Policy *policy.Policy // with an mcp section
	Client *client.Client // an airlock server and an API key with the runs scope
	// RunID is the run (its key) every call belongs to, unless a tool's run_id_argument
	// names one.
	RunID string
	// Lease is the run's lease (default 30s), renewed every third of it. A gateway that
	// dies holds its runs until the lease lapses; its successor waits for that.
	Lease time.Duration
	// Wait is how long a call waits for another process's lease on its run (default 2m).
	Wait time.Duration
	Log  *slog.Logger
	// Connect opens the transport to an upstream; nil spawns its command or dials its URL.
	Connect func(ctx context.Context, u *policy.Upstream) (mcp.Transport, error)
	// Hook, when set, is called at "mcp_after_plan" and "mcp_after_upstream"; an error
	// ends the call there, as a crash would (tests).
	Hook func(point string) error
}

// Gateway is a running gateway; serve Server() over any MCP transport.
type Gateway struct {
	opts    Options
	server  *mcp.Server
	ups     map[string]*mcp.ClientSession
	routes  map[string]route
	mu      sync.Mutex
	runs    map[string]*runState
	stopped bool
	// inflight counts effect calls between plan and confirm: Close waits for them.
	inflight sync.WaitGroup
	progress progressRelay
	// pending holds the approval link of each effect waiting for a person (by run and
	// effect id), so a repeated call can show it again; airlock keeps only its hash.
	pending map[string]pendingApproval
}

type pendingApproval struct {
	url     string
	expires time.Time
}

type route struct {
	upstream string
	tool     *policy.Tool // nil: unclassified
}

// runState is what the gateway knows of one run: the lease it holds, if any.
type runState struct {
	claimMu sync.Mutex    // one claim at a time
	effect  chan struct{} // one effect call at a time: plan → upstream → confirm
	mu      sync.Mutex
	owner   string
	version int64
	stop    context.CancelFunc
}

// New connects to every upstream, lists their tools and builds the gateway's server.
func New(ctx context.Context, o Options) (*Gateway, error) {
	if o.Policy == nil || o.Policy.MCP == nil {
		return nil, errors.New("the policy has no mcp section")
	}
	if o.Lease <= 0 {
		o.Lease = 30 * time.Second
	}
	if o.Wait <= 0 {
		o.Wait = 2 * time.Minute
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Connect == nil {
		o.Connect = connect
	}
	if o.RunID == "" {
		for _, u := range o.Policy.MCP.Upstreams {
			for name, t := range u.Tools {
				if !t.Read && t.RunIDArgument == "" {
					return nil, fmt.Errorf("tool %s of upstream %s names no run_id_argument: give --run-id", name, u.Name)
				}
			}
		}
	}
	g := &Gateway{opts: o, ups: map[string]*mcp.ClientSession{}, routes: map[string]route{}, runs: map[string]*runState{},
		pending: map[string]pendingApproval{}, progress: progressRelay{calls: map[string]progressTarget{}}}
	g.server = mcp.NewServer(&mcp.Implementation{Name: "airlock-mcp", Version: "1"}, nil)
	resources, prompts := map[string]string{}, map[string]string{}
	for _, name := range sortedUpstreams(o.Policy.MCP.Upstreams) {
		u := o.Policy.MCP.Upstreams[name]
		t, err := o.Connect(ctx, u)
		if err != nil {
			g.Close()
			return nil, fmt.Errorf("upstream %s: %w", name, err)
		}
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "airlock-mcp", Version: "1"},
			&mcp.ClientOptions{ProgressNotificationHandler: g.progress.relay}).Connect(ctx, t, nil)
		if err != nil {
			g.Close()
			return nil, fmt.Errorf("upstream %s: connect: %w", name, err)
		}
		g.ups[name] = cs
		for tool, err := range cs.Tools(ctx, nil) {
			if err != nil {
				g.Close()
				return nil, fmt.Errorf("upstream %s: list tools: %w", name, err)
			}
			if prev, ok := g.routes[tool.Name]; ok {
				g.Close()
				return nil, fmt.Errorf("tool %s is offered by upstreams %s and %s: the gateway lists one tool per name", tool.Name, prev.upstream, name)
			}
			r := route{upstream: name, tool: u.Tools[tool.Name]}
			g.routes[tool.Name] = r
			listed := *tool
			if r.tool == nil {
				listed.Description = "(airlock: this tool is not classified in the policy; every call is refused) " + listed.Description
			}
			g.server.AddTool(&listed, g.handler(tool.Name, r))
		}
		for tn := range u.Tools {
			if _, ok := g.routes[tn]; !ok {
				o.Log.Warn("a tool the policy classifies is not offered by its upstream", "upstream", name, "tool", tn)
			}
		}
		if err := g.addReads(ctx, name, cs, resources, prompts); err != nil {
			g.Close()
			return nil, fmt.Errorf("upstream %s: %w", name, err)
		}
	}
	return g, nil
}

// Server is the MCP server the agent talks to.
func (g *Gateway) Server() *mcp.Server { return g.server }

// Drain is how long Close waits for effect calls already forwarded to finish and be
// confirmed.
const Drain = 30 * time.Second

// Close is a clean exit: it waits (up to Drain) for the effect calls already forwarded
// to be confirmed, releases every lease the gateway holds, so the next gateway on the
// same run takes it at once, and closes the upstream sessions.
func (g *Gateway) Close() error {
	done := make(chan struct{})
	go func() { g.inflight.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(Drain):
		g.opts.Log.Warn("effect calls were still running when the gateway stopped: they are reconciled on their next call")
	}
	return g.stop(true)
}

// Abandon stops the gateway as a crash would: the leases are kept until they lapse
// (--lease), and calls in flight are cut off.
func (g *Gateway) Abandon() error { return g.stop(false) }

func (g *Gateway) stop(release bool) error {
	g.mu.Lock()
	g.stopped = true
	var held []heldLease
	for runID, r := range g.runs {
		r.mu.Lock()
		if r.stop != nil {
			r.stop()
			r.stop = nil
		}
		if r.owner != "" {
			held = append(held, heldLease{runID, r.owner, r.version})
			r.owner = ""
		}
		r.mu.Unlock()
	}
	g.mu.Unlock()
	if release {
		for _, h := range held {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := g.opts.Client.Release(ctx, h.runID, h.owner, h.version); err != nil {
				g.opts.Log.Warn("could not release the run's lease: the next gateway waits for it to lapse", "run_id", h.runID, "err", err)
			}
			cancel()
		}
	}
	var errs []error
	for _, cs := range g.ups {
		errs = append(errs, cs.Close())
	}
	return errors.Join(errs...)
}

type heldLease struct {
	runID, owner string
	version      int64
}

// connect spawns the upstream's command (environment: the gateway's, without AIRLOCK_*
// variables such as the API key, plus the policy's env) or dials its URL.
func connect(_ context.Context, u *policy.Upstream) (mcp.Transport, error) {
	if u.URL != "" {
		return &mcp.StreamableClientTransport{Endpoint: u.URL}, nil
	}
	cmd := exec.Command(u.Command, u.Args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AIRLOCK_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	for k, v := range u.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stderr = os.Stderr
	return &mcp.CommandTransport{Command: cmd}, nil
}

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

func (g *Gateway) handler(name string, r route) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		args := json.RawMessage(req.Params.Arguments)
		if len(args) == 0 || string(args) == "null" {
			args = json.RawMessage("{}")
		}
		call := client.ToolCall{Tool: name, Upstream: r.upstream}
		var res *mcp.CallToolResult
		var err error
		switch {
		case r.tool == nil:
			call.Class, call.Decision = "unclassified", "refused_unclassified"
			res = toolError(refuse("unclassified_tool", "the tool %s is not classified in airlock's policy (mcp.upstreams.%s.tools): add it as read or as an effect", name, r.upstream))
		case r.tool.Read:
			call.Class = "read"
			params := &mcp.CallToolParams{Name: name, Arguments: args}
			done := g.progress.forward(req, params)
			res, err = g.ups[r.upstream].CallTool(ctx, params)
			done()
			call.Decision = "passed"
			if err != nil {
				call.Decision = "upstream_error"
			}
		default:
			call.Class, call.Action = "effect", r.tool.Effect
			res, err = g.effect(ctx, req, name, r, args, &call)
		}
		if runID, _ := g.runID(r.tool, args); runID != "" && call.Decision != "" {
			// Recorded even when the agent gave up on the call: it was handled.
			g.record(context.WithoutCancel(ctx), runID, call)
		}
		return res, err
	}
}

// progressRelay passes an upstream's progress notifications on to the agent that made
// the call: each forwarded call that asked for progress gets a token of the gateway's
// own (upstream sessions are shared), mapped back to the agent's token and session.
type progressRelay struct {
	mu    sync.Mutex
	next  int64
	calls map[string]progressTarget
}

type progressTarget struct {
	session *mcp.ServerSession
	token   any
}

// forward gives params a token of the gateway's when the agent's request asked for
// progress; done forgets it.
func (p *progressRelay) forward(req *mcp.CallToolRequest, params *mcp.CallToolParams) (done func()) {
	token := req.Params.GetProgressToken()
	if token == nil || req.Session == nil {
		return func() {}
	}
	p.mu.Lock()
	p.next++
	ours := fmt.Sprintf("airlock-%d", p.next)
	p.calls[ours] = progressTarget{session: req.Session, token: token}
	p.mu.Unlock()
	params.SetProgressToken(ours)
	return func() {
		p.mu.Lock()
		delete(p.calls, ours)
		p.mu.Unlock()
	}
}

func (p *progressRelay) relay(ctx context.Context, req *mcp.ProgressNotificationClientRequest) {
	ours, _ := req.Params.ProgressToken.(string)
	p.mu.Lock()
	t, ok := p.calls[ours]
	p.mu.Unlock()
	if !ok {
		return
	}
	// The agent may have gone (it cancelled): its progress is then nobody's.
	_ = t.session.NotifyProgress(context.WithoutCancel(ctx), &mcp.ProgressNotificationParams{ProgressToken: t.token,
		Progress: req.Params.Progress, Total: req.Params.Total, Message: req.Params.Message})
}

// record writes the call as an event on the run; a run that does not exist yet is
// claimed first (creating it). A failure is logged, never hidden from the log, and
// does not change the agent's answer.
func (g *Gateway) record(ctx context.Context, runID string, call client.ToolCall) {
	err := g.opts.Client.RecordToolCall(ctx, runID, call)
	if client.IsCode(err, "run_not_found") {
		if _, cerr := g.claim(ctx, runID, false); cerr == nil {
			err = g.opts.Client.RecordToolCall(ctx, runID, call)
		}
	}
	if err != nil {
		g.opts.Log.Warn("could not record the tool call on the run", "run_id", runID, "tool", call.Tool, "decision", call.Decision, "err", err)
	}
}

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

// effect runs one call of an effect tool through the ledger.
func (g *Gateway) effect(ctx context.Context, req *mcp.CallToolRequest, name string, r route, args json.RawMessage, call *client.ToolCall) (*mcp.CallToolResult, error) {
	res, err := g.effectSteps(ctx, req, name, r, args, call)
	var rf *refusal
	if errors.As(err, &rf) {
		if call.Decision == "" {
			call.Decision = rf.code
		}
		return toolError(rf), nil
	}
	return res, err
}

func (g *Gateway) effectSteps(ctx context.Context, req *mcp.CallToolRequest, name string, r route, args json.RawMessage, call *client.ToolCall) (*mcp.CallToolResult, error) {
	t := r.tool
	runID, err := g.runID(t, args)
	if err != nil {
		return nil, err
	}
	if runID == "" {
		return nil, refuse("no_run", "no run: start airlock mcp with --run-id, or name run_id_argument in the policy")
	}
	if a := g.opts.Policy.Action(t.Effect); a != nil && a.Schema != nil && a.Schema.Compiled != nil {
		v, err := validation.Decode(args)
		if err != nil {
			return nil, refuse("invalid_arguments", "the arguments are not JSON")
		}
		if errs := a.Schema.Compiled.Validate(v); errs != nil {
			parts := make([]string, 0, len(errs))
			for _, e := range errs {
				parts = append(parts, e.Pointer+": "+e.Message)
			}
			return nil, refuse("invalid_arguments", "the arguments fail the schema of %s: %s", t.Effect, strings.Join(parts, "; "))
		}
	}
	key, err := callKey(req)
	if err != nil {
		return nil, err
	}
	effectID, inputHash, input, err := identity(name, t, args, key)
	if err != nil {
		return nil, err
	}
	if len(input) > MaxStoredResult {
		input = nil // airlock keeps no larger input: an approval of it shows the hash alone
	}
	call.EffectID, call.InputHash = effectID, inputHash
	rs := g.run(runID)
	// One effect call of a run at a time. An agent that gives up waiting gives up the
	// call, which has not started.
	select {
	case rs.effect <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-rs.effect }()
	for attempt := 0; ; attempt++ {
		owner, err := g.claim(ctx, runID, true)
		if rf := (*refusal)(nil); errors.As(err, &rf) && rf.code == "approval_pending" {
			if p, ok := g.pendingLink(runID, inputHash); ok {
				call.Decision = "approval_pending"
				return nil, refuse("approval_pending", "%s still waits for a person's approval; nothing was done. Approvers decide at %s (until %s). Call the tool again with the same arguments after the approval.",
					t.Effect, p.url, p.expires.Format(time.RFC3339))
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
		res, again, err := g.attempt(context.WithoutCancel(ctx), req, runID, owner, effectID, inputHash, input, name, r, args, call)
		g.inflight.Done()
		switch {
		case again && attempt < 2:
			continue
		case again && err == nil:
			return nil, refuse("reconcile_first", "effect %s could not be settled", effectID)
		}
		return res, err
	}
}

// attempt plans the call once and acts on the answer; again asks for another plan.
func (g *Gateway) attempt(ctx context.Context, req *mcp.CallToolRequest, runID, owner, effectID, inputHash string, input json.RawMessage, name string, r route, args json.RawMessage, call *client.ToolCall) (res *mcp.CallToolResult, again bool, err error) {
	t := r.tool
	plan, err := g.opts.Client.Plan(ctx, runID, effectID, client.PlanRequest{LeaseOwner: owner, Action: t.Effect,
		Target: r.upstream, InputHash: inputHash, Input: input, Meta: callMeta(req)})
	var ae *client.APIError
	switch {
	case client.IsCode(err, "lease_lost") || client.IsCode(err, "version_conflict"):
		g.drop(runID)
		return nil, true, refuse("lease_lost", "another process holds run %s", runID)
	case client.IsCode(err, "reconcile_first"):
		settled, res, err := g.reconcile(ctx, runID, owner, effectID, r, args, call)
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
		call.Decision = "airlock_unavailable"
		return nil, false, refuse("airlock_unavailable", "airlock could not be asked, so the call was not sent: %v", err)
	case plan.Approval != nil:
		g.drop(runID) // the run waits for a person now
		g.keepLink(runID, inputHash, pendingApproval{url: plan.Approval.ApproveURL, expires: plan.Approval.ExpiresAt})
		call.Decision = "approval_pending"
		return nil, false, refuse("approval_pending", "%s needs a person's approval before it is performed; nothing was done. Approvers decide at %s (until %s). Call the tool again with the same arguments after the approval.",
			t.Effect, plan.Approval.ApproveURL, plan.Approval.ExpiresAt.Format(time.RFC3339))
	case !plan.Execute:
		g.forgetLink(runID, inputHash)
		call.Decision = "replayed"
		return replay(effectID, plan.Receipt, plan.Result), false, nil
	}
	g.forgetLink(runID, inputHash)
	res, err = g.execute(ctx, req, runID, owner, effectID, name, r, args, call)
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
func (g *Gateway) execute(ctx context.Context, req *mcp.CallToolRequest, runID, owner, effectID, name string, r route, args json.RawMessage, call *client.ToolCall) (*mcp.CallToolResult, error) {
	if err := g.hook("mcp_after_plan"); err != nil {
		return nil, err
	}
	params := &mcp.CallToolParams{Name: name, Arguments: args}
	done := g.progress.forward(req, params)
	res, err := g.ups[r.upstream].CallTool(ctx, params)
	done()
	if err != nil {
		// It may or may not have happened: the effect stays planned, and the next call of
		// it is settled before anything is sent again.
		call.Decision = "upstream_error"
		return nil, fmt.Errorf("upstream %s: %w (airlock keeps effect %s as planned: it may have happened)", r.upstream, err, effectID)
	}
	if err := g.hook("mcp_after_upstream"); err != nil {
		return nil, err
	}
	if res.IsError {
		// The upstream says the tool failed: nothing was done, and the same call may run again.
		if _, err := g.opts.Client.Reconcile(ctx, runID, effectID, owner, []string{}, false); err != nil {
			g.opts.Log.Warn("could not clear the effect the upstream refused", "run_id", runID, "effect_id", effectID, "err", err)
		}
		call.Decision = "upstream_refused"
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
	if err := g.confirm(ctx, runID, effectID, owner, "sha256:"+h, raw); err != nil {
		g.opts.Log.Error("the effect happened but its confirmation was not recorded: the next call of it is reconciled first", "run_id", runID, "effect_id", effectID, "err", err)
		call.Decision = "executed_unconfirmed"
		return res, nil
	}
	call.Decision = "executed"
	return res, nil
}

// MaxStoredResult is the largest tool result the gateway asks airlock to keep (the API's
// limit for a confirmed result); a larger one is kept as a marker with its size.
const MaxStoredResult = 256 << 10

// StoredResultMeta is the _meta key of a stored result that is not the upstream's result
// byte for byte: what was changed, and the receipt of the real one.
const StoredResultMeta = "airlock/stored_result"

// confirm records the receipt and what can be kept of the result. The tool ran, so the
// confirmation must not fail on the result's content: it is sent in the form airlock
// keeps (StoredResult), and if airlock still refuses that body (a body limit smaller
// than the result, a value its store cannot hold), again with a marker in its place,
// then with the receipt alone. A confirmation repeated after one that committed answers
// as the first did, so each try is safe.
func (g *Gateway) confirm(ctx context.Context, runID, effectID, owner, receipt string, raw []byte) error {
	forms := []json.RawMessage{StoredResult(raw, receipt), omitted(len(raw), receipt, "refused"), nil}
	var err error
	for i, f := range forms {
		if i > 0 && f != nil && len(f) >= len(forms[0]) {
			continue // no smaller than what was refused
		}
		err = g.opts.Client.ConfirmResult(ctx, runID, effectID, owner, receipt, f)
		if err == nil || !refusedBody(err) {
			return err
		}
		g.opts.Log.Warn("airlock refused the tool's result with its confirmation: confirming with less", "run_id", runID,
			"effect_id", effectID, "result_bytes", len(raw), "err", err)
	}
	return err
}

// refusedBody reports airlock refusing a request for its body (size, content), or failing
// on it: a smaller body may pass. A lost lease, a kill switch or an outage would refuse
// any body alike.
func refusedBody(err error) bool {
	var ae *client.APIError
	return errors.As(err, &ae) && (ae.Status == http.StatusRequestEntityTooLarge || ae.Status == http.StatusBadRequest ||
		ae.Status == http.StatusInternalServerError)
}

// StoredResult is the form of a tool's result (its JSON) that airlock keeps for replays:
// the result itself when every store can hold it; with each NUL character in its strings
// (and keys) written as the text \u0000 when one is there (PostgreSQL cannot store a NUL
// in text or jsonb); a marker with the result's size when it is larger than
// MaxStoredResult. A changed form says so in _meta[StoredResultMeta], with the receipt
// of the real result; the agent that made the call always gets the real one.
func StoredResult(raw []byte, receipt string) json.RawMessage {
	if validation.Depth(raw) >= validation.MaxDepth {
		// Deeper than airlock's bodies may nest (the confirm's body is the first level).
		return omitted(len(raw), receipt, "too_deep")
	}
	out := raw
	if bytes.Contains(raw, []byte(`\u0000`)) {
		var v any
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if dec.Decode(&v) != nil {
			return omitted(len(raw), receipt, "unreadable")
		}
		if n := escapeNUL(&v); n > 0 {
			if m, ok := v.(map[string]any); ok {
				meta, _ := m["_meta"].(map[string]any)
				if meta == nil {
					meta = map[string]any{}
				}
				meta[StoredResultMeta] = map[string]any{"nul_escaped": n, "receipt": receipt}
				m["_meta"] = meta
			}
			b, err := json.Marshal(v)
			if err != nil {
				return omitted(len(raw), receipt, "unreadable")
			}
			out = b
		}
	}
	if len(out) > MaxStoredResult {
		return omitted(len(raw), receipt, "too_large")
	}
	return out
}

// escapeNUL rewrites every NUL character in the strings and keys of v as the text \u0000
// and counts them.
func escapeNUL(v *any) int {
	n := 0
	switch x := (*v).(type) {
	case string:
		if c := strings.Count(x, "\x00"); c > 0 {
			*v, n = strings.ReplaceAll(x, "\x00", `\u0000`), c
		}
	case []any:
		for i := range x {
			n += escapeNUL(&x[i])
		}
	case map[string]any:
		renamed := map[string]any{}
		for k, e := range x {
			n += escapeNUL(&e)
			x[k] = e
			if c := strings.Count(k, "\x00"); c > 0 {
				delete(x, k)
				renamed[strings.ReplaceAll(k, "\x00", `\u0000`)], n = e, n+c
			}
		}
		maps.Copy(x, renamed)
	}
	return n
}

// omitted is the marker kept in place of a result that cannot be kept (why: too_large,
// refused, unreadable): a text for the agent that repeats the call, and its size and
// receipt.
func omitted(size int, receipt, why string) json.RawMessage {
	text := fmt.Sprintf("airlock: this call was performed earlier (receipt %s) and was not sent again; its result (%d bytes) could not be kept (%s), so it is not shown again.", receipt, size, why)
	b, _ := json.Marshal(map[string]any{
		"content": []any{map[string]any{"type": "text", "text": text}},
		"_meta":   map[string]any{StoredResultMeta: map[string]any{"omitted": why, "bytes": size, "receipt": receipt}},
	})
	return b
}

// replay answers a confirmed effect from the ledger, marked in _meta[ReplayedMeta].
// Without a kept result it says what is known: performed, with its receipt, or — when a
// person resolved it as sent without the provider's id — with none.
func replay(effectID, receipt string, result json.RawMessage) *mcp.CallToolResult {
	mark := map[string]any{"effect_id": effectID, "result_recorded": false}
	if receipt != "" {
		mark["receipt"] = receipt
	}
	var res *mcp.CallToolResult
	if result != nil {
		var r mcp.CallToolResult
		if err := json.Unmarshal(result, &r); err == nil {
			res, mark["result_recorded"] = &r, true
		}
	}
	if res == nil {
		text := "airlock: this call was performed earlier (receipt " + receipt + "); it was not sent again, and its result is no longer retained."
		if receipt == "" {
			text = "airlock: this call was performed earlier (a person recorded it as done, without an id from the tool); it was not sent again, and no result was recorded."
		}
		res = &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}
	}
	if res.Meta == nil {
		res.Meta = mcp.Meta{}
	}
	res.Meta[ReplayedMeta] = mark
	return res
}

// reconcile settles an effect whose earlier attempt stopped between plan and confirm:
// by the lookup tool when the policy gives one, else it becomes unknown for a person.
// settled means cleared: plan again.
func (g *Gateway) reconcile(ctx context.Context, runID, owner, effectID string, r route, args json.RawMessage, call *client.ToolCall) (bool, *mcp.CallToolResult, error) {
	person := fmt.Sprintf("effect %s of run %s was planned but never confirmed (or its outcome is unknown): it may or may not have happened, so it is not sent again. A person checks and resolves it (airlock effects list --state unknown; airlock effects resolve ID --outcome sent|not_sent).", effectID, runID)
	var found []string
	undetermined := true
	if l := r.tool.Lookup; l != nil {
		var err error
		found, err = g.lookup(ctx, runID, effectID, r.upstream, l, args)
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
func (g *Gateway) lookup(ctx context.Context, runID, effectID, upstream string, l *policy.Lookup, args json.RawMessage) ([]string, error) {
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

func (g *Gateway) hook(point string) error {
	if g.opts.Hook == nil {
		return nil
	}
	return g.opts.Hook(point)
}

func (g *Gateway) run(runID string) *runState {
	g.mu.Lock()
	defer g.mu.Unlock()
	rs, ok := g.runs[runID]
	if !ok {
		rs = &runState{effect: make(chan struct{}, 1)}
		g.runs[runID] = rs
	}
	return rs
}

// drop forgets the lease on runID (parked, taken over or lost).
func (g *Gateway) drop(runID string) {
	rs := g.run(runID)
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.stop != nil {
		rs.stop()
		rs.stop = nil
	}
	rs.owner = ""
}

// claim returns the lease owner of runID, claiming the run (creating it) if the gateway
// holds no lease. With wait, a run held by another process's live lease is claimed again
// until that lease lapses or Wait runs out; without, a run not claimed gives "".
func (g *Gateway) claim(ctx context.Context, runID string, wait bool) (string, error) {
	rs := g.run(runID)
	rs.claimMu.Lock()
	defer rs.claimMu.Unlock()
	rs.mu.Lock()
	owner := rs.owner
	rs.mu.Unlock()
	if owner != "" {
		return owner, nil
	}
	deadline := time.Now().Add(g.opts.Wait)
	for {
		c, err := g.opts.Client.Claim(ctx, client.ClaimRequest{Key: runID, Payload: map[string]string{"gateway": "mcp", "run_id": runID},
			LeaseSeconds: int(g.opts.Lease.Round(time.Second) / time.Second)})
		if err != nil {
			var ae *client.APIError
			if errors.As(err, &ae) {
				return "", refuse(ae.Code, "claim run %s: %s", runID, ae.Message)
			}
			return "", refuse("airlock_unavailable", "airlock could not be asked, so the call was not sent: %v", err)
		}
		if c.Claimed {
			g.hold(rs, runID, c)
			return c.LeaseOwner, nil
		}
		if !wait {
			return "", nil
		}
		switch c.State {
		case client.StateAwaitingHuman:
			return "", refuse("approval_pending", "run %s waits for a person (an approval, or a decision on an effect): nothing was done; call again after the decision. An approval's link was in the answer to the call that asked for it; an operator can re-issue it from the console", runID)
		case client.StateProcessing:
		default:
			return "", refuse("run_finished", "run %s is %s: no more effects are performed in it", runID, c.State)
		}
		if time.Now().After(deadline) {
			return "", refuse("lease_held", "run %s is held by another process's lease (perhaps this agent's before it restarted); it lapses within the lease time: call again", runID)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// hold keeps the claimed lease alive until it is lost or the gateway stops.
func (g *Gateway) hold(rs *runState, runID string, c client.Claim) {
	g.mu.Lock()
	stopped := g.stopped
	g.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	rs.mu.Lock()
	rs.owner, rs.version, rs.stop = c.LeaseOwner, c.Version, cancel
	rs.mu.Unlock()
	if stopped {
		cancel()
		return
	}
	go func() {
		t := time.NewTicker(g.opts.Lease / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			_, err := g.opts.Client.Heartbeat(ctx, runID, client.HeartbeatRequest{LeaseOwner: c.LeaseOwner, Version: c.Version,
				LeaseSeconds: int(g.opts.Lease.Round(time.Second) / time.Second)})
			var ae *client.APIError
			if errors.As(err, &ae) && ctx.Err() == nil {
				g.opts.Log.Info("the run's lease ended", "run_id", runID, "code", ae.Code)
				rs.mu.Lock()
				if rs.owner == c.LeaseOwner {
					rs.owner, rs.stop = "", nil
				}
				rs.mu.Unlock()
				cancel()
				return
			}
		}
	}()
}

// addReads lists an upstream's resources, resource templates and prompts as the
// gateway's own: reads, passed through (a resource link a tool returns can be read back).
// The first upstream to offer a URI, template or prompt name has it.
func (g *Gateway) addReads(ctx context.Context, name string, cs *mcp.ClientSession, resources, prompts map[string]string) error {
	caps := cs.InitializeResult().Capabilities
	if caps == nil {
		return nil
	}
	read := func(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: req.Params.URI})
		g.recordRead(ctx, "resources/read", name, err)
		return res, err
	}
	if caps.Resources != nil {
		for res, err := range cs.Resources(ctx, nil) {
			if err != nil {
				return fmt.Errorf("list resources: %w", err)
			}
			if prev, ok := resources[res.URI]; ok {
				g.opts.Log.Warn("a resource is offered by two upstreams: the first has it", "uri", res.URI, "upstream", prev, "also", name)
				continue
			}
			resources[res.URI] = name
			g.server.AddResource(res, read)
		}
		for tpl, err := range cs.ResourceTemplates(ctx, nil) {
			if err != nil {
				return fmt.Errorf("list resource templates: %w", err)
			}
			if prev, ok := resources["template:"+tpl.URITemplate]; ok {
				g.opts.Log.Warn("a resource template is offered by two upstreams: the first has it", "template", tpl.URITemplate, "upstream", prev, "also", name)
				continue
			}
			resources["template:"+tpl.URITemplate] = name
			g.server.AddResourceTemplate(tpl, read)
		}
	}
	if caps.Prompts != nil {
		for p, err := range cs.Prompts(ctx, nil) {
			if err != nil {
				return fmt.Errorf("list prompts: %w", err)
			}
			if prev, ok := prompts[p.Name]; ok {
				g.opts.Log.Warn("a prompt is offered by two upstreams: the first has it", "prompt", p.Name, "upstream", prev, "also", name)
				continue
			}
			prompts[p.Name] = name
			g.server.AddPrompt(p, func(ctx context.Context, req *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
				res, err := cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: req.Params.Name, Arguments: req.Params.Arguments})
				g.recordRead(ctx, "prompts/get", name, err)
				return res, err
			})
		}
	}
	return nil
}

// recordRead records a resource read or a prompt as a read on the gateway's run (--run-id),
// without the URI or the arguments.
func (g *Gateway) recordRead(ctx context.Context, what, upstream string, err error) {
	if g.opts.RunID == "" {
		return
	}
	call := client.ToolCall{Tool: what, Upstream: upstream, Class: "read", Decision: "passed"}
	if err != nil {
		call.Decision = "upstream_error"
	}
	g.record(context.WithoutCancel(ctx), g.opts.RunID, call)
}

func sortedUpstreams(m map[string]*policy.Upstream) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}
