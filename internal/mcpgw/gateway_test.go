package mcpgw_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/airlocktest"
	"github.com/airlockhq/airlock/internal/apikeys"
	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/mcpgw"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/storetest"
	"github.com/airlockhq/airlock/internal/tracing"
)

const testPolicy = `
console: {operators: {roles: [ops]}}
actions:
  note_write: {connector: worker, gate: none}
  mail_send:
    connector: worker
    gate: approve_before_act
    approvers: {roles: [lead]}
  note_delete:
    connector: worker
    gate: approve_before_act
    approvers: {roles: [lead]}
    approval: {on_reject: skip_effect}
mcp:
  upstreams:
    notes:
      command: unused-in-tests
      tools:
        read_note: read
        find_notes: read
        write_note: {effect: note_write}
        create_note:
          effect: note_write
          lookup: {tool: find_notes, arguments: {text: "{arg.text}"}, items: /results, id_field: id}
        send_mail: {effect: mail_send}
        send_mail_once: {effect: mail_send, effect_id_argument: request_id}
        slow_write: {effect: note_write}
        write_blob: {effect: note_write}
        write_big: {effect: note_write}
        delete_note: {effect: note_delete}
        write_report: {effect: note_write}
`

// lease is short so a restarted gateway takes its run over soon after its predecessor
// stopped renewing it.
const lease = 2 * time.Second

// upstream is an MCP server on the official Go SDK that counts every call it performs.
type upstream struct {
	server *mcp.Server
	mu     sync.Mutex
	calls  map[string]int // by tool
	notes  []map[string]any
	sentTo []string // send_mail_once's recipients, in order
	// slow_write: started is told when it has sent its progress; it then waits for
	// release, and reports whether its context was cancelled meanwhile on finished.
	started, release chan struct{}
	finished         chan bool
	traceparents     []string // the traceparent in each call's _meta, in order
}

func newUpstream() *upstream {
	u := &upstream{calls: map[string]int{}}
	u.server = mcp.NewServer(&mcp.Implementation{Name: "notes", Version: "1"}, nil)
	obj := map[string]any{"type": "object"}
	add := func(name string, fn func(args map[string]any) *mcp.CallToolResult) {
		u.server.AddTool(&mcp.Tool{Name: name, Description: name, InputSchema: obj}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			var args map[string]any
			_ = json.Unmarshal(req.Params.Arguments, &args)
			u.mu.Lock()
			defer u.mu.Unlock()
			u.calls[name]++
			if tp, ok := req.Params.Meta["traceparent"].(string); ok {
				u.traceparents = append(u.traceparents, tp)
			}
			return fn(args), nil
		})
	}
	text := func(s string) *mcp.CallToolResult {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
	}
	add("read_note", func(args map[string]any) *mcp.CallToolResult { return text(fmt.Sprintf("note %v", args["id"])) })
	write := func(args map[string]any) *mcp.CallToolResult {
		id := fmt.Sprintf("n%d", len(u.notes)+1)
		u.notes = append(u.notes, map[string]any{"id": id, "text": args["text"]})
		var sc any = map[string]any{"id": id}
		if args["text"] == "deep" { // a result nested deeper than airlock's bodies may be
			for range 100 {
				sc = map[string]any{"a": sc}
			}
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "wrote " + id}}, StructuredContent: sc}
	}
	add("write_note", write)
	add("create_note", write)
	add("send_mail", func(args map[string]any) *mcp.CallToolResult { return text(fmt.Sprintf("sent to %v", args["to"])) })
	add("send_mail_once", func(args map[string]any) *mcp.CallToolResult {
		u.sentTo = append(u.sentTo, fmt.Sprint(args["to"]))
		return text(fmt.Sprintf("sent to %v", args["to"]))
	})
	u.addSlow()
	u.addReads()
	// write_report creates a resource at run time (in no list read at start) and links it.
	add("write_report", func(args map[string]any) *mcp.CallToolResult {
		uri := fmt.Sprintf("notes://report/%v", args["name"])
		u.server.AddResource(&mcp.Resource{URI: uri, Name: "report", MIMEType: "text/plain"},
			func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
				return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, MIMEType: "text/plain", Text: "the report " + uri}}}, nil
			})
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "wrote " + uri}, &mcp.ResourceLink{URI: uri, Name: "report"}}}
	})
	add("delete_note", func(args map[string]any) *mcp.CallToolResult { return text(fmt.Sprintf("deleted %v", args["id"])) })
	add("delete_all", func(map[string]any) *mcp.CallToolResult { u.notes = nil; return text("deleted") })
	// Results PostgreSQL cannot store as they are (a NUL), or larger than a body limit.
	add("write_blob", func(args map[string]any) *mcp.CallToolResult {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("wrote %v\x00bytes", args["name"])}},
			StructuredContent: map[string]any{"raw": "a\x00b", "k\x00": 1}}
	})
	add("write_big", func(args map[string]any) *mcp.CallToolResult {
		n, _ := args["bytes"].(float64)
		return text(strings.Repeat("x", int(n)))
	})
	add("find_notes", func(args map[string]any) *mcp.CallToolResult {
		found := []any{}
		for _, n := range u.notes {
			if n["text"] == args["text"] {
				found = append(found, n)
			}
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("%d found", len(found))}},
			StructuredContent: map[string]any{"results": found}}
	})
	return u
}

