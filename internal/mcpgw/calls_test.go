package mcpgw_test

// The gateway's calls as people and agents meet them: what an approver sees of a gated call,
// an effect resolved as sent without a provider id, replays and intentional repeats,
// cancelled calls, a clean exit's lease, resources and prompts.

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/mcpgw"
	"github.com/airlockhq/airlock/internal/retention"
	"github.com/airlockhq/airlock/internal/store"
)

// addSlow adds slow_write: it sends one progress notification, waits for release, and
// tells finished whether its context was cancelled meanwhile.
func (u *upstream) addSlow() {
	u.started, u.release, u.finished = make(chan struct{}, 1), make(chan struct{}), make(chan bool, 1)
	u.server.AddTool(&mcp.Tool{Name: "slow_write", Description: "slow_write", InputSchema: map[string]any{"type": "object"}},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			u.mu.Lock()
			u.calls["slow_write"]++
			u.mu.Unlock()
			if tok := req.Params.GetProgressToken(); tok != nil {
				_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: 1, Total: 2, Message: "halfway"})
			}
			u.started <- struct{}{}
			<-u.release
			u.finished <- ctx.Err() != nil
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "slow write done"}}}, nil
		})
}

// addReads adds a resource, a resource template and a prompt, counted as calls of
// "resource" and "prompt".
func (u *upstream) addReads() {
	count := func(what string) {
		u.mu.Lock()
		u.calls[what]++
		u.mu.Unlock()
	}
	read := func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		count("resource")
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, MIMEType: "text/plain", Text: "content of " + req.Params.URI}}}, nil
	}
	u.server.AddResource(&mcp.Resource{URI: "notes://index", Name: "index", MIMEType: "text/plain"}, read)
	u.server.AddResourceTemplate(&mcp.ResourceTemplate{URITemplate: "notes://note/{id}", Name: "note"}, read)
	u.server.AddPrompt(&mcp.Prompt{Name: "summarise", Arguments: []*mcp.PromptArgument{{Name: "topic", Required: true}}},
		func(_ context.Context, req *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
			count("prompt")
			return &mcp.GetPromptResult{Messages: []*mcp.PromptMessage{{Role: "user",
				Content: &mcp.TextContent{Text: "Summarise the notes on " + req.Params.Arguments["topic"]}}}}, nil
		})
}

func approvalToken(t *testing.T, r *mcp.CallToolResult) string {
	t.Helper()
	i := strings.Index(text(r), "/approve/")
	if i < 0 {
		t.Fatalf("no approve link in %q", text(r))
	}
	return strings.Fields(text(r)[i+len("/approve/"):])[0]
}

// signedIn is a session of a person with roles (default lead), as the sign-in page makes
// one: the cookie's value, whose hash the store keeps.
func signedIn(t *testing.T, e *env, subject string, roles ...string) *http.Cookie {
	t.Helper()
	if roles == nil {
		roles = []string{"lead"}
	}
	raw := "session-of-" + subject
	sum := sha256.Sum256([]byte(raw))
	now := time.Now()
	if err := e.st.SessionInsert(context.Background(), store.Session{IDHash: hex.EncodeToString(sum[:]), Subject: subject,
		Roles: roles, CreatedAt: now, LastSeenAt: now, ExpiresAt: now.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	return &http.Cookie{Name: "airlock_session", Value: raw}
}

func card(t *testing.T, e *env, token string, c *http.Cookie) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, e.srv.URL+"/approve/"+token, nil)
	req.AddCookie(c)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("approval page: %s: %s", resp.Status, b)
	}
	return string(b)
}

