package httpapi_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/accounts"
	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/slack"
	"github.com/airlockhq/airlock/internal/store"
)

// No Slack is reachable here. slackStandin is Slack's side of the app, in process: an
// incoming webhook that keeps the messages airlock posts, response URLs that keep what
// airlock posts to them, a Web API that answers views.open (checking the bot token), and
// a client that sends interactivity payloads and slash commands to airlock signed as
// Slack documents it (v0, HMAC-SHA256 of "v0:timestamp:body" with the signing secret,
// form-encoded bodies). The signing here is the test's own, not airlock's.
type slackStandin struct {
	*httptest.Server
	t        *testing.T
	h        *harness
	secret   string
	team     string
	mu       sync.Mutex
	messages []string            // incoming-webhook posts
	posts    map[string][]string // response_url path → bodies posted
	views    []string            // views.open bodies
	nextResp int
}

const (
	slackSecret   = "8f742231b10e8888abcd99yyyzzz85a5"
	slackBotToken = "xoxb-test-BOT-TOKEN-7781"
)

func newSlackStandin(t *testing.T, h *harness) *slackStandin {
	s := &slackStandin{t: t, h: h, secret: slackSecret, team: "T0AIRLOCK", posts: map[string][]string{}}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		defer s.mu.Unlock()
		switch {
		case strings.HasPrefix(r.URL.Path, "/services/"):
			s.messages = append(s.messages, string(b))
		case strings.HasPrefix(r.URL.Path, "/actions/"):
			s.posts[r.URL.Path] = append(s.posts[r.URL.Path], string(b))
		case r.URL.Path == "/api/views.open":
			if r.Header.Get("Authorization") != "Bearer "+slackBotToken {
				_, _ = w.Write([]byte(`{"ok":false,"error":"invalid_auth"}`))
				return
			}
			s.views = append(s.views, string(b))
			_, _ = w.Write([]byte(`{"ok":true}`))
			return
		default:
			w.WriteHeader(http.StatusNotFound)
			return
		}
		_, _ = w.Write([]byte("ok"))
	}))
	t.Cleanup(s.Close)
	h.env.Policy.Slack = &policy.Slack{SigningSecret: slackSecret, BotToken: slackBotToken, APIURL: s.URL + "/api",
		ResponseURLPrefixes: []string{s.URL + "/actions/"}}
	h.env.Policy.Notify.Webhooks = map[string]*policy.Webhook{
		"approvers": {Name: "approvers", Format: policy.WebhookSlack, URL: s.URL + "/services/T0AIRLOCK/B01/SECRET"}}
	email := h.env.Policy.Action("email")
	email.Notify = []string{"approvers"}
	email.LogFields = []string{"subject"}
	email.Approval.DecideIn = []string{policy.DecideInPage, policy.DecideInSlack}
	return s
}

// responseURL is a fresh response_url, as Slack gives each message.
func (s *slackStandin) responseURL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextResp++
	return s.URL + "/actions/T0AIRLOCK/" + strconv.Itoa(s.nextResp) + "/xyzRESPONSE"
}

func (s *slackStandin) postsTo(responseURL string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	u, _ := url.Parse(responseURL)
	return append([]string(nil), s.posts[u.Path]...)
}

func (s *slackStandin) lastMessage() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.messages) == 0 {
		s.t.Fatal("no Slack message was posted")
	}
	return s.messages[len(s.messages)-1]
}

// signed is a request as Slack sends it: the body form-encoded, signed at ts.
func (s *slackStandin) signed(base, path string, form url.Values, ts int64, secret string) response {
	s.t.Helper()
	body := form.Encode()
	m := hmac.New(sha256.New, []byte(secret))
	fmt.Fprintf(m, "v0:%d:%s", ts, body)
	return s.send(base, path, body, strconv.FormatInt(ts, 10), "v0="+hex.EncodeToString(m.Sum(nil)))
}

