package approvals

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/store"
)

// Chat webhooks (policy notify.webhooks, named per action type by its notify list)
// announce an approval where people are: Slack or Microsoft Teams. A chat message is not
// a gate: it carries the card's summary and a link to the approval's page in the console
// (/console/approvals/{id}), where the person signs in and decides. It never carries the
// approval's token, and neither do the log lines about it; the webhook URL, a bearer
// secret, is never logged either.

// WebhookAttempts bounds the posts to one webhook for one approval; the waits between
// them start at Service.WebhookBackoff (default 1s) and double.
const WebhookAttempts = 4

// Card is what a notification says: the approval card's summary.
type Card struct {
	Title  string
	Key    string
	Action string
	// Approving says what approving does, in the card's words for its executor.
	Approving  string
	Target     string
	Recipients []string
	Fields     [][2]string // the payload's log_fields, in the policy's order
	Approvers  string
	Expires    time.Time
	Link       string // the console page of the approval: no token
	// SourceURL links the source record, as on the card (http or https, checked); "" for none.
	SourceURL string
}

// card builds r's summary. Only the payload's log_fields appear, never the model's
// output. The source link is the card's (SourceURL); if the events cannot be read the
// notification goes without it, and the log says so.
func (s *Service) card(ctx context.Context, r Requested, a *policy.Action, log *slog.Logger) Card {
	return s.cardOf(ctx, r.Approval, a, log)
}

// cardOf builds an approval's summary (see card).
func (s *Service) cardOf(ctx context.Context, ap store.Approval, a *policy.Action, log *slog.Logger) Card {
	c := Card{Title: "Approval needed: " + ap.ActionType, Key: ap.RunKey, Action: ap.ActionType, Approving: approving(ap, a),
		Target: ap.Target, Recipients: a.Recipients(ap.Target), Expires: ap.ExpiresAt.UTC(),
		Link: s.ConsoleURL(ap.ID)}
	var payload map[string]any
	_ = json.Unmarshal(ap.Payload, &payload)
	for _, f := range a.LogFields {
		if v, ok := payload[f]; ok {
			c.Fields = append(c.Fields, [2]string{f, fmt.Sprint(v)})
		}
	}
	var who []string
	for _, role := range ap.ApproverRoles {
		who = append(who, "role "+role)
	}
	who = append(who, ap.ApproverSubjects...)
	if ap.EscalatedAt != nil {
		for _, role := range ap.EscalationRoles {
			who = append(who, "role "+role+" (escalated)")
		}
	}
	c.Approvers = strings.Join(who, ", ")
	src, err := s.SourceURL(ctx, ap)
	if err != nil {
		log.Warn("approval notification without its source link", "key", ap.RunKey, "error", err)
	}
	c.SourceURL = src
	return c
}

// approving is what approving ap does, per executor (as the approval page's card says).
func approving(ap store.Approval, a *policy.Action) string {
	switch {
	case ap.Executor == store.ExecutorAgent:
		var call struct {
			Tool string `json:"tool"`
		}
		if json.Unmarshal(ap.Payload, &call) == nil && call.Tool != "" {
			return "lets the agent call " + call.Tool + " once, with the arguments on the card"
		}
		if len(bytes.TrimSpace(ap.Payload)) == 0 || string(bytes.TrimSpace(ap.Payload)) == "null" {
			return "lets the agent perform this action once (it sent no input to show)"
		}
		return "lets the agent perform this action once, with the input on the card"
	case ap.Executor == store.ExecutorWorker:
		return "queues this task for the worker, once"
	case a != nil && a.Kind().Approving != "":
		return a.Kind().Approving // the connector kind's words ("sends this email, once")
	}
	return "sends it, once"
}

func (c Card) facts() [][2]string {
	f := [][2]string{{"Key", c.Key}, {"Action", c.Action}}
	if c.Approving != "" {
		f = append(f, [2]string{"Approving", c.Approving})
	}
	f = append(f, [2]string{"Target", c.Target})
	if len(c.Recipients) > 0 {
		f = append(f, [2]string{"Recipients", strings.Join(c.Recipients, ", ")})
	}
	f = append(f, c.Fields...)
	if c.Approvers != "" {
		f = append(f, [2]string{"Who may approve", c.Approvers})
	}
	f = append(f, [2]string{"Expires", c.Expires.Format(time.RFC3339)})
	if c.SourceURL != "" {
		f = append(f, [2]string{"Source record", c.SourceURL})
	}
	return f
}