// A gated call's approval holds its arguments as a proposed effect holds its payload: the
// card shows the tool and each argument, the events only hashes, the plan refuses an
// input that is not what the hash is of, and after the decision retention leaves the hash
// alone. Before: the approval had no payload and the card an empty
// "Model output to be sent".
func TestGatedCallHoldsItsArguments(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e.startAgent()
		args := map[string]any{"to": "ana@example.com", "text": "your refund of 40 EUR"}
		token := approvalToken(t, e.mustRefuse("send_mail", args, "approval_pending"))
		ctx := context.Background()
		ap, err := e.st.ApprovalByTokenHash(ctx, approvals.HashToken(token))
		if err != nil {
			t.Fatal(err)
		}
		var held map[string]any
		if err := json.Unmarshal(ap.Payload, &held); err != nil {
			t.Fatalf("the approval holds no input: %q", ap.Payload)
		}
		if want := map[string]any{"tool": "send_mail", "arguments": args}; !jsonEqual(held, want) {
			t.Errorf("the approval holds %v, want %v", held, want)
		}
		raw, _ := json.Marshal(args)
		_, hash, _ := mcpgw.Identity("send_mail", e.pol.MCP.Upstreams["notes"].Tools["send_mail"], raw)
		if ap.PayloadHash != hash {
			t.Errorf("the approval is bound to %s, want the call's hash %s", ap.PayloadHash, hash)
		}
		page := card(t, e, token, signedIn(t, e, "lead-1"))
		for _, want := range []string{"Action to be performed", "<code>send_mail</code>", "<dt>to</dt>", "ana@example.com", "<dt>text</dt>", "your refund of 40 EUR"} {
			if !strings.Contains(page, want) {
				t.Errorf("the card lacks %q", want)
			}
		}
		// The events say only hashes of what log_fields does not name (none here).
		evs, err := e.st.EventList(ctx, "agent-run-1", 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			if strings.Contains(string(ev.Detail), "ana@example.com") || strings.Contains(string(ev.Detail), "refund") {
				t.Errorf("event %s carries the arguments: %s", ev.Kind, ev.Detail)
			}
		}

		// The ledger API binds what the approval shows to the hash it is decided on.
		c := client.New(e.srv.URL, e.srv.APIKey)
		claim, err := c.Claim(ctx, client.ClaimRequest{Key: "other-run", Payload: map[string]string{"a": "b"}})
		if err != nil {
			t.Fatal(err)
		}
		other, _ := json.Marshal(map[string]any{"tool": "send_mail", "arguments": map[string]any{"to": "mallory@example.com", "text": "x"}})
		_, err = c.Plan(ctx, "other-run", "e1", client.PlanRequest{LeaseOwner: claim.LeaseOwner, Action: "mail_send", Target: "notes",
			InputHash: hash, Input: other})
		if !client.IsCode(err, "invalid_field") || !strings.Contains(err.Error(), "input") {
			t.Errorf("a plan whose input is not what its hash is of: %v, want invalid_field on input", err)
		}

		if _, err := e.srv.Approvals.Decide(ctx, approvals.HashToken(token), approvals.Approve, "",
			approvals.Person{Subject: "lead-1", Roles: []string{"lead"}}); err != nil {
			t.Fatal(err)
		}
		e.mustOK("send_mail", args)
		// Retention: a decided approval's input goes with the payloads; its hash stays.
		if _, err := retention.Purge(ctx, e.st, e.pol, time.Now().Add(e.pol.Retention.Payloads.D()+time.Hour), false); err != nil {
			t.Fatal(err)
		}
		after, err := e.st.ApprovalByID(ctx, ap.ID)
		if err != nil {
			t.Fatal(err)
		}
		if after.Payload != nil || after.PayloadHash != hash {
			t.Errorf("after retention: payload %q, hash %q; want no payload and the hash", after.Payload, after.PayloadHash)
		}
	})
}

func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	var u, v any
	_ = json.Unmarshal(x, &u)
	_ = json.Unmarshal(y, &v)
	x, _ = json.Marshal(u)
	y, _ = json.Marshal(v)
	return string(x) == string(y)
}

