package httpapi_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/airlockhq/airlock/internal/policy"
)

// TestNotificationsCarryTheSourceRecord: every approval notification — the Slack and
// Teams webhooks and the plain notify.webhook_url card — carries the source record's link
// the card shows (the latest meta.source_url up to the request: the claim's, or the
// effect's over it), as a fact and a second button on Slack and Teams; none without
// one; never the token, in the payloads or the log. Both stores.
func TestNotificationsCarryTheSourceRecord(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		slack, teams := newReceiver(t), newReceiver(t)
		var mu sync.Mutex
		plain := map[string]string{} // the plain card's text, by run key
		hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			var card struct{ Text string }
			if err := json.Unmarshal(b, &card); err != nil {
				t.Errorf("plain card: %v: %s", err, b)
			}
			mu.Lock()
			defer mu.Unlock()
			for _, k := range []string{"s-1", "s-2", "s-3"} {
				if strings.Contains(card.Text, " for "+k+" ") {
					plain[k] = card.Text
				}
			}
		}))
		defer hook.Close()
		h.env.Policy.Notify.WebhookURL = hook.URL
		h.env.Policy.Notify.Webhooks = map[string]*policy.Webhook{
			"s": {Name: "s", Format: policy.WebhookSlack, URL: slack.URL + "/hook"},
			"t": {Name: "t", Format: policy.WebhookTeams, URL: teams.URL + "/hook"},
		}
		h.env.Policy.Action("email").Notify = []string{"s", "t"}
		const fromClaim = "https://support.example.com/tickets/4711?view=full&tab=2"
		const fromEffect = "https://crm.example.com/cases/9"
		var tokens []string
		ask := func(key, claimMeta, effectMeta string) {
			t.Helper()
			r := h.post("/v1/runs/claim", `{"key":"`+key+`","payload":{"ticket":42}`+claimMeta+`}`)
			expect(t, r, 201, "")
			owner, v := r.body["lease_owner"].(string), int64(r.body["version"].(float64))
			r = h.post("/v1/runs/"+key+"/effects", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"action_type":"email","target":"default","payload":{"to":"ana@example.com","text":"PRIVATE"}%s}`, owner, v, effectMeta))
			expect(t, r, 202, "")
			u := r.body["approve_url"].(string)
			tokens = append(tokens, u[strings.LastIndex(u, "/")+1:])
		}
		ask("s-1", `,"meta":{"source_url":"`+fromClaim+`"}`, "")
		ask("s-2", `,"meta":{"source_url":"`+fromClaim+`"}`, `,"meta":{"source_url":"`+fromEffect+`"}`)
		ask("s-3", "", "")
		h.env.Approvals.WaitNotifications()
		want := map[string]string{"s-1": fromClaim, "s-2": fromEffect, "s-3": ""}

		type button struct {
			Text struct{ Text string }
			URL  string `json:"url"`
		}
		for _, b := range slack.got() {
			var sp struct {
				Text   string
				Blocks []struct {
					Type     string
					Fields   []struct{ Text string }
					Elements []button
				}
			}
			if err := json.Unmarshal([]byte(b), &sp); err != nil {
				t.Fatal(err)
			}
			key := strings.TrimSuffix(strings.Fields(strings.SplitN(sp.Text, " for ", 2)[1])[0], ":")
			src, fields := want[key], ""
			var buttons []button
			for _, bl := range sp.Blocks {
				for _, f := range bl.Fields {
					fields += f.Text + "\n"
				}
				buttons = append(buttons, bl.Elements...)
			}
			if src == "" {
				if strings.Contains(fields, "Source record") || len(buttons) != 1 || strings.Contains(sp.Text, "source") {
					t.Errorf("slack %s, given no source, shows one: %s", key, b)
				}
				continue
			}
			escaped := strings.ReplaceAll(src, "&", "&amp;")
			// The value is plain_text beside its bold label (never mrkdwn: no link is made of
			// it); the fallback text carries only the title, the key and the console link.
			if !strings.Contains(fields, "*Source record*\n"+escaped) || strings.Contains(sp.Text, src) {
				t.Errorf("slack %s lacks the source record %s: %s", key, src, b)
			}
			if len(buttons) != 2 || buttons[1].URL != src || buttons[1].Text.Text != "Open the source record" {
				t.Errorf("slack %s buttons %+v, want the approval and %s", key, buttons, src)
			}
		}
		for _, b := range teams.got() {
			var tp struct {
				Attachments []struct {
					Content struct {
						Body []struct {
							Type    string
							Inlines []struct{ Text string }
						}
						Actions []struct {
							Type, Title string
							URL         string `json:"url"`
						}
					}
				}
			}
			if err := json.Unmarshal([]byte(b), &tp); err != nil || len(tp.Attachments) != 1 {
				t.Fatal(err, b)
			}
			c := tp.Attachments[0].Content
			facts := map[string]string{} // each fact a RichTextBlock: "Label: " then the value
			for _, bl := range c.Body {
				if bl.Type == "RichTextBlock" && len(bl.Inlines) == 2 {
					facts[strings.TrimSuffix(bl.Inlines[0].Text, ": ")] = bl.Inlines[1].Text
				}
			}
			src := want[facts["Key"]]
			if facts["Source record"] != src {
				t.Errorf("teams %s: source record %q, want %q", facts["Key"], facts["Source record"], src)
			}
			if src == "" && len(c.Actions) != 1 || src != "" && (len(c.Actions) != 2 || c.Actions[1].URL != src || c.Actions[1].Type != "Action.OpenUrl") {
				t.Errorf("teams %s actions %+v, want the approval and %q", facts["Key"], c.Actions, src)
			}
		}
		if len(slack.got()) != 3 || len(teams.got()) != 3 {
			t.Fatalf("%d slack and %d teams posts, want 3 each", len(slack.got()), len(teams.got()))
		}
		// The plain card is posted before the API answers (after the commit, in the request).
		mu.Lock()
		defer mu.Unlock()
		for key, src := range want {
			text, ok := plain[key]
			switch {
			case !ok:
				t.Errorf("no plain card for %s", key)
			case src == "" && strings.Contains(text, "source record"):
				t.Errorf("the plain card of %s shows a source record: %q", key, text)
			case src != "" && !strings.Contains(text, "\nsource record: "+src+"\n"):
				t.Errorf("the plain card of %s lacks %s: %q", key, src, text)
			}
		}
		all := strings.Join(append(slack.got(), teams.got()...), "\n") + h.logs.String()
		for _, tok := range tokens {
			if strings.Contains(all, tok) {
				t.Fatal("a token reached a chat payload or the log")
			}
		}
		if strings.Contains(all, "PRIVATE") {
			t.Fatal("the draft reached a chat payload or the log")
		}
	})
}