func (u *upstream) count(tool string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.calls[tool]
}

func (u *upstream) plant(text string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.notes = append(u.notes, map[string]any{"id": fmt.Sprintf("planted%d", len(u.notes)+1), "text": text})
}

// env is one airlock (restartable behind a stable URL), one upstream, and the agent's
// side: a gateway and an MCP client on the official Go SDK.
type env struct {
	t       testing.TB
	maxBody int64 // airlock's body limit (0: its default)
	st      store.Store
	srv     *airlocktest.Server
	target  atomic.Pointer[url.URL]
	proxy   *httptest.Server
	up      *upstream
	pol     *policy.Policy
	gw      *mcpgw.Gateway
	agent   *mcp.ClientSession
	hook    func(string) error
	lease   time.Duration // the gateway's lease (default: lease)
	wait    time.Duration // how long it waits for another's lease (default 30s)
	// progress, when set, gets the progress notifications the agent receives.
	progress chan *mcp.ProgressNotificationParams
	// cancelled, when set, is told when the gateway receives the agent's cancellation.
	cancelled chan struct{}
	pins      *mcpgw.Pins     // the accepted tool definitions the gateway checks (nil: none)
	tracer    *tracing.Tracer // traces airlock and the gateway (nil: neither)
}

func newEnv(t testing.TB, b storetest.Backend) *env {
	t.Helper()
	e := &env{t: t, st: b.Open(t, nil), up: newUpstream()}
	pol, err := policy.Parse([]byte(testPolicy), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	e.pol = pol
	e.startAirlock()
	e.proxy = httptest.NewServer(&httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(e.target.Load()) }})
	t.Cleanup(e.proxy.Close)
	t.Cleanup(func() { e.stopAgent() })
	return e
}

// startAirlock starts (or restarts) airlock on the same store; the gateway keeps its URL.
func (e *env) startAirlock() {
	e.t.Helper()
	first := e.srv
	if e.srv != nil {
		e.srv.Close()
	}
	srv, err := airlocktest.StartWith(context.Background(), e.st, testPolicy, airlocktest.Options{MaxBodyBytes: e.maxBody, Tracer: e.tracer})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(srv.Close)
	if first != nil {
		srv.APIKey = first.APIKey // the agent's key lives in the store
	}
	e.srv = srv
	u, _ := url.Parse(srv.URL)
	e.target.Store(u)
}

// startAgent starts a gateway and connects an agent to it, as an agent spawning
// `airlock mcp` does.
func (e *env) startAgent() {
	e.t.Helper()
	ctx := context.Background()
	c := client.New(e.proxy.URL, e.srv.APIKey)
	c.Retries = 0
	l, w := lease, 30*time.Second
	if e.lease > 0 {
		l = e.lease
	}
	if e.wait > 0 {
		w = e.wait
	}
	gw, err := mcpgw.New(ctx, mcpgw.Options{Policy: e.pol, Client: c, RunID: "agent-run-1", Lease: l, Wait: w, Pins: e.pins, Tracer: e.tracer,
		Hook: func(p string) error {
			if e.hook != nil {
				return e.hook(p)
			}
			return nil
		},
		Connect: e.connect})
	if err != nil {
		e.t.Fatal(err)
	}
	if e.cancelled != nil {
		gw.Server().AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
			return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
				if method == "notifications/cancelled" {
					// The request's context is cancelled before this is handled.
					e.cancelled <- struct{}{}
				}
				return next(ctx, method, req)
			}
		})
	}
	ct, st := mcp.NewInMemoryTransports()
	if _, err := gw.Server().Connect(ctx, st, nil); err != nil {
		e.t.Fatal(err)
	}
	agent, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			if e.progress != nil {
				e.progress <- req.Params
			}
		}}).Connect(ctx, ct, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	e.gw, e.agent = gw, agent
}