// An approval for arguments A never forwards arguments B, even under the same effect id
// (effect_id_argument): B is another input and needs its own approval, and the call
// approved goes upstream with A exactly.
func TestApprovalOfOneInputNeverForwardsAnother(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e.startAgent()
		a := map[string]any{"request_id": "r1", "to": "ana@example.com"}
		b := map[string]any{"request_id": "r1", "to": "mallory@example.com"}
		token := approvalToken(t, e.mustRefuse("send_mail_once", a, "approval_pending"))
		if _, err := e.srv.Approvals.Decide(context.Background(), approvals.HashToken(token), approvals.Approve, "",
			approvals.Person{Subject: "lead-1", Roles: []string{"lead"}}); err != nil {
			t.Fatal(err)
		}
		second := approvalToken(t, e.mustRefuse("send_mail_once", b, "approval_pending"))
		if second == token {
			t.Fatal("B was given A's approval")
		}
		ap, err := e.st.ApprovalByTokenHash(context.Background(), approvals.HashToken(second))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(ap.Payload), "mallory@example.com") {
			t.Errorf("B's approval shows %s, not B", ap.Payload)
		}
		if n := e.up.count("send_mail_once"); n != 0 {
			t.Fatalf("an input nobody approved reached the upstream (%d calls)", n)
		}
		// Both approved: the effect id goes to the first call made, with its own input;
		// the other input under that id is a mismatch, never sent.
		if _, err := e.srv.Approvals.Decide(context.Background(), approvals.HashToken(second), approvals.Approve, "",
			approvals.Person{Subject: "lead-1", Roles: []string{"lead"}}); err != nil {
			t.Fatal(err)
		}
		if got := text(e.mustOK("send_mail_once", a)); got != "sent to ana@example.com" {
			t.Errorf("the approved call: %q", got)
		}
		e.mustRefuse("send_mail_once", b, "input_mismatch")
		e.up.mu.Lock()
		sent := strings.Join(e.up.sentTo, ",")
		e.up.mu.Unlock()
		if sent != "ana@example.com" {
			t.Errorf("the upstream sent to %s, want ana@example.com alone", sent)
		}
	})
}

// An unknown effect a person resolved as sent without a provider id is answered from the
// ledger: performed, no result recorded, never sent again — not airlock_unavailable on
// every later call. With a provider id, the answer names it. The doors:
// the API and the console's form here, the CLI in scripts/test-mcp-e2e.sh.
func TestResolvedSentWithoutProviderIDIsAnsweredFromTheLedger(t *testing.T) {
	for _, c := range []struct{ door, providerID string }{{"api", ""}, {"api", "n-42"}, {"console", ""}} {
		providerID := c.providerID
		t.Run(c.door+"/provider_id="+providerID, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, e *env) {
				e.hook = func(p string) error {
					if p == "mcp_after_upstream" {
						return errCrash
					}
					return nil
				}
				e.startAgent()
				args := map[string]any{"text": "resolved"}
				_, _ = e.call("write_note", args)
				e.hook = nil
				e.restartAgent()
				e.mustRefuse("write_note", args, "reconcile_first")
				eff, err := e.st.EffectByRunEffectID(context.Background(), "agent-run-1", effectID(t, e.pol, "write_note", args))
				if err != nil {
					t.Fatal(err)
				}
				if c.door == "console" {
					consoleResolve(t, e, eff, providerID)
				} else {
					op := client.New(e.srv.URL, operatorKey(t, e))
					body := `{"outcome":"sent","no_provider_id":true,"note":"the note is there"}`
					if providerID != "" {
						body = `{"outcome":"sent","provider_id":"` + providerID + `","note":"the note is there"}`
					}
					if err := post(op, "/v1/effects/"+eff.ID+"/resolve", body); err != nil {
						t.Fatal(err)
					}
				}
				for i := range 2 {
					r := e.mustOK("write_note", args)
					if !strings.Contains(text(r), "performed earlier") || !strings.Contains(text(r), "not sent again") {
						t.Errorf("call %d: %q", i+1, text(r))
					}
					if providerID != "" && !strings.Contains(text(r), providerID) {
						t.Errorf("call %d does not name the provider id: %q", i+1, text(r))
					}
					m, _ := r.Meta[mcpgw.ReplayedMeta].(map[string]any)
					if m["result_recorded"] != false || m["effect_id"] != eff.EffectID {
						t.Errorf("call %d: _meta %v", i+1, r.Meta)
					}
				}
				if n := e.up.count("write_note"); n != 1 {
					t.Errorf("the upstream performed it %d times", n)
				}
				d := e.decisions()
				if got := strings.Join(d[len(d)-2:], ","); got != "write_note:replayed,write_note:replayed" {
					t.Errorf("tool_call events end %s", got)
				}
			})
		})
	}
}