func (s *slackStandin) send(base, path, body, ts, sig string) response {
	s.t.Helper()
	req, _ := http.NewRequest("POST", base+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("X-Slack-Request-Timestamp", ts)
	req.Header.Set("X-Slack-Signature", sig)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := response{status: resp.StatusCode, raw: string(raw), header: resp.Header}
	_ = json.Unmarshal(raw, &r.body)
	return r
}

func (s *slackStandin) now() int64 { return s.h.env.Clock.Now().Unix() }

// clickForm is a block_actions payload: user (team, id) pressed the button.
func (s *slackStandin) clickForm(user, action, value, responseURL string) url.Values {
	p, _ := json.Marshal(map[string]any{
		"type": "block_actions", "trigger_id": "trig-" + user, "response_url": responseURL,
		// A display name and an email as Slack sends them: airlock must not use them.
		"user":    map[string]any{"id": user, "team_id": s.team, "username": "lead", "name": "lead", "email": "lead@example.com"},
		"team":    map[string]any{"id": s.team, "domain": "acme"},
		"actions": []any{map[string]any{"type": "button", "action_id": action, "value": value, "block_id": "airlock_decision"}},
	})
	return url.Values{"payload": {string(p)}}
}

func (s *slackStandin) click(user, action, value, responseURL string) response {
	s.t.Helper()
	return s.signed(s.h.url, "/integrations/slack/actions", s.clickForm(user, action, value, responseURL), s.now(), s.secret)
}

// submit is the reject modal's view_submission, carrying back the view airlock opened.
func (s *slackStandin) submit(user, view, reason string) response {
	s.t.Helper()
	var v struct {
		View struct {
			CallbackID      string `json:"callback_id"`
			PrivateMetadata string `json:"private_metadata"`
		} `json:"view"`
	}
	if err := json.Unmarshal([]byte(view), &v); err != nil {
		s.t.Fatal(err)
	}
	p, _ := json.Marshal(map[string]any{
		"type": "view_submission", "user": map[string]any{"id": user, "team_id": s.team}, "team": map[string]any{"id": s.team},
		"view": map[string]any{"callback_id": v.View.CallbackID, "private_metadata": v.View.PrivateMetadata,
			"state": map[string]any{"values": map[string]any{"reason": map[string]any{"reason": map[string]any{"type": "plain_text_input", "value": reason}}}}},
	})
	return s.signed(s.h.url, "/integrations/slack/actions", url.Values{"payload": {string(p)}}, s.now(), s.secret)
}

func (s *slackStandin) command(user, text string) response {
	s.t.Helper()
	return s.signed(s.h.url, "/integrations/slack/commands", url.Values{"command": {"/airlock"}, "text": {text},
		"team_id": {s.team}, "user_id": {user}, "user_name": {"someone"}, "response_url": {s.responseURL()}}, s.now(), s.secret)
}

// slackMessage is the decision message's parts: its literal facts, the payload hash
// shown, the decision buttons' values and the page link.
type slackMessage struct {
	facts       map[string]string
	escaped     map[string]string // the facts as sent (Slack's escapes in place)
	payloadHash string
	buttons     map[string]string // action_id → value
	link        string
	raw         string
}

func parseSlackMessage(t *testing.T, body string) slackMessage {
	t.Helper()
	var sp struct {
		Mrkdwn *bool `json:"mrkdwn"`
		Blocks []struct {
			Type     string            `json:"type"`
			Fields   []json.RawMessage `json:"fields"`
			Elements []json.RawMessage `json:"elements"`
		} `json:"blocks"`
	}
	if err := json.Unmarshal([]byte(body), &sp); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	if sp.Mrkdwn == nil || *sp.Mrkdwn {
		t.Fatalf("the fallback text is not sent with mrkdwn off: %s", body)
	}
	type text struct {
		Type, Text, URL, ActionID, Value string
		Emoji                            *bool
	}
	read := func(raw json.RawMessage) text {
		var x struct {
			Type     string          `json:"type"`
			Text     json.RawMessage `json:"text"`
			URL      string          `json:"url"`
			ActionID string          `json:"action_id"`
			Value    string          `json:"value"`
			Emoji    *bool           `json:"emoji"`
		}
		_ = json.Unmarshal(raw, &x)
		out := text{Type: x.Type, URL: x.URL, ActionID: x.ActionID, Value: x.Value, Emoji: x.Emoji}
		if err := json.Unmarshal(x.Text, &out.Text); err != nil {
			var inner struct{ Text string }
			_ = json.Unmarshal(x.Text, &inner)
			out.Text = inner.Text
		}
		return out
	}
	unescape := strings.NewReplacer("&lt;", "<", "&gt;", ">", "&amp;", "&")
	m := slackMessage{facts: map[string]string{}, escaped: map[string]string{}, buttons: map[string]string{}, raw: body}
	pair := func(items []json.RawMessage, into func(label, value string)) {
		for i := 0; i+1 < len(items); i += 2 {
			l, v := read(items[i]), read(items[i+1])
			// A value is plain_text with emoji off: never formatted by Slack.
			if v.Type != "plain_text" || v.Emoji == nil || *v.Emoji {
				t.Fatalf("a value is not plain_text with emoji off: %s", items[i+1])
			}
			m.escaped[strings.Trim(l.Text, "*")] = v.Text
			into(strings.Trim(l.Text, "*"), unescape.Replace(v.Text))
		}
	}
	for _, b := range sp.Blocks {
		switch b.Type {
		case "section":
			pair(b.Fields, func(l, v string) { m.facts[l] = v })
		case "context":
			pair(b.Elements, func(l, v string) {
				if l == "Payload hash" {
					m.payloadHash = v
				}
			})
		case "actions":
			for _, e := range b.Elements {
				x := read(e)
				switch {
				case x.ActionID != "":
					m.buttons[x.ActionID] = x.Value
				case x.Text == "Open the approval":
					m.link = x.URL
				}
			}
		}
	}
	return m
}

// ephemeralText is the text of an ephemeral answer posted to a response_url.
func ephemeralText(t *testing.T, body string) string {
	t.Helper()
	var e struct {
		ResponseType    string `json:"response_type"`
		ReplaceOriginal bool   `json:"replace_original"`
		Text            string `json:"text"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.ResponseType != "ephemeral" || e.ReplaceOriginal {
		t.Fatalf("not an ephemeral answer: %s", body)
	}
	return e.Text
}

func (h *harness) approvalOf(key string) store.Approval {
	h.t.Helper()
	aps, err := h.env.Store.ApprovalsByRun(context.Background(), key)
	if err != nil || len(aps) == 0 {
		h.t.Fatalf("approvals of %s: %v %v", key, aps, err)
	}
	return aps[len(aps)-1]
}

// proposeSubject is propose with a subject the message shows (a log field).
func (h *harness) proposeSubject(key, requestedBy, subject string) {
	h.t.Helper()
	owner, v := h.claim(key)
	meta := ""
	if requestedBy != "" {
		meta = `,"meta":{"requested_by":"` + requestedBy + `"}`
	}
	sub, _ := json.Marshal(subject)
	r := h.post("/v1/runs/"+key+"/effects", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"action_type":"email","target":"default","payload":{"to":"ana@example.com","subject":%s,"text":"PRIVATE-DRAFT"}%s}`, owner, v, sub, meta))
	expect(h.t, r, 202, "")
	h.env.Approvals.WaitNotifications()
}

