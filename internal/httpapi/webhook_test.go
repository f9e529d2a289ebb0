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

		var sp struct {
			Text   string `json:"text"`
			Blocks []struct {
				Type string `json:"type"`
				Text *struct {
					Type, Text string
				} `json:"text"`
				Fields []struct {
					Type, Text string
				} `json:"fields"`
				Elements []struct {
					Type string
					Text struct{ Type, Text string }
					URL  string `json:"url"`
				} `json:"elements"`
			} `json:"blocks"`
		}
		if err := json.Unmarshal([]byte(slack.got()[1]), &sp); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(sp.Text, "Approval needed: email for w-1") || !strings.Contains(sp.Text, "<"+link+"|open>") ||
			len(sp.Blocks) != 3 || sp.Blocks[0].Type != "header" || sp.Blocks[1].Type != "section" || sp.Blocks[2].Type != "actions" {
			t.Fatalf("slack payload: %s", slack.got()[1])
		}
		fields := ""
		for _, f := range sp.Blocks[1].Fields {
			if f.Type != "mrkdwn" {
				t.Fatalf("slack field type %q", f.Type)
			}
			fields += f.Text + "\n"
		}
		for _, want := range []string{"*Key*\nw-1", "*Action*\nemail", "*subject*\nRefund &lt;42&gt; &amp; more", "*Who may approve*\nrole ", "*Expires*\n"} {
			if !strings.Contains(fields, want) {
				t.Errorf("slack fields lack %q:\n%s", want, fields)
			}
		}
		if b := sp.Blocks[2].Elements; len(b) != 1 || b[0].Type != "button" || b[0].URL != link {
			t.Fatalf("slack button: %+v, want the link %s", b, link)
		}

		var tp struct {
			Type        string `json:"type"`
			Attachments []struct {
				ContentType string `json:"contentType"`
				Content     struct {
					Type    string `json:"type"`
					Version string `json:"version"`
					Body    []struct {
						Type  string `json:"type"`
						Text  string `json:"text"`
						Facts []struct{ Title, Value string }
					} `json:"body"`
					Actions []struct {
						Type, Title string
						URL         string `json:"url"`
					} `json:"actions"`
				} `json:"content"`
			} `json:"attachments"`
		}
		if err := json.Unmarshal([]byte(teams.got()[0]), &tp); err != nil {
			t.Fatal(err)
		}
		if tp.Type != "message" || len(tp.Attachments) != 1 || tp.Attachments[0].ContentType != "application/vnd.microsoft.card.adaptive" {
			t.Fatalf("teams payload: %s", teams.got()[0])
		}
		c := tp.Attachments[0].Content
		if c.Type != "AdaptiveCard" || c.Version == "" || len(c.Body) != 2 || c.Body[0].Type != "TextBlock" ||
			c.Body[0].Text != "Approval needed: email" || c.Body[1].Type != "FactSet" {
			t.Fatalf("teams card: %s", teams.got()[0])
		}
		facts := map[string]string{}
		for _, f := range c.Body[1].Facts {
			facts[f.Title] = f.Value
		}
		if facts["Key"] != "w-1" || facts["subject"] != "Refund <42> & more" || facts["Action"] != "email" || facts["Expires"] == "" {
			t.Fatalf("teams facts: %v", facts)
		}
		if len(c.Actions) != 1 || c.Actions[0].Type != "Action.OpenUrl" || c.Actions[0].URL != link {
			t.Fatalf("teams action: %+v, want the link %s", c.Actions, link)
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