// consoleResolve resolves the effect as sent with the console's form, as an operator's
// browser posts it (its session, the form token, the page's origin).
func consoleResolve(t *testing.T, e *env, eff store.Effect, providerID string) {
	t.Helper()
	cookie := signedIn(t, e, "oncall-1", "ops")
	m := hmac.New(sha256.New, []byte(cookie.Value))
	m.Write([]byte("airlock console form"))
	outcome := "sent"
	if providerID == "" {
		outcome = "sent_no_id" // the form's "sent: the provider has it but gave no id"
	}
	form := url.Values{"csrf": {hex.EncodeToString(m.Sum(nil))}, "outcome": {outcome}, "provider_id": {providerID},
		"note": {"the note is there"}, "version": {strconv.FormatInt(eff.Version, 10)}}
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/console/effects/"+eff.ID+"/resolve", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", e.srv.URL)
	req.AddCookie(cookie)
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noFollow.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || !strings.Contains(loc, "done=resolved") {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("console resolve: %s %s: %.300s", resp.Status, loc, b)
	}
}

func post(c *client.Client, path, body string) error {
	req, _ := http.NewRequest(http.MethodPost, c.BaseURL+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+c.APIKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return errors.New(resp.Status + ": " + string(b))
	}
	return nil
}

func (e *env) callMeta(tool string, args map[string]any, meta mcp.Meta) (*mcp.CallToolResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	return e.agent.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args, Meta: meta})
}

// A replay says so in _meta, and an agent that means to perform an identical call again
// gives it another call key: create, then create again with a new key,
// reaches the upstream twice; the same key again is a replay.
func TestReplayIsMarkedAndACallKeyPerformsAgain(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e.startAgent()
		args := map[string]any{"text": "standup notes"}
		first := e.mustOK("write_note", args)
		if _, ok := first.Meta[mcpgw.ReplayedMeta]; ok {
			t.Errorf("a performed call is marked replayed: %v", first.Meta)
		}
		again := e.mustOK("write_note", args)
		m, _ := again.Meta[mcpgw.ReplayedMeta].(map[string]any)
		if m["effect_id"] != effectID(t, e.pol, "write_note", args) || m["result_recorded"] != true || !strings.HasPrefix(m["receipt"].(string), "sha256:") {
			t.Errorf("the replay's _meta: %v", again.Meta)
		}
		if text(again) != text(first) {
			t.Errorf("the replay answers %q, want the recorded %q", text(again), text(first))
		}
		key := mcp.Meta{mcpgw.CallKeyMeta: "standup-2"}
		for i, want := range []int{2, 2} {
			r, err := e.callMeta("write_note", args, key)
			if err != nil || r.IsError {
				t.Fatalf("with a call key: %v %v", err, r)
			}
			if n := e.up.count("write_note"); n != want {
				t.Fatalf("call %d with a new key: the upstream performed write_note %d times, want %d", i+1, n, want)
			}
			_, replayed := r.Meta[mcpgw.ReplayedMeta]
			if replayed != (i == 1) {
				t.Errorf("call %d with the key: replayed=%v", i+1, replayed)
			}
		}
		r, err := e.callMeta("write_note", args, mcp.Meta{mcpgw.CallKeyMeta: "not a key!"})
		if err != nil || !r.IsError || !strings.Contains(text(r), "(invalid_arguments)") {
			t.Errorf("a bad call key: %v %q", err, text(r))
		}
		r, err = e.callMeta("send_mail_once", map[string]any{"request_id": "r9", "to": "x"}, key)
		if err != nil || !r.IsError || !strings.Contains(text(r), "request_id") {
			t.Errorf("a call key on a tool whose effect id is an argument: %v %q", err, text(r))
		}
		want := "write_note:executed,write_note:replayed,write_note:executed,write_note:replayed,write_note:invalid_arguments,send_mail_once:invalid_arguments"
		if got := strings.Join(e.decisions(), ","); got != want {
			t.Errorf("tool_call events: %s, want %s", got, want)
		}
	})
}