// slackEscape escapes Slack's three control characters (&, <, >), the only escapes Slack
// decodes.
var slackEscape = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;")

// Chat text is escaped for the chat's markup: a target, a key, a payload field (a
// subject, a reason, a model's draft) can hold "[Click here to approve](https://evil…)",
// "*urgent*" or a bare URL, and must arrive in the channel as the characters it is, never
// as a link or emphasis beside the real button. Only airlock's own words (the labels) are
// markup; every value is carried in a text object that the chat does not format.

// SlackPayload is a Slack incoming-webhook message: text (the notification's fallback)
// and Block Kit blocks — a header, the facts as fields, a button opening the page. Each
// fact is two fields: its label in mrkdwn (bold, airlock's words) and its value as
// plain_text with emoji off, which Slack shows unformatted: no *bold*, _italic_, ~strike~,
// `code`, > quote, <url|link>, @mention or :emoji:, and no link made of a bare URL
// (mrkdwn objects would auto-link one). The fallback text is sent with mrkdwn off and
// carries only the title, the key and the console link.
func SlackPayload(c Card) ([]byte, error) {
	text, blocks := slackBlocks(c, nil)
	return json.Marshal(map[string]any{"text": text, "mrkdwn": false, "blocks": blocks})
}

// slackBlocks are SlackPayload's fallback text and blocks; extra blocks (decision
// buttons: slackdecide.go) come before the link buttons.
func slackBlocks(c Card, extra []any) (string, []any) {
	var fields []map[string]any
	for _, f := range c.facts() {
		fields = append(fields,
			map[string]any{"type": "mrkdwn", "text": "*" + slackEscape.Replace(f[0]) + "*", "verbatim": true},
			map[string]any{"type": "plain_text", "text": slackEscape.Replace(orDash(f[1])), "emoji": false})
	}
	var blocks []any
	blocks = append(blocks, map[string]any{"type": "header", "text": map[string]any{"type": "plain_text", "text": c.Title, "emoji": false}})
	for len(fields) > 0 { // a section holds at most 10 fields: 5 facts
		n := min(len(fields), 10)
		blocks = append(blocks, map[string]any{"type": "section", "fields": fields[:n]})
		fields = fields[n:]
	}
	blocks = append(blocks, extra...)
	buttons := []any{map[string]any{"type": "button", "text": map[string]any{"type": "plain_text", "text": "Open the approval"}, "url": c.Link}}
	if c.SourceURL != "" {
		buttons = append(buttons, map[string]any{"type": "button", "text": map[string]any{"type": "plain_text", "text": "Open the source record"}, "url": c.SourceURL})
	}
	blocks = append(blocks, map[string]any{"type": "actions", "elements": buttons})
	return slackEscape.Replace(c.Title + " for " + c.Key + ": " + c.Link), blocks
}

// orDash is v, or "-" for an empty value (a text object must not be empty).
func orDash(v string) string {
	if v == "" {
		return "-"
	}
	return v
}

// TeamsPayload is a Microsoft Teams incoming-webhook message (Workflows' "post to a
// channel when a webhook request is received" and the classic connector both take it):
// one Adaptive Card with the title, the facts and an Action.OpenUrl to the page. Teams
// renders Markdown — links included — in TextBlock and in a FactSet's titles and values,
// so values are not put there: each fact is a RichTextBlock of two TextRuns (the label
// bold, the value plain), and a TextRun is never Markdown. The title, airlock's words
// and the action type's name, is a TextBlock with every Markdown character escaped
// (TeamsEscape).
func TeamsPayload(c Card) ([]byte, error) {
	body := []any{map[string]any{"type": "TextBlock", "text": TeamsEscape(c.Title), "weight": "Bolder", "size": "Medium", "wrap": true}}
	for _, f := range c.facts() {
		body = append(body, map[string]any{"type": "RichTextBlock", "inlines": []any{
			map[string]any{"type": "TextRun", "text": f[0] + ": ", "weight": "Bolder"},
			map[string]any{"type": "TextRun", "text": orDash(f[1])},
		}})
	}
	actions := []any{map[string]any{"type": "Action.OpenUrl", "title": "Open the approval", "url": c.Link}}
	if c.SourceURL != "" {
		actions = append(actions, map[string]any{"type": "Action.OpenUrl", "title": "Open the source record", "url": c.SourceURL})
	}
	card := map[string]any{
		"$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
		"type":    "AdaptiveCard",
		"version": "1.4",
		"body":    body,
		"actions": actions,
	}
	return json.Marshal(map[string]any{
		"type": "message",
		"attachments": []any{map[string]any{
			"contentType": "application/vnd.microsoft.card.adaptive", "contentUrl": nil, "content": card}},
	})
}

