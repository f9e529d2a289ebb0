package web

import (
	"bytes"
	"encoding/json"

	"github.com/airlockhq/airlock/internal/connector"
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
// code (a name or an id, not prose). Connector kinds' cards are made of the same.
type cardField = connector.CardField

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

// renderCard is the approval's card: the agent's for an agent's effect, else its action
// type's connector kind's (connector.Carder). nil means none reads it: raw JSON only.
func renderCard(a store.Approval, act *policy.Action) *effectCard {
	if a.Executor == store.ExecutorAgent {
		c := agentCard(a)
		return &c
	}
	if act == nil {
		return nil
	}
	kc, ok := act.Card(connector.Request{EffectID: a.RunKey + "/" + a.EffectID, // effects.ProviderKey
		RunKey: a.RunKey, ActionType: a.ActionType, Target: a.Target, Payload: a.Payload})
	if !ok {
		return nil
	}
	c := effectCard{Heading: kc.Heading, Approve: approveSend, Fields: kc.Fields, Bodies: kc.Bodies}
	if act.Executor() == store.ExecutorWorker {
		c.Approve = approvePerform
	}
	return &c
}

// agentCard shows what an agent will do once approved: an MCP tool call as its tool
// and named arguments; a client's plan as its action and the plan's input, field by
// field. A plan sent without its input says so: the card cannot show what it does.
func agentCard(a store.Approval) effectCard {
	c := effectCard{Heading: "Action to be performed", Approve: approvePerform}
	var call struct {
		Tool      string          `json:"tool"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if json.Unmarshal(a.Payload, &call) == nil && call.Tool != "" {
		c.Fields = []cardField{{Label: "Tool", Value: call.Tool, Code: true}, {Label: "Server", Value: a.Target, Code: true}}
		if args, ok := connector.NamedFields(call.Arguments); ok {
			c.Bodies = args
		} else if raw := bytes.TrimSpace(call.Arguments); len(raw) > 0 && !bytes.Equal(raw, []byte("null")) {
			c.Bodies = []cardField{{Label: "Arguments", Value: connector.PrettyJSON(raw)}}
		}
		if len(c.Bodies) == 0 {
			c.Empty = "The tool is called without arguments."
		}
		return c
	}
	c.Fields = []cardField{{Label: "Action", Value: a.ActionType, Code: true}}
	if a.Target != "" && a.Target != "default" {
		c.Fields = append(c.Fields, cardField{Label: "Target", Value: a.Target, Code: true})
	}
	raw := bytes.TrimSpace(a.Payload)
	switch args, ok := connector.NamedFields(raw); {
	case len(raw) == 0 || bytes.Equal(raw, []byte("null")):
		c.Empty = "The agent did not send what it will do (its plan carried no input), so this card cannot show it. " +
			"Approving lets it perform this action once, with the input whose hash is " + a.PayloadHash + ", whatever that input is."
	case ok && len(args) == 0:
		c.Empty = "The agent's input is empty: the action takes no arguments."
	case ok:
		c.Bodies = args
	default:
		c.Bodies = []cardField{{Label: "Input", Value: connector.PrettyJSON(raw)}}
	}
	return c
}