// An agent that cancels (or times out) a forwarded effect call does not cut it off: the
// upstream finishes, airlock confirms it, and the agent's retry is answered from the
// ledger; progress reaches the agent meanwhile. Before: the upstream's
// context was cancelled and the effect stayed planned, so the retry got reconcile_first.
func TestCancelledCallIsConfirmedAndItsRetryAnsweredFromTheLedger(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e.progress = make(chan *mcp.ProgressNotificationParams, 4)
		e.cancelled = make(chan struct{}, 1)
		e.startAgent()
		args := map[string]any{"text": "slow"}
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := e.agent.CallTool(ctx, &mcp.CallToolParams{Name: "slow_write", Arguments: args, Meta: mcp.Meta{"progressToken": "agent-token-7"}})
			errc <- err
		}()
		p := <-e.progress
		if p.ProgressToken != "agent-token-7" || p.Progress != 1 || p.Total != 2 || p.Message != "halfway" {
			t.Errorf("the relayed progress: %+v", p)
		}
		<-e.up.started
		cancel()
		if err := <-errc; err == nil {
			t.Fatal("the cancelled call answered")
		}
		<-e.cancelled // the gateway has the cancellation: the call's context is done
		// The retry comes while the first is still running upstream: it waits for it.
		type answer struct {
			r   *mcp.CallToolResult
			err error
		}
		retry := make(chan answer, 1)
		go func() {
			r, err := e.call("slow_write", args)
			retry <- answer{r, err}
		}()
		close(e.up.release)
		if cancelled := <-e.up.finished; cancelled {
			t.Error("the upstream's call was cancelled with the agent's")
		}
		a := <-retry
		if a.err != nil || a.r.IsError {
			t.Fatalf("the retry: %v %v", a.err, a.r)
		}
		r := a.r
		if text(r) != "slow write done" {
			t.Errorf("the retry: %q", text(r))
		}
		if _, ok := r.Meta[mcpgw.ReplayedMeta]; !ok {
			t.Errorf("the retry is not marked as answered from the ledger: %v", r.Meta)
		}
		if n := e.up.count("slow_write"); n != 1 {
			t.Errorf("the upstream performed it %d times", n)
		}
		if got := e.effectStatus(effectID(t, e.pol, "slow_write", args)); got != string(store.EffectCompleted) {
			t.Errorf("effect %s, want completed", got)
		}
	})
}

// A gateway that stops cleanly releases its lease: the next one on the run goes on at
// once instead of waiting the lease out. One that crashes keeps it.
func TestCleanExitReleasesTheLease(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e.lease, e.wait = time.Hour, time.Second // a held lease would refuse the next gateway's call
		e.startAgent()
		e.mustOK("write_note", map[string]any{"text": "one"})
		e.agent.Close()
		if err := e.gw.Close(); err != nil {
			t.Fatal(err)
		}
		e.agent, e.gw = nil, nil
		run, err := e.st.RunGet(context.Background(), "agent-run-1")
		if err != nil {
			t.Fatal(err)
		}
		if run.State != store.StateProcessing || run.LeaseExpiresAt == nil || run.LeaseExpiresAt.After(time.Now()) {
			t.Errorf("after a clean exit the run is %s with its lease until %v; want processing, released", run.State, run.LeaseExpiresAt)
		}
		e.startAgent()
		e.mustOK("write_note", map[string]any{"text": "two"})
		// A crash keeps the lease: the next gateway is refused until it lapses.
		e.stopAgent()
		e.startAgent()
		e.mustRefuse("write_note", map[string]any{"text": "three"}, "lease_held")
	})
}