// connect connects the gateway (or a catalogue) to the upstream, in memory.
func (e *env) connect(ctx context.Context, _ *policy.Upstream) (mcp.Transport, error) {
	ct, st := mcp.NewInMemoryTransports()
	if _, err := e.up.server.Connect(ctx, st, nil); err != nil {
		return nil, err
	}
	return ct, nil
}

// stopAgent ends the agent and its gateway as a crash would: the lease is not released
// (Abandon; Close is the clean exit).
func (e *env) stopAgent() {
	if e.agent != nil {
		e.agent.Close()
		e.gw.Abandon()
		e.agent, e.gw = nil, nil
	}
}

func (e *env) restartAgent() {
	e.stopAgent()
	e.startAgent()
}

func (e *env) call(tool string, args map[string]any) (*mcp.CallToolResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	return e.agent.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
}

func text(r *mcp.CallToolResult) string {
	var parts []string
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// mustOK calls and requires a successful tool result.
func (e *env) mustOK(tool string, args map[string]any) *mcp.CallToolResult {
	e.t.Helper()
	r, err := e.call(tool, args)
	if err != nil {
		e.t.Fatalf("%s: %v", tool, err)
	}
	if r.IsError {
		e.t.Fatalf("%s: tool error: %s", tool, text(r))
	}
	return r
}

// mustRefuse calls and requires a tool error naming code.
func (e *env) mustRefuse(tool string, args map[string]any, code string) *mcp.CallToolResult {
	e.t.Helper()
	r, err := e.call(tool, args)
	if err != nil {
		e.t.Fatalf("%s: %v", tool, err)
	}
	if !r.IsError || !strings.Contains(text(r), "("+code+")") {
		e.t.Fatalf("%s: want a tool error %s, got error=%v %q", tool, code, r.IsError, text(r))
	}
	return r
}

// decisions are the tool_call events' decisions on the run, in order.
func (e *env) decisions() []string {
	e.t.Helper()
	c := client.New(e.proxy.URL, e.srv.APIKey)
	var out []string
	var after int64
	for {
		evs, next, err := c.Events(context.Background(), "agent-run-1", after, 100)
		if err != nil {
			e.t.Fatal(err)
		}
		for _, ev := range evs {
			if ev.Kind == "tool_call" {
				var d struct{ Tool, Decision string }
				_ = json.Unmarshal(ev.Detail, &d)
				out = append(out, d.Tool+":"+d.Decision)
			}
		}
		if next == 0 {
			return out
		}
		after = next
	}
}

func (e *env) effectStatus(id string) string {
	e.t.Helper()
	eff, err := e.st.EffectByRunEffectID(context.Background(), "agent-run-1", id)
	if err != nil {
		e.t.Fatal(err)
	}
	return string(eff.State)
}

func forEachBackend(t *testing.T, fn func(t *testing.T, e *env)) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) { fn(t, newEnv(t, b)) })
	}
}

func effectID(t *testing.T, pol *policy.Policy, tool string, args map[string]any) string {
	t.Helper()
	raw, _ := json.Marshal(args)
	id, _, err := mcpgw.Identity(tool, pol.MCP.Upstreams["notes"].Tools[tool], raw)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestReadPassesThroughAndUnclassifiedIsRefused(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e.startAgent()
		ctx := context.Background()
		var names []string
		for tool, err := range e.agent.Tools(ctx, nil) {
			if err != nil {
				t.Fatal(err)
			}
			names = append(names, tool.Name)
			if tool.Name == "delete_all" && !strings.Contains(tool.Description, "not classified") {
				t.Errorf("the unclassified tool is listed without saying it is refused: %q", tool.Description)
			}
		}
		if len(names) != 12 {
			t.Errorf("the gateway lists %v; want the upstream's 12 tools", names)
		}
		r := e.mustOK("read_note", map[string]any{"id": 7})
		if text(r) != "note 7" || e.up.count("read_note") != 1 {
			t.Errorf("read: %q, upstream calls %d", text(r), e.up.count("read_note"))
		}
		e.mustRefuse("delete_all", map[string]any{}, "unclassified_tool")
		if n := e.up.count("delete_all"); n != 0 {
			t.Errorf("an unclassified tool reached the upstream %d times", n)
		}
		if got, want := strings.Join(e.decisions(), ","), "read_note:passed,delete_all:refused_unclassified"; got != want {
			t.Errorf("tool_call events: %s, want %s", got, want)
		}
	})
}

