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
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/tracing"
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
	// Pins are the accepted tool definitions (LoadPins); nil checks none. With pins, a
	// tool whose definition differs from its pin is refused (tool_changed).
	Pins *Pins
	// Tracer, when set, traces each tool call ("tools/call {tool}", a child of the
	// traceparent in the call's _meta) and passes the trace on upstream and to airlock.
	Tracer *tracing.Tracer
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
	// links maps the URI of each resource link a tool returned to its upstream, so a
	// resource created at run time can be read back through the gateway.
	links map[string]string
}

type pendingApproval struct {
	url     string
	expires time.Time
}

type route struct {
	upstream string
	tool     *policy.Tool // nil: unclassified
	def      *mcp.Tool    // the upstream's definition, as last listed
	changed  string       // why the definition is not the accepted one ("" when it is)
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
	if o.Tracer != nil {
		// The gateway's calls to airlock carry its span's trace: airlock's spans join it.
		c := *o.Client
		hc := http.Client{Timeout: 30 * time.Second}
		if c.HTTP != nil {
			hc = *c.HTTP
		}
		hc.Transport = tracing.Transport(hc.Transport)
		c.HTTP = &hc
		o.Client = &c
	}
	if o.Connect == nil {
		o.Connect = dial
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
		pending: map[string]pendingApproval{}, links: map[string]string{}, progress: progressRelay{calls: map[string]progressTarget{}}}
	g.server = mcp.NewServer(&mcp.Implementation{Name: "airlock-mcp", Version: "1"}, nil)
	g.server.AddReceivingMiddleware(g.readLinked)
	resources, prompts := map[string]string{}, map[string]string{}
	for _, name := range sortedUpstreams(o.Policy.MCP.Upstreams) {
		u := o.Policy.MCP.Upstreams[name]
		t, err := o.Connect(ctx, u)
		if err != nil {
			g.Close()
			return nil, fmt.Errorf("upstream %s: %w", name, err)
		}
		session := make(chan *mcp.ClientSession, 1)
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "airlock-mcp", Version: "1"},
			&mcp.ClientOptions{ProgressNotificationHandler: g.progress.relay,
				ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
					// Not on the session's own goroutine: relist calls the upstream.
					go func() {
						cs := <-session
						session <- cs
						g.relist(context.Background(), name, cs)
					}()
				}}).Connect(ctx, t, nil)
		if err != nil {
			g.Close()
			return nil, fmt.Errorf("upstream %s: connect: %w", name, err)
		}
		g.ups[name] = cs
		session <- cs
		for tool, err := range cs.Tools(ctx, nil) {
			if err != nil {
				g.Close()
				return nil, fmt.Errorf("upstream %s: list tools: %w", name, err)
			}
			g.mu.Lock() // an upstream's list_changed may already be relisting
			prev, dup := g.routes[tool.Name]
			r := route{upstream: name, tool: u.Tools[tool.Name], def: tool, changed: g.checkPin(name, tool)}
			if !dup {
				g.routes[tool.Name] = r
			}
			g.mu.Unlock()
			if dup {
				g.Close()
				return nil, fmt.Errorf("tool %s is offered by upstreams %s and %s: the gateway lists one tool per name", tool.Name, prev.upstream, name)
			}
			listed := *tool
			switch {
			case r.tool == nil:
				listed.Description = "(airlock: this tool is not classified in the policy; every call is refused) " + listed.Description
			case r.changed != "":
				o.Log.Warn("an upstream tool's definition is not the accepted one: its calls are refused (tool_changed) until an operator accepts the catalogue again (airlock mcp tools --accept)",
					"upstream", name, "tool", tool.Name, "changed", r.changed)
				listed.Description = "(airlock: this tool's definition changed since it was accepted; every call is refused) " + listed.Description
			}
			g.server.AddTool(&listed, g.handler(tool.Name))
		}
		for tn := range u.Tools {
			g.mu.Lock()
			_, ok := g.routes[tn]
			g.mu.Unlock()
			if !ok {
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

// dial spawns the upstream's command (environment: the gateway's, without AIRLOCK_*
// variables such as the API key, plus the policy's env) or dials its URL.
func dial(_ context.Context, u *policy.Upstream) (mcp.Transport, error) {
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

func (g *Gateway) handler(name string) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		g.mu.Lock()
		r := g.routes[name]
		g.mu.Unlock()
		ctx, end := g.opts.Tracer.MCPToolCall(ctx, req.Params.Meta, name)
		var call client.ToolCall
		var res *mcp.CallToolResult
		var err error
		defer func() { end(err != nil || (res != nil && res.IsError), call.Decision) }()
		args := json.RawMessage(req.Params.Arguments)
		if len(args) == 0 || string(args) == "null" {
			args = json.RawMessage("{}")
		}
		call = client.ToolCall{Tool: name, Upstream: r.upstream}
		switch {
		case r.tool == nil:
			call.Class, call.Decision = "unclassified", "refused_unclassified"
			res = toolError(refuse("unclassified_tool", "the tool %s is not classified in airlock's policy (mcp.upstreams.%s.tools): add it as read or as an effect", name, r.upstream))
		case r.changed != "":
			call.Class, call.Action, call.Decision = "effect", r.tool.Effect, "tool_changed"
			if r.tool.Read {
				call.Class = "read"
			}
			res = toolError(refuse("tool_changed", "the tool %s of upstream %s is not the one an operator accepted: %s. Nothing was done; an operator reviews the change and accepts the catalogue again (airlock mcp tools --accept)", name, r.upstream, r.changed))
		case r.tool.Read && annotatedDestructive(r.def):
			// An annotation makes a call stricter, never looser: a tool the policy calls a
			// read but its upstream calls destructive is not passed through unrecorded.
			call.Class, call.Decision = "read", "annotated_destructive"
			res = toolError(refuse("annotated_destructive", "the policy classifies %s as read, but upstream %s annotates it destructiveHint: true: nothing was done. Classify it as an effect (mcp.upstreams.%s.tools.%s)", name, r.upstream, r.upstream, name))
		case r.tool.Read:
			call.Class = "read"
			params := &mcp.CallToolParams{Name: name, Arguments: args, Meta: traceMeta(ctx)}
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
		g.noteLinks(r.upstream, res)
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

func (g *Gateway) hook(point string) error {
	if g.opts.Hook == nil {
		return nil
	}
	return g.opts.Hook(point)
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

// traceMeta is the _meta of a request the gateway sends upstream: the trace context of
// its span for the call, so the upstream's spans join the agent's trace.
func traceMeta(ctx context.Context) mcp.Meta {
	m := mcp.Meta{}
	tracing.InjectMeta(ctx, m)
	if len(m) == 0 {
		return nil
	}
	return m
}