func (h *harness) linkSlack(team, user, name string) {
	h.t.Helper()
	u, err := h.env.Store.UserByName(context.Background(), name)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := linker(h.t, h.env.Store).Link(context.Background(), team, user, name, u.ID, "cli:test"); err != nil {
		h.t.Fatal(err)
	}
}

// TestSlackRequestsAreVerified: a forged signature, a stale timestamp and a replayed
// request (to this instance or another) are refused before anything in them is read,
// and decide nothing; without the slack section the routes say so.
func TestSlackRequestsAreVerified(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		expect(t, h.do("POST", "/integrations/slack/actions", "", "application/x-www-form-urlencoded", "payload=%7B%7D"), 404, "slack_not_configured")
		s := newSlackStandin(t, h)
		h.addUser("lead", "support-lead")
		h.linkSlack(s.team, "U1", "lead")
		h.proposeSubject("sv-1", "", "Refund")
		msg := parseSlackMessage(t, s.lastMessage())
		form := s.clickForm("U1", approvals.SlackActionApprove, msg.buttons[approvals.SlackActionApprove], s.responseURL())

		expect(t, s.signed(h.url, "/integrations/slack/actions", form, s.now(), "not-the-secret"), 401, "slack_signature_invalid")
		expect(t, s.send(h.url, "/integrations/slack/actions", form.Encode(), strconv.FormatInt(s.now(), 10), ""), 401, "slack_signature_invalid")
		expect(t, s.signed(h.url, "/integrations/slack/actions", form, s.now()-6*60, s.secret), 401, "slack_request_stale")
		expect(t, s.signed(h.url, "/integrations/slack/actions", form, s.now()+6*60, s.secret), 401, "slack_request_stale")
		// A body changed after signing (another approval's id) fails the signature.
		ts := strconv.FormatInt(s.now(), 10)
		mac := hmac.New(sha256.New, []byte(s.secret))
		fmt.Fprintf(mac, "v0:%s:%s", ts, form.Encode())
		sig := "v0=" + hex.EncodeToString(mac.Sum(nil))
		tampered := strings.Replace(form.Encode(), "U1", "U2", 1)
		expect(t, s.send(h.url, "/integrations/slack/actions", tampered, ts, sig), 401, "slack_signature_invalid")
		if a := h.approvalOf("sv-1"); a.ConsumedAt != nil {
			t.Fatalf("a refused request decided: %+v", a)
		}

		// The genuine request decides once; the same bytes again, here or at another
		// instance over the same database, are a replay.
		r := s.send(h.url, "/integrations/slack/actions", form.Encode(), ts, sig)
		expect(t, r, 200, "")
		expect(t, s.send(h.url, "/integrations/slack/actions", form.Encode(), ts, sig), 409, "slack_request_replayed")
		other := h.another(nil)
		expect(t, s.send(other, "/integrations/slack/actions", form.Encode(), ts, sig), 409, "slack_request_replayed")
		if a := h.approvalOf("sv-1"); a.Decision != approvals.Approve || a.ApproverSubject != "lead" {
			t.Fatalf("after the click: %+v", a)
		}
		// Neither the signing secret nor the bot token reaches the log or an event.
		evs, _ := h.env.Store.EventList(context.Background(), "sv-1", 0, 100)
		for _, leak := range []string{slackSecret, slackBotToken} {
			if strings.Contains(h.logs.String(), leak) || strings.Contains(fmt.Sprint(evs), leak) {
				t.Fatalf("a Slack secret leaked")
			}
		}
	})
}