func TestEffectExecutedOnceAcrossRestarts(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e.startAgent()
		args := map[string]any{"text": "hello"}
		first := e.mustOK("write_note", args)
		if e.up.count("write_note") != 1 || text(first) != "wrote n1" {
			t.Fatalf("first call: %q, upstream calls %d", text(first), e.up.count("write_note"))
		}
		same := func(when string) {
			t.Helper()
			r := e.mustOK("write_note", args)
			if n := e.up.count("write_note"); n != 1 {
				t.Fatalf("%s: the upstream performed the effect %d times", when, n)
			}
			if text(r) != "wrote n1" {
				t.Errorf("%s: the recorded result is %q, want %q", when, text(r), "wrote n1")
			}
			sc, _ := json.Marshal(r.StructuredContent)
			if string(sc) != `{"id":"n1"}` {
				t.Errorf("%s: structured content %s", when, sc)
			}
		}
		same("the same call again")
		e.restartAgent()
		same("after the agent restarted")
		e.startAirlock()
		same("after airlock restarted")
		e.restartAgent()
		e.startAirlock()
		same("after both restarted")
		e.mustOK("write_note", map[string]any{"text": "other"})
		if n := e.up.count("write_note"); n != 2 {
			t.Errorf("a call with other arguments: upstream calls %d, want 2", n)
		}
		if got := e.effectStatus(effectID(t, e.pol, "write_note", args)); got != string(store.EffectCompleted) {
			t.Errorf("effect state %s", got)
		}
		want := "write_note:executed,write_note:replayed,write_note:replayed,write_note:replayed,write_note:replayed,write_note:executed"
		if got := strings.Join(e.decisions(), ","); got != want {
			t.Errorf("tool_call events: %s, want %s", got, want)
		}
	})
}

func TestKillSwitchHoldsEffectsNotReads(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		_, admin, err := apikeys.Create(context.Background(), e.st, "admin", []string{apikeys.ScopeAdmin}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		set := func(enabled bool) {
			body := fmt.Sprintf(`{"enabled":%v,"reason":"test"}`, enabled)
			req, _ := http.NewRequest(http.MethodPut, e.srv.URL+"/v1/admin/kill-switch", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+admin)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("kill switch: %v %v", err, resp)
			}
			resp.Body.Close()
		}
		e.startAgent()
		set(false)
		e.mustRefuse("write_note", map[string]any{"text": "x"}, "actions_disabled")
		e.mustOK("read_note", map[string]any{"id": 1})
		if n := e.up.count("write_note"); n != 0 {
			t.Fatalf("the kill switch let %d calls through", n)
		}
		set(true)
		e.mustOK("write_note", map[string]any{"text": "x"})
		if n := e.up.count("write_note"); n != 1 {
			t.Errorf("after enabling: upstream calls %d", n)
		}
	})
}

func TestGatedToolPendingThenAllowedAfterApproval(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e.startAgent()
		args := map[string]any{"to": "ana@example.com", "text": "hi"}
		r := e.mustRefuse("send_mail", args, "approval_pending")
		i := strings.Index(text(r), "/approve/")
		if i < 0 {
			t.Fatalf("no approve link in %q", text(r))
		}
		token := strings.Fields(text(r)[i+len("/approve/"):])[0]
		// Still waiting: nothing sent, and the answer has the link again.
		if again := text(e.mustRefuse("send_mail", args, "approval_pending")); !strings.Contains(again, "/approve/"+token+" ") {
			t.Errorf("a repeated call while the approval is pending lacks its link: %q", again)
		}
		e.mustOK("read_note", map[string]any{"id": 1}) // reads go on meanwhile
		if n := e.up.count("send_mail"); n != 0 {
			t.Fatalf("a gated tool reached the upstream %d times before the approval", n)
		}
		if _, err := e.srv.Approvals.Decide(context.Background(), approvals.HashToken(token), approvals.Approve, "",
			approvals.Person{Subject: "lead", Roles: []string{"lead"}}); err != nil {
			t.Fatal(err)
		}
		if got := text(e.mustOK("send_mail", args)); got != "sent to ana@example.com" {
			t.Errorf("after approval: %q", got)
		}
		e.mustOK("send_mail", args)
		if n := e.up.count("send_mail"); n != 1 {
			t.Errorf("upstream calls %d, want 1", n)
		}
		// Other arguments are another effect: a new approval, never this one's.
		e.mustRefuse("send_mail", map[string]any{"to": "bob@example.com", "text": "hi"}, "approval_pending")
		if n := e.up.count("send_mail"); n != 1 {
			t.Errorf("an unapproved call reached the upstream (%d calls)", n)
		}
	})
}