// Resources, resource templates and prompts pass through as reads.
func TestResourcesAndPromptsPassThrough(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e.startAgent()
		ctx := context.Background()
		var uris []string
		for r, err := range e.agent.Resources(ctx, nil) {
			if err != nil {
				t.Fatal(err)
			}
			uris = append(uris, r.URI)
		}
		if strings.Join(uris, ",") != "notes://index" {
			t.Errorf("resources listed: %v", uris)
		}
		for _, uri := range []string{"notes://index", "notes://note/7"} {
			r, err := e.agent.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
			if err != nil {
				t.Fatalf("read %s: %v", uri, err)
			}
			if len(r.Contents) != 1 || r.Contents[0].Text != "content of "+uri {
				t.Errorf("read %s: %+v", uri, r.Contents)
			}
		}
		p, err := e.agent.GetPrompt(ctx, &mcp.GetPromptParams{Name: "summarise", Arguments: map[string]string{"topic": "billing"}})
		if err != nil {
			t.Fatal(err)
		}
		if tc, _ := p.Messages[0].Content.(*mcp.TextContent); tc == nil || tc.Text != "Summarise the notes on billing" {
			t.Errorf("prompt: %+v", p.Messages[0].Content)
		}
		if e.up.count("resource") != 2 || e.up.count("prompt") != 1 {
			t.Errorf("upstream reads: %d resources, %d prompts", e.up.count("resource"), e.up.count("prompt"))
		}
		if got := strings.Join(e.decisions(), ","); got != "resources/read:passed,resources/read:passed,prompts/get:passed" {
			t.Errorf("tool_call events: %s", got)
		}
	})
}

// The release the gateway sends on a clean exit is a heartbeat with release: true; it
// refuses a lease length with it, and a holder that is not the lease's owner.
func TestReleaseRefusals(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		c := client.New(e.srv.URL, e.srv.APIKey)
		claim, err := c.Claim(ctx, client.ClaimRequest{Key: "rel-1", Payload: map[string]string{"a": "b"}, LeaseSeconds: 600})
		if err != nil {
			t.Fatal(err)
		}
		body := `{"lease_owner":"` + claim.LeaseOwner + `","version":` + strconv.FormatInt(claim.Version, 10) + `,"release":true,"lease_seconds":5}`
		if err := post(c, "/v1/runs/rel-1/heartbeat", body); err == nil || !strings.Contains(err.Error(), "invalid_field") {
			t.Errorf("release with lease_seconds: %v, want invalid_field", err)
		}
		if err := c.Release(ctx, "rel-1", "someone-else", claim.Version); !client.IsCode(err, "lease_lost") {
			t.Errorf("release by another owner: %v, want lease_lost", err)
		}
		if err := c.Release(ctx, "rel-1", claim.LeaseOwner, claim.Version); err != nil {
			t.Fatal(err)
		}
		again, err := c.Claim(ctx, client.ClaimRequest{Key: "rel-1", Payload: map[string]string{"a": "b"}})
		if err != nil || !again.Claimed || again.LeaseOwner == claim.LeaseOwner {
			t.Errorf("the claim after a release: %+v %v; want it taken at once by a new owner", again, err)
		}
		if err := c.Release(ctx, "rel-1", claim.LeaseOwner, claim.Version); err == nil {
			t.Error("a released lease was released again by its old owner")
		}
	})
}