// TestSlackDecisions walks the decision path from Slack: the message, an unlinked user,
// linking by a console code, wrong role, self-approval, approve, later clicks, reject
// with its modal, a re-issued approval's old buttons, expiry, and hostile text.
func TestSlackDecisions(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		s := newSlackStandin(t, h)
		h.addUser("lead", "support-lead")
		h.addUser("lead2", "support-lead")
		h.addUser("intern", "support")
		hostile := "<https://evil.example|Approve here> *urgent* @channel <!here> & :fire:"
		h.proposeSubject("sd-1", "lead", hostile)
		ap := h.approvalOf("sd-1")
		msg := parseSlackMessage(t, s.lastMessage())

		// The message: the card's facts (hostile text literal, in plain_text), the payload
		// hash, the buttons and the page. No token, no draft.
		if msg.facts["subject"] != hostile || msg.facts["Key"] != "sd-1" || msg.payloadHash != ap.PayloadHash ||
			msg.link != h.url+"/console/approvals/"+ap.ID || msg.buttons[approvals.SlackActionApprove] == "" || msg.buttons[approvals.SlackActionReject] == "" {
			t.Fatalf("message: %+v", msg)
		}
		if e := msg.escaped["subject"]; strings.ContainsAny(e, "<>") || !strings.Contains(e, "&lt;https://evil.example|Approve here&gt;") ||
			!strings.Contains(e, "&lt;!here&gt; &amp; :fire:") || strings.Contains(msg.raw, "PRIVATE-DRAFT") {
			t.Fatalf("hostile text is not escaped for Slack, or the draft is in the message: %q", e)
		}
		approve := msg.buttons[approvals.SlackActionApprove]

		// Unlinked: an ephemeral answer, nothing decided, whatever name the payload carries.
		ru := s.responseURL()
		expect(t, s.click("U9", approvals.SlackActionApprove, approve, ru), 200, "")
		if got := s.postsTo(ru); len(got) != 1 || !strings.Contains(ephemeralText(t, got[0]), "not linked") {
			t.Fatalf("unlinked click answered: %v", got)
		}

		// Linking: lead2 takes a code in the console and sends it in Slack.
		b := newBrowser(t)
		h.signIn(b, "lead2")
		_, page, _ := b.do("GET", h.url+"/console/slack", nil, nil)
		code, body, _ := b.do("POST", h.url+"/console/slack/code", url.Values{"csrf": {formToken(t, page)}}, nil)
		m := regexp.MustCompile(`/airlock link ([0-9A-F]{20})`).FindStringSubmatch(body)
		if code != 200 || m == nil {
			t.Fatalf("link code page: %d %s", code, body)
		}
		if _, err := h.env.Store.SlackCodeTake(context.Background(), m[1], nil); err != store.ErrNotFound {
			t.Fatalf("the raw link code is stored as the key: %v", err)
		}
		r := s.command("U2", "link "+m[1])
		expect(t, r, 200, "")
		if !strings.Contains(r.raw, "you are lead2") {
			t.Fatalf("link: %s", r.raw)
		}
		if r := s.command("U3", "link "+m[1]); !strings.Contains(r.raw, "unknown, used or expired") {
			t.Fatalf("a used code linked again: %s", r.raw)
		}
		if r := s.command("U2", "whoami"); !strings.Contains(r.raw, "lead2") || !strings.Contains(r.raw, "support-lead") {
			t.Fatalf("whoami: %s", r.raw)
		}
		h.linkSlack(s.team, "U1", "lead")
		h.linkSlack(s.team, "U7", "intern")

		// Wrong role, then self-approval (lead requested it): refused, said to the user alone.
		for user, want := range map[string]string{"U7": "not one of the approvers", "U1": "separation of duties"} {
			ru := s.responseURL()
			expect(t, s.click(user, approvals.SlackActionApprove, approve, ru), 200, "")
			if got := s.postsTo(ru); len(got) != 1 || !strings.Contains(strings.ToLower(ephemeralText(t, got[0])), want) {
				t.Fatalf("%s: %v", user, got)
			}
		}
		if a := h.approvalOf("sd-1"); a.ConsumedAt != nil {
			t.Fatal("a refused click decided")
		}

		// lead2 approves: the page's path — event actor, outbox entry — and the message is
		// replaced with the outcome.
		ru = s.responseURL()
		expect(t, s.click("U2", approvals.SlackActionApprove, approve, ru), 200, "")
		got := s.postsTo(ru)
		if len(got) != 1 || !strings.Contains(got[0], `"replace_original":true`) || !strings.Contains(got[0], "Approved") ||
			!strings.Contains(got[0], "lead2") || strings.Contains(got[0], approvals.SlackActionApprove) {
			t.Fatalf("outcome: %v", got)
		}
		e := h.lastEvent("sd-1", "approval_decided")
		var detail map[string]any
		_ = json.Unmarshal(e.Detail, &detail)
		if e.Actor != "person:lead2 via slack:T0AIRLOCK/U2" || detail["approver"] != "lead2" || detail["payload_hash"] != ap.PayloadHash {
			t.Fatalf("decided event: %s %s", e.Actor, e.Detail)
		}
		if e := h.lastEvent("sd-1", "effect_queued"); e.Actor != "person:lead2 via slack:T0AIRLOCK/U2" {
			t.Fatalf("queued event: %+v", e)
		}
		if run := h.get("/v1/runs/sd-1"); run.body["state"] != "approved" || len(run.body["effects"].([]any)) != 1 {
			t.Fatalf("run: %s", run.raw)
		}
		// A later click, in this copy or another: the outcome and "already decided by".
		ru = s.responseURL()
		expect(t, s.click("U2", approvals.SlackActionReject, msg.buttons[approvals.SlackActionReject], ru), 200, "")
		got = s.postsTo(ru)
		if len(got) != 2 || !strings.Contains(got[0], `"replace_original":true`) || !strings.Contains(ephemeralText(t, got[1]), "Already decided by lead2") {
			t.Fatalf("later click: %v", got)
		}
		if len(s.views) != 0 {
			t.Fatal("a decided approval opened a reject modal")
		}

		// Reject asks for a reason in a modal, then decides with it.
		h.proposeSubject("sd-2", "", "Second")
		msg2 := parseSlackMessage(t, s.lastMessage())
		ru = s.responseURL()
		expect(t, s.click("U1", approvals.SlackActionReject, msg2.buttons[approvals.SlackActionReject], ru), 200, "")
		if len(s.views) != 1 || !strings.Contains(s.views[0], `"trigger_id":"trig-U1"`) {
			t.Fatalf("views.open: %v", s.views)
		}
		if a := h.approvalOf("sd-2"); a.ConsumedAt != nil {
			t.Fatal("opening the modal decided")
		}
		if r := s.submit("U1", s.views[0], "  "); !strings.Contains(r.raw, "response_action") {
			t.Fatalf("an empty reason was taken: %s", r.raw)
		}
		// Someone else submitting lead's modal is still checked as themselves.
		if r := s.submit("U7", s.views[0], "mine"); !strings.Contains(r.raw, "not one of the approvers") {
			t.Fatalf("intern's submission: %s", r.raw)
		}
		r = s.submit("U1", s.views[0], "wrong customer <@U2> *now*")
		expect(t, r, 200, "")
		a2 := h.approvalOf("sd-2")
		if a2.Decision != approvals.Reject || a2.Reason != "wrong customer <@U2> *now*" || a2.ApproverSubject != "lead" {
			t.Fatalf("rejected: %+v", a2)
		}
		got = s.postsTo(ru)
		if len(got) != 1 || !strings.Contains(got[0], "Rejected") {
			t.Fatalf("reject outcome: %v", got)
		}
		if out := parseSlackMessage(t, got[0]); out.escaped["Reason"] != "wrong customer &lt;@U2&gt; *now*" || out.facts["Decided by"] != "lead" || len(out.buttons) != 0 {
			t.Fatalf("reject outcome: %+v", out)
		}
		if e := h.lastEvent("sd-2", "approval_decided"); e.Actor != "person:lead via slack:T0AIRLOCK/U1" {
			t.Fatalf("reject event: %+v", e)
		}

		// Re-issued: the old message's buttons are void; the new message's work.
		h.proposeSubject("sd-3", "", "Third")
		old := parseSlackMessage(t, s.lastMessage())
		a3 := h.approvalOf("sd-3")
		expect(t, h.do("POST", "/v1/approvals/"+a3.ID+"/reissue", h.operatorKey, "application/json", `{}`), 200, "")
		h.env.Approvals.WaitNotifications()
		fresh := parseSlackMessage(t, s.lastMessage())
		if fresh.buttons[approvals.SlackActionApprove] == old.buttons[approvals.SlackActionApprove] {
			t.Fatal("the re-issued message has the old buttons")
		}
		ru = s.responseURL()
		expect(t, s.click("U1", approvals.SlackActionApprove, old.buttons[approvals.SlackActionApprove], ru), 200, "")
		if got := s.postsTo(ru); len(got) != 1 || !strings.Contains(ephemeralText(t, got[0]), "re-issued") {
			t.Fatalf("old button: %v", got)
		}
		// A button whose payload hash is not the approval's decides nothing either.
		var forged approvals.SlackButton
		_ = json.Unmarshal([]byte(fresh.buttons[approvals.SlackActionApprove]), &forged)
		forged.PayloadHash = strings.Repeat("0", 64)
		fv, _ := json.Marshal(forged)
		ru = s.responseURL()
		expect(t, s.click("U1", approvals.SlackActionApprove, string(fv), ru), 200, "")
		if got := s.postsTo(ru); len(got) != 1 || !strings.Contains(ephemeralText(t, got[0]), "payload shown is not") {
			t.Fatalf("other payload hash: %v", got)
		}
		if a := h.approvalOf("sd-3"); a.ConsumedAt != nil {
			t.Fatal("a void button decided")
		}

		// A type that does not list slack is not decided in chat, whatever a button says
		// (whoever holds the webhook URL could post a message with crafted buttons).
		owner, v := h.claim("sd-5")
		expect(t, h.post("/v1/runs/sd-5/effects", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"action_type":"share_publicly","target":"default","payload":{"post":"x"}}`, owner, v)), 202, "")
		a5 := h.approvalOf("sd-5")
		crafted, _ := json.Marshal(approvals.SlackButton{ApprovalID: a5.ID, PayloadHash: a5.PayloadHash, Gen: approvals.ButtonGen(a5.TokenHash)})
		for _, action := range []string{approvals.SlackActionApprove, approvals.SlackActionReject} {
			ru = s.responseURL()
			expect(t, s.click("U1", action, string(crafted), ru), 200, "")
			if got := s.postsTo(ru); len(got) != 1 || !strings.Contains(ephemeralText(t, got[0]), "page only") {
				t.Fatalf("%s on a page-only type: %v", action, got)
			}
		}
		if a := h.approvalOf("sd-5"); a.ConsumedAt != nil || len(s.views) != 1 {
			t.Fatalf("a page-only type was decided in Slack, or asked for a reason: %+v, %d views", a, len(s.views))
		}

		// Expired: nothing decided.
		h.env.Clock.Advance(25 * time.Hour)
		ru = s.responseURL()
		expect(t, s.click("U1", approvals.SlackActionApprove, fresh.buttons[approvals.SlackActionApprove], ru), 200, "")
		if got := s.postsTo(ru); len(got) != 1 || !strings.Contains(ephemeralText(t, got[0]), "expired") {
			t.Fatalf("expired: %v", got)
		}
		if a := h.approvalOf("sd-3"); a.ConsumedAt != nil && a.Decision != "expired" {
			t.Fatalf("an expired approval was decided: %+v", a)
		}

		// A disabled account's link decides nothing.
		h.proposeSubject("sd-4", "", "Fourth")
		m4 := parseSlackMessage(t, s.lastMessage())
		if _, err := (accounts.Accounts{Store: h.env.Store, Actor: "cli:test"}).Disable(context.Background(), "lead"); err != nil {
			t.Fatal(err)
		}
		ru = s.responseURL()
		expect(t, s.click("U1", approvals.SlackActionApprove, m4.buttons[approvals.SlackActionApprove], ru), 200, "")
		if got := s.postsTo(ru); len(got) != 1 || !strings.Contains(ephemeralText(t, got[0]), "disabled") {
			t.Fatalf("disabled account: %v", got)
		}
		if strings.Contains(h.logs.String(), m[1]) {
			t.Fatal("the link code reached the log")
		}
	})
}

// TestSlackDoubleClick: two linked approvers click Approve on the same message at the
// same moment (a real race against the store): exactly one decision, one outbox entry;
// the other is told who decided.
func TestSlackDoubleClick(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		s := newSlackStandin(t, h)
		h.addUser("lead", "support-lead")
		h.addUser("lead2", "support-lead")
		h.linkSlack(s.team, "U1", "lead")
		h.linkSlack(s.team, "U2", "lead2")
		for round := range 3 {
			key := fmt.Sprintf("dc-%d", round)
			h.proposeSubject(key, "", "Race")
			value := parseSlackMessage(t, s.lastMessage()).buttons[approvals.SlackActionApprove]
			urls := []string{s.responseURL(), s.responseURL()}
			var wg sync.WaitGroup
			start := make(chan struct{})
			statuses := make([]int, 2)
			for i, user := range []string{"U1", "U2"} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					statuses[i] = s.click(user, approvals.SlackActionApprove, value, urls[i]).status
				}()
			}
			close(start)
			wg.Wait()
			if statuses[0] != 200 || statuses[1] != 200 {
				t.Fatalf("statuses %v", statuses)
			}
			evs, err := h.env.Store.EventList(context.Background(), key, 0, 100)
			if err != nil {
				t.Fatal(err)
			}
			decided, queued := 0, 0
			for _, e := range evs {
				decided += map[bool]int{true: 1}[e.Kind == "approval_decided"]
				queued += map[bool]int{true: 1}[e.Kind == "effect_queued"]
			}
			run := h.get("/v1/runs/" + key)
			if decided != 1 || queued != 1 || len(run.body["effects"].([]any)) != 1 {
				t.Fatalf("%s: %d decisions, %d queued, run %s", key, decided, queued, run.raw)
			}
			winner := h.approvalOf(key).ApproverSubject
			outcomes, already := 0, 0
			for _, u := range urls {
				for _, p := range s.postsTo(u) {
					if strings.Contains(p, `"replace_original":true`) {
						outcomes++
					} else if strings.Contains(ephemeralText(t, p), "Already decided by "+winner) {
						already++
					}
				}
			}
			if outcomes != 2 || already != 1 {
				t.Fatalf("%s: %d replaced messages (want both copies), %d 'already decided' answers", key, outcomes, already)
			}
		}
	})
}

// TestSlackEscalation: the escalation role decides from Slack only once the approval
// was escalated, as on the page; the escalation's own message carries the buttons.
func TestSlackEscalation(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		s := newSlackStandin(t, h)
		h.env.Policy.Action("email").Approval.Escalate = &policy.Escalate{After: policy.Duration(10 * time.Minute), Roles: []string{"support-manager"}}
		h.addUser("boss", "support-manager")
		h.linkSlack(s.team, "U4", "boss")
		h.proposeSubject("se-1", "", "Escalate me")
		value := parseSlackMessage(t, s.lastMessage()).buttons[approvals.SlackActionApprove]
		ru := s.responseURL()
		expect(t, s.click("U4", approvals.SlackActionApprove, value, ru), 200, "")
		if got := s.postsTo(ru); len(got) != 1 || !strings.Contains(ephemeralText(t, got[0]), "not one of the approvers") {
			t.Fatalf("before the escalation: %v", got)
		}
		h.env.Clock.Advance(11 * time.Minute)
		if err := h.env.Approvals.Sweep(context.Background()); err != nil {
			t.Fatal(err)
		}
		h.env.Approvals.WaitNotifications()
		escalated := parseSlackMessage(t, s.lastMessage())
		if !strings.Contains(escalated.raw, "Approval escalated") || escalated.buttons[approvals.SlackActionApprove] == "" {
			t.Fatalf("the escalation's message: %s", escalated.raw)
		}
		ru = s.responseURL()
		expect(t, s.click("U4", approvals.SlackActionApprove, escalated.buttons[approvals.SlackActionApprove], ru), 200, "")
		if a := h.approvalOf("se-1"); a.Decision != approvals.Approve || a.ApproverSubject != "boss" {
			t.Fatalf("after the escalation: %+v %v", a, s.postsTo(ru))
		}
	})
}

// TestSlackSingleSignOnPerson: a single sign-on person decides from Slack with the roles
// of their last sign-in, only if it was within a session's lifetime (12 hours).
func TestSlackSingleSignOnPerson(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		s := newSlackStandin(t, h)
		ctx := context.Background()
		if err := linker(t, h.env.Store).Link(ctx, s.team, "U8", "idp-7f3a", "", "cli:test"); err != nil {
			t.Fatal(err)
		}
		h.proposeSubject("ss-1", "", "SSO")
		value := parseSlackMessage(t, s.lastMessage()).buttons[approvals.SlackActionApprove]
		seen := h.env.Clock.Now().Add(-13 * time.Hour)
		if err := h.env.Store.PersonSeenPut(ctx, store.PersonSeen{Subject: "idp-7f3a", Roles: []string{"support-lead"}, SeenAt: seen}); err != nil {
			t.Fatal(err)
		}
		ru := s.responseURL()
		expect(t, s.click("U8", approvals.SlackActionApprove, value, ru), 200, "")
		if got := s.postsTo(ru); len(got) != 1 || !strings.Contains(ephemeralText(t, got[0]), "within the last 12 hours") {
			t.Fatalf("stale roles: %v", got)
		}
		if err := h.env.Store.PersonSeenPut(ctx, store.PersonSeen{Subject: "idp-7f3a", Roles: []string{"support-lead"}, SeenAt: h.env.Clock.Now()}); err != nil {
			t.Fatal(err)
		}
		ru = s.responseURL()
		expect(t, s.click("U8", approvals.SlackActionApprove, value, ru), 200, "")
		if a := h.approvalOf("ss-1"); a.Decision != approvals.Approve || a.ApproverSubject != "idp-7f3a" {
			t.Fatalf("fresh roles: %+v %v", a, s.postsTo(ru))
		}
	})
}

// linker is the Slack service the command line links accounts with: over the store alone.
func linker(t testing.TB, st store.Store) *slack.Service {
	s, err := slack.New(runs.Base{Store: st}, slack.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// lastEvent is the newest event of kind on key's run.
func (h *harness) lastEvent(key, kind string) store.Event {
	h.t.Helper()
	evs, err := h.env.Store.EventList(context.Background(), key, 0, 1000)
	if err != nil {
		h.t.Fatal(err)
	}
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Kind == kind {
			return evs[i]
		}
	}
	h.t.Fatalf("no %s event on %q", kind, key)
	return store.Event{}
}

var csrfField = regexp.MustCompile(`name="csrf" value="([0-9a-f]{64})"`)

// formToken reads the console's form token from a page of the person's own console.
func formToken(t *testing.T, page string) string {
	t.Helper()
	m := csrfField.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no form token on the page:\n%s", page)
	}
	return m[1]
}