var errCrash = errors.New("crashed")

func TestCrashBetweenPlanAndConfirmIsNeverSentAgain(t *testing.T) {
	for _, point := range []string{"mcp_after_plan", "mcp_after_upstream"} {
		t.Run(point, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, e *env) {
				e.hook = func(p string) error {
					if p == point {
						return errCrash
					}
					return nil
				}
				e.startAgent()
				args := map[string]any{"text": "crash"}
				if r, err := e.call("write_note", args); err == nil && !r.IsError {
					t.Fatalf("the crashing call answered %q", text(r))
				}
				performed := e.up.count("write_note")
				e.hook = nil
				e.restartAgent()
				for i := range 2 {
					e.mustRefuse("write_note", args, "reconcile_first")
					if n := e.up.count("write_note"); n != performed {
						t.Fatalf("call %d after the crash reached the upstream (%d calls, %d before)", i+1, n, performed)
					}
				}
				id := effectID(t, e.pol, "write_note", args)
				if got := e.effectStatus(id); got != string(store.EffectUnknown) {
					t.Errorf("the effect is %s; want unknown, for a person", got)
				}
				// A person finds it was not sent: the same call then goes through, once.
				if point == "mcp_after_plan" {
					eff, _ := e.st.EffectByRunEffectID(context.Background(), "agent-run-1", id)
					op := client.New(e.srv.URL, operatorKey(t, e))
					if err := resolve(op, eff.ID, "not_sent"); err != nil {
						t.Fatal(err)
					}
					e.mustOK("write_note", args)
					if n := e.up.count("write_note"); n != 1 {
						t.Errorf("after the person's resolution: upstream calls %d, want 1", n)
					}
				}
			})
		})
	}
}

func operatorKey(t *testing.T, e *env) string {
	_, k, err := apikeys.Create(context.Background(), e.st, "ops", []string{apikeys.ScopeOperator}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func resolve(c *client.Client, id, outcome string) error {
	req, _ := http.NewRequest(http.MethodPost, c.BaseURL+"/v1/effects/"+id+"/resolve",
		strings.NewReader(`{"outcome":"`+outcome+`","note":"checked the notes"}`))
	req.Header.Set("Authorization", "Bearer "+c.APIKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("resolve: %s", resp.Status)
	}
	return nil
}

func TestLookupSettlesAnInterruptedCall(t *testing.T) {
	cases := []struct {
		name, point string
		plant       int
		wantCalls   int    // create_note calls performed in the end
		wantState   string // the effect's state
		refused     bool
	}{
		{"none found: cleared, performed once", "mcp_after_plan", 0, 1, string(store.EffectCompleted), false},
		{"one found: confirmed, not sent again", "mcp_after_upstream", 0, 1, string(store.EffectCompleted), false},
		{"several found: a person decides", "mcp_after_upstream", 1, 1, string(store.EffectUnknown), true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, e *env) {
				e.hook = func(p string) error {
					if p == c.point {
						return errCrash
					}
					return nil
				}
				e.startAgent()
				args := map[string]any{"text": "weekly report"}
				_, _ = e.call("create_note", args)
				for range c.plant {
					e.up.plant("weekly report")
				}
				e.hook = nil
				e.restartAgent()
				if c.refused {
					e.mustRefuse("create_note", args, "reconcile_first")
				} else {
					e.mustOK("create_note", args)
					e.mustOK("create_note", args) // and the same call again is answered from the ledger
				}
				if n := e.up.count("create_note"); n != c.wantCalls {
					t.Errorf("create_note performed %d times, want %d", n, c.wantCalls)
				}
				if got := e.effectStatus(effectID(t, e.pol, "create_note", args)); got != c.wantState {
					t.Errorf("effect state %s, want %s", got, c.wantState)
				}
			})
		})
	}
}

