package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/policy"
)

// receiver is a chat service's incoming webhook: it keeps every body posted to it and
// answers with the statuses given, then 200.
type receiver struct {
	*httptest.Server
	mu       sync.Mutex
	bodies   []string
	statuses []int
}

func newReceiver(t *testing.T, statuses ...int) *receiver {
	r := &receiver{statuses: statuses}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		defer r.mu.Unlock()
		if req.Method != http.MethodPost || req.Header.Get("Content-Type") != "application/json" {
			t.Errorf("webhook got %s with Content-Type %q", req.Method, req.Header.Get("Content-Type"))
		}
		r.bodies = append(r.bodies, string(b))
		status := http.StatusOK
		if len(r.statuses) > 0 {
			status, r.statuses = r.statuses[0], r.statuses[1:]
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *receiver) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.bodies...)
}

// TestApprovalWebhooks announces an approval on a Slack and a Teams webhook named by its
// action type: each gets its format's payload with the card's summary and the console
// link — no token, no model output —, a 503 is retried, a 400 is not, and neither the
// token nor a webhook URL reaches the log.
func TestApprovalWebhooks(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		slack := newReceiver(t, http.StatusServiceUnavailable) // then 200: retried
		teams := newReceiver(t)
		refusing := newReceiver(t, http.StatusBadRequest, http.StatusBadRequest)
		const secretPath = "/services/T000/B000/SECRET-PATH-xyz"
		h.env.Policy.Notify.Webhooks = map[string]*policy.Webhook{
			"support-slack": {Name: "support-slack", Format: policy.WebhookSlack, URL: slack.URL + secretPath},
			"support-teams": {Name: "support-teams", Format: policy.WebhookTeams, URL: teams.URL + secretPath},
			"broken":        {Name: "broken", Format: policy.WebhookSlack, URL: refusing.URL + secretPath},
			"unused":        {Name: "unused", Format: policy.WebhookTeams, URL: teams.URL + "/unused"},
		}
		email := h.env.Policy.Action("email")
		email.Notify = []string{"support-slack", "support-teams", "broken"}
		email.LogFields = []string{"subject"}
		h.env.Approvals.WebhookBackoff = 5 * time.Millisecond
		owner, v := h.claim("w-1")
		r := h.post("/v1/runs/w-1/effects", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"action_type":"email","target":"default","payload":{"subject":"Refund <42> & more","text":"PRIVATE-DRAFT-TEXT"}}`, owner, v))
		expect(t, r, 202, "")
		h.env.Approvals.WaitNotifications()
		approveURL := r.body["approve_url"].(string)
		token := approveURL[strings.LastIndex(approveURL, "/")+1:]
		aps, err := h.env.Store.ApprovalsByRun(context.Background(), "w-1")
		if err != nil || len(aps) != 1 {
			t.Fatal(aps, err)
		}
		link := strings.SplitN(approveURL, "/approve/", 2)[0] + "/console/approvals/" + aps[0].ID

		for name, bodies := range map[string][]string{"slack": slack.got(), "teams": teams.got(), "broken": refusing.got()} {
			for _, b := range bodies {
				if strings.Contains(b, token) || strings.Contains(b, "PRIVATE-DRAFT-TEXT") {
					t.Fatalf("%s payload carries the token or the draft: %s", name, b)
				}
			}
		}
		if n := len(slack.got()); n != 2 {
			t.Fatalf("slack got %d posts, want 2 (a 503, then the retry)", n)
		}
		if n := len(refusing.got()); n != 1 {
			t.Fatalf("a webhook answering 400 got %d posts, want 1 (not retried)", n)
		}
		if n := len(teams.got()); n != 1 {
			t.Fatalf("teams got %d posts, want 1 (an unused webhook gets nothing)", n)
		}

		// What each chat shows as literal text (Slack's plain_text, Teams' TextRun), by
		// label; and nothing from the request in a text that the chat formats.
		slackFacts, teamsFacts := slackLiteral(t, slack.got()[1], link), teamsLiteral(t, teams.got()[0], link)
		for name, facts := range map[string]map[string]string{"slack": slackFacts, "teams": teamsFacts} {
			if facts["Key"] != "w-1" || facts["subject"] != "Refund <42> & more" || facts["Action"] != "email" || facts["Approving"] != "sends this request, once" ||
				facts["Expires"] == "" || !strings.HasPrefix(facts["Who may approve"], "role ") {
				t.Fatalf("%s facts: %v", name, facts)
			}
		}
		logs := h.logs.String()
		if strings.Contains(logs, token) || strings.Contains(logs, "SECRET-PATH") {
			t.Fatal("the token or a webhook URL reached the log")
		}
		for _, want := range []string{`"webhook":"support-slack"`, "approval webhook retried", `"webhook":"broken"`, "status 400"} {
			if !strings.Contains(logs, want) {
				t.Errorf("the log lacks %s", want)
			}
		}
	})
}

// TestWebhookPolicy: a webhook is named, has a known format and an http(s) URL from the
// environment or a file; an action type names only defined ones.
func TestWebhookPolicy(t *testing.T) {
	env := func(k string) (string, bool) {
		v, ok := map[string]string{"SLACK_HOOK": "https://hooks.slack.com/services/x", "BAD_HOOK": "ftp://x"}[k]
		return v, ok
	}
	base := "actions:\n  refund:\n    connector: http\n    http: {url: \"http://127.0.0.1:1/\"}\n    approvers: {roles: [finance]}\n    notify: [%s]\nnotify:\n  webhooks:\n%s"
	tests := []struct {
		notify, hooks, err string
	}{
		{"finance", "    finance: {format: slack, url_env: SLACK_HOOK}\n", ""},
		{"finance", "    finance: {url_env: SLACK_HOOK}\n", ""},
		{"finance", "    finance: {format: teams, url_env: SLACK_HOOK}\n", ""},
		{"finance", "    finance: {format: discord, url_env: SLACK_HOOK}\n", "notify.webhooks.finance.format"},
		{"finance", "    finance: {format: slack}\n", "needs url_env or url_file"},
		{"finance", "    finance: {url_env: BAD_HOOK}\n", "notify.webhooks.finance.url"},
		{"other", "    finance: {url_env: SLACK_HOOK}\n", `actions.refund.notify: names "other"`},
	}
	for _, tt := range tests {
		p, err := policy.Parse([]byte(fmt.Sprintf(base, tt.notify, tt.hooks)), env)
		if tt.err == "" {
			if err != nil {
				t.Errorf("%s: %v", tt.hooks, err)
			} else if w := p.Notify.Webhooks["finance"]; w.URL != "https://hooks.slack.com/services/x" || (w.Format != "slack" && w.Format != "teams") {
				t.Errorf("%s: %+v", tt.hooks, w)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.err) {
			t.Errorf("%s: error %v, want %q", tt.hooks, err, tt.err)
		}
	}
}

// slackFacts decodes a Slack payload: the title in a plain_text header, the facts as
// pairs of fields (the label in mrkdwn, the value plain_text with emoji off, &<> escaped),
// the fallback text with mrkdwn off, one button to link. It returns the values by label,
// unescaped, and fails if a value sits in a mrkdwn object.
func slackLiteral(t *testing.T, body, link string) map[string]string {
	t.Helper()
	var sp struct {
		Text   string `json:"text"`
		Mrkdwn *bool  `json:"mrkdwn"`
		Blocks []struct {
			Type string `json:"type"`
			Text *struct {
				Type, Text string
				Emoji      *bool `json:"emoji"`
			} `json:"text"`
			Fields []struct {
				Type, Text string
				Emoji      *bool `json:"emoji"`
				Verbatim   bool  `json:"verbatim"`
			} `json:"fields"`
			Elements []struct {
				Type string
				Text struct{ Type, Text string }
				URL  string `json:"url"`
			} `json:"elements"`
		} `json:"blocks"`
	}
	if err := json.Unmarshal([]byte(body), &sp); err != nil {
		t.Fatal(err)
	}
	if sp.Mrkdwn == nil || *sp.Mrkdwn || !strings.Contains(sp.Text, link) || len(sp.Blocks) < 3 || sp.Blocks[0].Type != "header" ||
		sp.Blocks[0].Text.Type != "plain_text" || sp.Blocks[len(sp.Blocks)-1].Type != "actions" {
		t.Fatalf("slack payload: %s", body)
	}
	unescape := strings.NewReplacer("&lt;", "<", "&gt;", ">", "&amp;", "&")
	facts := map[string]string{}
	for _, b := range sp.Blocks[1 : len(sp.Blocks)-1] {
		if b.Type != "section" || len(b.Fields)%2 != 0 {
			t.Fatalf("slack block %+v", b)
		}
		for i := 0; i < len(b.Fields); i += 2 {
			label, value := b.Fields[i], b.Fields[i+1]
			if label.Type != "mrkdwn" || !label.Verbatim || value.Type != "plain_text" || value.Emoji == nil || *value.Emoji {
				t.Fatalf("slack fact %+v %+v: want a verbatim mrkdwn label and a plain_text value without emoji", label, value)
			}
			if strings.ContainsAny(value.Text, "<>") {
				t.Fatalf("slack value %q holds a control character unescaped", value.Text)
			}
			facts[strings.Trim(label.Text, "*")] = unescape.Replace(value.Text)
		}
	}
	if b := sp.Blocks[len(sp.Blocks)-1].Elements; len(b) < 1 || b[0].Type != "button" || b[0].URL != link {
		t.Fatalf("slack button: %+v, want the link %s", b, link)
	}
	return facts
}

// teamsLiteral decodes a Teams payload: one Adaptive Card whose first body element is
// the title TextBlock and whose facts are RichTextBlocks of two TextRuns (a TextRun is
// never Markdown). It returns the values by label; no FactSet, and no TextBlock besides
// the title, may appear.
func teamsLiteral(t *testing.T, body, link string) map[string]string {
	t.Helper()
	var tp struct {
		Type        string `json:"type"`
		Attachments []struct {
			ContentType string `json:"contentType"`
			Content     struct {
				Type    string `json:"type"`
				Version string `json:"version"`
				Body    []struct {
					Type    string `json:"type"`
					Text    string `json:"text"`
					Inlines []struct {
						Type, Text string
					} `json:"inlines"`
				} `json:"body"`
				Actions []struct {
					Type, Title string
					URL         string `json:"url"`
				} `json:"actions"`
			} `json:"content"`
		} `json:"attachments"`
	}
	if err := json.Unmarshal([]byte(body), &tp); err != nil {
		t.Fatal(err)
	}
	if tp.Type != "message" || len(tp.Attachments) != 1 || tp.Attachments[0].ContentType != "application/vnd.microsoft.card.adaptive" {
		t.Fatalf("teams payload: %s", body)
	}
	c := tp.Attachments[0].Content
	if c.Type != "AdaptiveCard" || c.Version == "" || len(c.Body) < 2 || c.Body[0].Type != "TextBlock" || !strings.HasPrefix(c.Body[0].Text, "Approval") {
		t.Fatalf("teams card: %s", body)
	}
	facts := map[string]string{}
	for _, b := range c.Body[1:] {
		if b.Type != "RichTextBlock" || len(b.Inlines) != 2 || b.Inlines[0].Type != "TextRun" || b.Inlines[1].Type != "TextRun" {
			t.Fatalf("teams fact %+v: want a RichTextBlock of two TextRuns", b)
		}
		facts[strings.TrimSuffix(b.Inlines[0].Text, ": ")] = b.Inlines[1].Text
	}
	if len(c.Actions) < 1 || c.Actions[0].Type != "Action.OpenUrl" || c.Actions[0].URL != link {
		t.Fatalf("teams action: %+v, want the link %s", c.Actions, link)
	}
	return facts
}

// Issue 33 item 3: Teams carried payload and target text into Adaptive Card facts, where
// Teams renders Markdown ("[Click here to approve](https://evil…)" became a link beside
// the real button); Slack auto-linked bare URLs and rendered *bold* and ~strike~. Hostile
// payload fields (a subject, a reason), a key and a target arrive in both formats as
// literal text, on both stores.
func TestChatTextArrivesLiteral(t *testing.T) {
	hostile := []string{
		"[Click here to approve](https://evil.example/approve)",
		"*URGENT* ~do not~ _read_ `this` > quoted",
		"https://evil.example/bare and www.evil.example",
		"<https://evil.example|Open the approval> <!channel> <@U123> &lt;b&gt; :white_check_mark:",
		"# Approved ![x](https://evil.example/p.png) **done** | a | b |",
	}
	forEachBackend(t, func(t *testing.T, h *harness) {
		slack, teams := newReceiver(t), newReceiver(t)
		h.env.Policy.Notify.Webhooks = map[string]*policy.Webhook{
			"s": {Name: "s", Format: policy.WebhookSlack, URL: slack.URL},
			"t": {Name: "t", Format: policy.WebhookTeams, URL: teams.URL},
		}
		email := h.env.Policy.Action("email")
		email.Notify = []string{"s", "t"}
		email.LogFields = []string{"subject", "reason"}
		for i, text := range hostile {
			key := fmt.Sprintf("chat_~%d~", i)
			owner, v := h.claim(key)
			body, _ := json.Marshal(map[string]any{"lease_owner": owner, "version": v, "action_type": "email", "target": "default",
				"payload": map[string]any{"subject": text, "reason": "because " + text}})
			r := h.post("/v1/runs/"+key+"/effects", string(body))
			expect(t, r, 202, "")
			h.env.Approvals.WaitNotifications()
			aps, err := h.env.Store.ApprovalsByRun(context.Background(), key)
			if err != nil || len(aps) != 1 {
				t.Fatal(aps, err)
			}
			link := strings.SplitN(r.body["approve_url"].(string), "/approve/", 2)[0] + "/console/approvals/" + aps[0].ID
			for name, facts := range map[string]map[string]string{
				"slack": slackLiteral(t, slack.got()[i], link), "teams": teamsLiteral(t, teams.got()[i], link)} {
				if facts["subject"] != text || facts["reason"] != "because "+text || facts["Key"] != key || facts["Target"] != "default" {
					t.Errorf("%s: the values are not the literal text: %q", name, facts)
				}
			}
		}
	})
}