// teamsMarkdown are the characters Adaptive Cards' Markdown gives a meaning to (emphasis,
// links, lists, headings, code, HTML-like tags) and the backslash itself.
const teamsMarkdown = "\\`*_{}[]()#+-.!|<>~:"

// TeamsEscape makes s literal in a Teams TextBlock: each Markdown character gets a
// backslash (CommonMark's escape), so "[x](https://e.example)" shows as those
// characters and "https://e.example" as text ("\:" and "\." break the auto-link).
func TeamsEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r < 0x80 && strings.ContainsRune(teamsMarkdown, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// notifyWebhooks posts the card c to each webhook its action type names, each in its own
// goroutine (retries wait; the request that opened the approval does not).
func (s *Service) notifyWebhooks(ctx context.Context, c Card, ap store.Approval, a *policy.Action, log *slog.Logger) {
	for _, name := range a.Notify {
		w := s.Policy.Notify.Webhooks[name]
		if w == nil || w.URL == "" {
			continue
		}
		s.webhooks.Add(1)
		go func() {
			defer s.webhooks.Done()
			s.postWebhook(context.WithoutCancel(ctx), w, c, ap, a, log)
		}()
	}
}

// WaitNotifications waits for the webhook posts under way (tests, shutdown).
func (s *Service) WaitNotifications() { s.webhooks.Wait() }

func (s *Service) postWebhook(ctx context.Context, w *policy.Webhook, c Card, ap store.Approval, a *policy.Action, log *slog.Logger) {
	build := SlackPayload
	switch {
	case w.Format == policy.WebhookTeams:
		build = TeamsPayload // Teams keeps the link-out card
	case a.DecidesIn(policy.DecideInSlack) && ap.Mode != ModeReview && !slices.Equal(ap.AllowedDecisions, []string{Cancel}):
		build = func(c Card) ([]byte, error) { return SlackDecisionPayload(c, ap) }
	}
	body, err := build(c)
	if err != nil {
		log.Warn("approval webhook not sent", "webhook", w.Name, "key", c.Key, "reason", "payload", "error", err)
		return
	}
	backoff := s.WebhookBackoff
	if backoff <= 0 {
		backoff = time.Second
	}
	for attempt := 1; ; attempt++ {
		status, retry := s.postOnce(ctx, w.URL, body)
		if status/100 == 2 {
			log.Info("approval webhook sent", "webhook", w.Name, "format", w.Format, "key", c.Key, "attempt", attempt)
			return
		}
		reason := fmt.Sprintf("status %d", status)
		if status == 0 {
			reason = "transport error" // the error names the URL: not logged
		}
		if !retry || attempt == WebhookAttempts {
			log.Warn("approval webhook not sent", "webhook", w.Name, "format", w.Format, "key", c.Key,
				"attempts", attempt, "reason", reason)
			return
		}
		log.Info("approval webhook retried", "webhook", w.Name, "key", c.Key, "attempt", attempt, "reason", reason, "wait", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff *= 2
	}
}

// postOnce posts body and says whether another try may succeed: after a transport
// error, a 429 or a 5xx; not after any other refusal.
func (s *Service) postOnce(ctx context.Context, hook string, body []byte) (status int, retry bool) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, hook, bytes.NewReader(body))
	if err != nil {
		return 0, false
	}
	req.Header.Set("Content-Type", "application/json")
	client := s.WebhookClient
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, true
	}
	resp.Body.Close()
	return resp.StatusCode, resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500
}