// storedMeta is the gateway's note on a replayed result that is not the upstream's own.
func storedMeta(r *mcp.CallToolResult) map[string]any {
	m, _ := r.Meta[mcpgw.StoredResultMeta].(map[string]any)
	return m
}

// A tool result with NUL characters (PostgreSQL stores none in jsonb) is still confirmed:
// the agent gets the real result, the effect completes, and the same call again is
// answered from the ledger with the result as kept (NULs written \u0000, and a note) —
// not refused reconcile_first as an effect that may or may not have happened. Before:
// the confirm was refused (400 nul_character), the call recorded executed_unconfirmed,
// and the next identical call turned the effect unknown.
func TestResultWithNULIsConfirmed(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e.startAgent()
		args := map[string]any{"name": "f1"}
		first := e.mustOK("write_blob", args)
		if text(first) != "wrote f1\x00bytes" {
			t.Errorf("the agent got %q, not the upstream's result", text(first))
		}
		if got := e.effectStatus(effectID(t, e.pol, "write_blob", args)); got != string(store.EffectCompleted) {
			t.Fatalf("effect %s, want completed", got)
		}
		again := e.mustOK("write_blob", args)
		if n := e.up.count("write_blob"); n != 1 {
			t.Fatalf("the upstream performed it %d times", n)
		}
		if text(again) != `wrote f1\u0000bytes` {
			t.Errorf("replayed text %q", text(again))
		}
		sc, _ := json.Marshal(again.StructuredContent)
		if string(sc) != `{"k\\u0000":1,"raw":"a\\u0000b"}` {
			t.Errorf("replayed structured content %s", sc)
		}
		if m := storedMeta(again); m["nul_escaped"] != float64(3) || !strings.HasPrefix(fmt.Sprint(m["receipt"]), "sha256:") {
			t.Errorf("replayed _meta %v: want the count of escaped NULs and the receipt", again.Meta)
		}
		if got, want := strings.Join(e.decisions(), ","), "write_blob:executed,write_blob:replayed"; got != want {
			t.Errorf("tool_call events: %s, want %s", got, want)
		}
	})
}

// A result larger than airlock's body limit (here 64 KiB), or than the 256 KiB kept, is
// still confirmed: with a marker that says so in place of the result. Before: the confirm
// was refused (413) and the effect went unknown on the next call.
func TestOversizedResultIsConfirmed(t *testing.T) {
	for _, c := range []struct {
		name    string
		maxBody int64
		bytes   int
		why     string
	}{
		{"over the body limit", 64 << 10, 100 << 10, "refused"},
		{"over the kept size", 0, 300 << 10, "too_large"},
	} {
		t.Run(c.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, e *env) {
				e.maxBody = c.maxBody
				e.startAirlock()
				e.startAgent()
				args := map[string]any{"bytes": c.bytes}
				if got := len(text(e.mustOK("write_big", args))); got != c.bytes {
					t.Errorf("the agent got %d bytes, want the whole result's %d", got, c.bytes)
				}
				if got := e.effectStatus(effectID(t, e.pol, "write_big", args)); got != string(store.EffectCompleted) {
					t.Fatalf("effect %s, want completed", got)
				}
				again := e.mustOK("write_big", args)
				if n := e.up.count("write_big"); n != 1 {
					t.Fatalf("the upstream performed it %d times", n)
				}
				if m := storedMeta(again); m["omitted"] != c.why || !strings.Contains(text(again), "not sent again") {
					t.Errorf("replay %q, _meta %v: want the marker (%s)", text(again), again.Meta, c.why)
				}
			})
		})
	}
}

// A result nested deeper than the server accepts in a body (64 levels) is confirmed by its
// receipt alone, like one over 256 KB: the effect happened, so its confirmation must go
// through, and the same call again is answered from the ledger, not sent again.
func TestDeepResultIsConfirmedByItsReceipt(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e.startAgent()
		args := map[string]any{"text": "deep"}
		e.mustOK("write_note", args)
		again := e.mustOK("write_note", args)
		if n := e.up.count("write_note"); n != 1 {
			t.Fatalf("the upstream performed the effect %d times", n)
		}
		if !strings.Contains(text(again), "performed earlier") {
			t.Errorf("the replay: %q", text(again))
		}
		if got := strings.Join(e.decisions(), ","); got != "write_note:executed,write_note:replayed" {
			t.Errorf("tool_call events: %s", got)
		}
	})
}
