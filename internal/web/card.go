package web

import (
	"bytes"
	"encoding/json"
	"maps"
	"net/url"
	"slices"
	"strings"

	"golang.org/x/net/html"

	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/store"
)

// effectCard is the proposed effect as the person at the gate reads it: what the
// connector will carry, field by field. Every renderer fills this one shape and one
// template (approval.html's "effect" block) shows it; values are text, escaped by
// html/template, never markup.
type effectCard struct {
	Heading string
	// Approve is the approve button's words for this executor: "Approve and send" for
	// what airlock's dispatcher sends, "Approve" for what a worker or an agent performs.
	Approve string
	// Empty, when set, says plainly that there is nothing to show (an agent's plan sent
	// without its input): the person approves an action they cannot read.
	Empty  string
	Fields []cardField
	// Bodies are long texts (an email's text, an HTTP body, an argument), each shown
	// in a pre-wrapped block.
	Bodies []cardField
}

// cardField is one labelled value; Note is a short remark above it; Code shows it as
// code (a name or an id, not prose).
type cardField struct {
	Label, Value, Note string
	Code               bool
}

// cardRenderer renders an approval's payload for one connector kind; ok is false when
// the payload does not read as that kind (the card then shows the JSON as it is).
type cardRenderer interface {
	render(a store.Approval, act *policy.Action) (card effectCard, ok bool)
}

// cardRenderers are the renderers by connector kind (policy.Connector*); an agent's
// effect (an MCP tool call or a client's plan) has its own.
var cardRenderers = map[string]cardRenderer{
	policy.ConnectorSMTP:   emailCard{},
	policy.ConnectorHTTP:   httpCard{},
	policy.ConnectorWorker: argumentsCard{},
	store.ExecutorAgent:    agentCard{},
}

// Approve buttons' words: what airlock sends itself, and what someone else performs.
const (
	approveSend    = "Approve and send"
	approvePerform = "Approve"
)

// approveLabel is the approve button's words for an approval: the card's, else by
// executor (a payload no renderer reads).
func approveLabel(a store.Approval, c *effectCard) string {
	switch {
	case c != nil && c.Approve != "":
		return c.Approve
	case a.Executor == store.ExecutorAgent || a.Executor == store.ExecutorWorker:
		return approvePerform
	}
	return approveSend
}

// renderCard picks the renderer of the approval: the agent's for an agent's effect,
// else its action's connector. nil means no renderer reads it: raw JSON only.
func renderCard(a store.Approval, act *policy.Action) *effectCard {
	kind := a.Executor
	if kind != store.ExecutorAgent {
		if act == nil {
			return nil
		}
		kind = act.Connector
	}
	r, found := cardRenderers[kind]
	if !found {
		return nil
	}
	c, ok := r.render(a, act)
	if !ok {
		return nil
	}
	return &c
}

// emailCard shows an SMTP effect as the email the recipient gets.
type emailCard struct{}

func (emailCard) render(a store.Approval, act *policy.Action) (effectCard, bool) {
	m, err := policy.ParseMail(a.Payload)
	if err != nil {
		return effectCard{}, false
	}
	to := act.Recipients(a.Target)
	if len(to) == 0 {
		to = m.To
	}
	c := effectCard{Heading: "Email to be sent", Approve: approveSend, Fields: []cardField{{Label: "To", Value: strings.Join(to, ", ")}}}
	if act.SMTP != nil && act.SMTP.From != "" {
		c.Fields = append(c.Fields, cardField{Label: "From", Value: act.SMTP.From})
	}
	if m.ReplyTo != "" {
		c.Fields = append(c.Fields, cardField{Label: "Reply-To", Value: m.ReplyTo})
	}
	c.Fields = append(c.Fields, cardField{Label: "Subject", Value: m.Subject})
	c.Bodies = append(c.Bodies, cardField{Label: "Message", Value: m.Text})
	if m.HTML != "" {
		c.Bodies = append(c.Bodies, cardField{Label: "HTML version", Value: htmlText(m.HTML),
			Note: "shown as its text: tags, scripts and images are not rendered"})
	}
	return c, true
}

// htmlText is the text an HTML body shows: its text nodes, with line breaks for the
// block elements; script and style contents are dropped.
func htmlText(s string) string {
	var b strings.Builder
	z := html.NewTokenizer(strings.NewReader(s))
	skip := 0
	for {
		switch z.Next() {
		case html.ErrorToken:
			return strings.TrimSpace(collapseBlank(b.String()))
		case html.TextToken:
			if skip == 0 {
				b.Write(z.Text())
			}
		case html.StartTagToken, html.SelfClosingTagToken:
			name, _ := z.TagName()
			switch string(name) {
			case "script", "style", "head", "title", "template", "noscript":
				skip++
			case "br", "p", "div", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "blockquote", "table", "ul", "ol":
				b.WriteString("\n")
			}
		case html.EndTagToken:
			name, _ := z.TagName()
			switch string(name) {
			case "script", "style", "head", "title", "template", "noscript":
				if skip > 0 {
					skip--
				}
			case "p", "div", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "blockquote":
				b.WriteString("\n")
			}
		}
	}
}

// collapseBlank keeps at most one empty line between lines of text.
func collapseBlank(s string) string {
	lines := strings.Split(s, "\n")
	out := lines[:0]
	blank := 0
	for _, l := range lines {
		l = strings.TrimRight(l, " \t\r")
		if strings.TrimSpace(l) == "" {
			if blank++; blank > 1 {
				continue
			}
			l = ""
		} else {
			blank = 0
		}
		out = append(out, l)
	}
	return strings.Join(out, "\n")
}

// httpCard shows an HTTP effect as the request the connector makes.
type httpCard struct{}

func (httpCard) render(a store.Approval, act *policy.Action) (effectCard, bool) {
	if act.HTTP == nil {
		return effectCard{}, false
	}
	c := effectCard{Heading: "HTTP request to be made", Approve: approveSend, Fields: []cardField{
		{Label: "Method", Value: "POST"},
		{Label: "URL", Value: shownURL(act.HTTP.Targets[a.Target]), Code: true},
		{Label: "Content-Type", Value: "application/json"},
		{Label: "Idempotency-Key", Value: a.RunKey + "/" + a.EffectID, Code: true}, // effects.ProviderKey
		{Label: "X-Airlock-Run-Key", Value: a.RunKey, Code: true},
		{Label: "X-Airlock-Action-Type", Value: a.ActionType, Code: true},
	}}
	if act.HTTP.TokenEnv != "" || act.HTTP.TokenFile != "" {
		header := act.HTTP.TokenHeader
		if header == "" {
			header = "Authorization"
		}
		c.Fields = append(c.Fields, cardField{Label: header, Value: "(secret, not shown)"})
	}
	c.Bodies = []cardField{{Label: "Body", Value: prettyJSON(a.Payload)}}
	return c, true
}

// shownURL is a target URL without its query, which may hold a key: the approver sees
// where the request goes, not the connector's credentials.
func shownURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || s == "" {
		return "(the action's configured URL)"
	}
	u.User = nil
	if u.RawQuery != "" {
		u.RawQuery = ""
		return u.String() + "?… (query not shown)"
	}
	return u.String()
}

// argumentsCard shows a worker's task as its named arguments (the payload object's
// fields). The target is named only when the action has more than its default one.
type argumentsCard struct{}

func (argumentsCard) render(a store.Approval, _ *policy.Action) (effectCard, bool) {
	args, ok := namedArguments(a.Payload)
	if !ok {
		return effectCard{}, false
	}
	c := effectCard{Heading: "Task the worker will perform", Approve: approvePerform,
		Fields: []cardField{{Label: "Task", Value: a.ActionType, Code: true}}, Bodies: args}
	if a.Target != "" && a.Target != "default" {
		c.Fields = append(c.Fields, cardField{Label: "Destination", Value: a.Target, Code: true})
	}
	return c, true
}

// agentCard shows what an agent will do once approved: an MCP tool call as its tool
// and named arguments; a client's plan as its action and the plan's input, field by
// field. A plan sent without its input says so: the card cannot show what it does.
type agentCard struct{}

func (agentCard) render(a store.Approval, _ *policy.Action) (effectCard, bool) {
	c := effectCard{Heading: "Action to be performed", Approve: approvePerform}
	var call struct {
		Tool      string          `json:"tool"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if json.Unmarshal(a.Payload, &call) == nil && call.Tool != "" {
		c.Fields = []cardField{{Label: "Tool", Value: call.Tool, Code: true}, {Label: "Server", Value: a.Target, Code: true}}
		if args, ok := namedArguments(call.Arguments); ok {
			c.Bodies = args
		} else if raw := bytes.TrimSpace(call.Arguments); len(raw) > 0 && !bytes.Equal(raw, []byte("null")) {
			c.Bodies = []cardField{{Label: "Arguments", Value: prettyJSON(raw)}}
		}
		if len(c.Bodies) == 0 {
			c.Empty = "The tool is called without arguments."
		}
		return c, true
	}
	c.Fields = []cardField{{Label: "Action", Value: a.ActionType, Code: true}}
	if a.Target != "" && a.Target != "default" {
		c.Fields = append(c.Fields, cardField{Label: "Target", Value: a.Target, Code: true})
	}
	raw := bytes.TrimSpace(a.Payload)
	switch args, ok := namedArguments(raw); {
	case len(raw) == 0 || bytes.Equal(raw, []byte("null")):
		c.Empty = "The agent did not send what it will do (its plan carried no input), so this card cannot show it. " +
			"Approving lets it perform this action once, with the input whose hash is " + a.PayloadHash + ", whatever that input is."
	case ok && len(args) == 0:
		c.Empty = "The agent's input is empty: the action takes no arguments."
	case ok:
		c.Bodies = args
	default:
		c.Bodies = []cardField{{Label: "Input", Value: prettyJSON(raw)}}
	}
	return c, true
}

// namedArguments reads a JSON object as its fields in name order, each value as
// indented JSON (a string as itself).
func namedArguments(raw json.RawMessage) ([]cardField, bool) {
	var obj map[string]json.RawMessage
	if json.Unmarshal(raw, &obj) != nil || obj == nil {
		return nil, false
	}
	out := []cardField{}
	for _, k := range slices.Sorted(maps.Keys(obj)) {
		var s string
		if json.Unmarshal(obj[k], &s) != nil {
			s = prettyJSON(obj[k])
		}
		out = append(out, cardField{Label: k, Value: s})
	}
	return out, true
}

// prettyJSON is raw indented, or raw as it is when it is not JSON.
func prettyJSON(raw json.RawMessage) string {
	var b bytes.Buffer
	if json.Indent(&b, raw, "", "  ") != nil {
		return string(raw)
	}
	return b.String()
}
