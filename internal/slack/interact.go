package slack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/store"
)

// RejectCallback is the callback_id of the reject modal.
const RejectCallback = "airlock_reject"

// interaction is the part of Slack's interactivity payload airlock reads. Every field is
// covered by the signature; none of them is a credential or an identity by itself.
type interaction struct {
	Type string `json:"type"`
	User struct {
		ID     string `json:"id"`
		TeamID string `json:"team_id"`
	} `json:"user"`
	Team struct {
		ID string `json:"id"`
	} `json:"team"`
	TriggerID   string `json:"trigger_id"`
	ResponseURL string `json:"response_url"`
	Actions     []struct {
		ActionID string `json:"action_id"`
		Value    string `json:"value"`
	} `json:"actions"`
	View struct {
		CallbackID      string `json:"callback_id"`
		PrivateMetadata string `json:"private_metadata"`
		State           struct {
			Values map[string]map[string]struct {
				Value string `json:"value"`
			} `json:"values"`
		} `json:"state"`
	} `json:"view"`
}

// pending is what the reject modal carries from the click to its submission.
type pending struct {
	Button      approvals.SlackButton `json:"b"`
	ResponseURL string                `json:"r"`
}

// Reply is the body of airlock's answer to Slack's request (nil: an empty 200).
type Reply []byte

func ephemeral(text string) []byte {
	b, _ := json.Marshal(map[string]any{"response_type": "ephemeral", "replace_original": false, "text": slackEscape(text)})
	return b
}

// slackEscape escapes Slack's three control characters in airlock's answers.
func slackEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

func (s *Service) teamAllowed(team string) bool {
	c, _ := s.conf()
	return c != nil && (len(c.TeamIDs) == 0 || slices.Contains(c.TeamIDs, team))
}

// Interact takes a verified interactivity request (form field payload): a decision
// button's click (block_actions) or the reject modal's submission (view_submission).
func (s *Service) Interact(ctx context.Context, form url.Values) (Reply, error) {
	var in interaction
	if err := json.Unmarshal([]byte(form.Get("payload")), &in); err != nil {
		// Signed by the app's secret, yet not Slack's shape: nothing to do.
		s.Log.Warn("slack request ignored", "reason", "the payload is not interactivity JSON")
		return nil, nil
	}
	team := in.User.TeamID
	if team == "" {
		team = in.Team.ID
	}
	if !s.teamAllowed(team) {
		return nil, ErrTeam
	}
	via := "slack:" + team + "/" + in.User.ID
	switch in.Type {
	case "block_actions":
		if len(in.Actions) != 1 {
			return nil, nil
		}
		act := in.Actions[0]
		if act.ActionID != approvals.SlackActionApprove && act.ActionID != approvals.SlackActionReject {
			return nil, nil // the link buttons: Slack opens their URL, nothing to do
		}
		s.click(ctx, in, team, via, act.ActionID, act.Value)
		return nil, nil
	case "view_submission":
		if in.View.CallbackID != RejectCallback {
			return nil, nil
		}
		return s.submitReject(ctx, in, team, via)
	}
	return nil, nil
}

// click answers a decision button: refusals go to the user alone (ephemeral), a
// decision replaces the message.
func (s *Service) click(ctx context.Context, in interaction, team, via, action, value string) {
	say := func(text string) { s.post(ctx, in.ResponseURL, ephemeral(text)) }
	who, err := s.Person(ctx, team, in.User.ID)
	if err != nil {
		say(userMessage(err))
		return
	}
	b, err := approvals.ParseSlackButton(value)
	if err != nil {
		say(err.Error())
		return
	}
	a, ok := s.current(ctx, in.ResponseURL, b, say)
	if !ok {
		return
	}
	if action == approvals.SlackActionReject {
		// Only someone who may decide, here, is asked for a reason.
		if err := approvals.May(a, who); err != nil {
			say(userMessage(err))
			return
		}
		if act := s.Policy.Action(a.ActionType); act == nil || !act.DecidesIn(policy.DecideInSlack) {
			say(userMessage(approvals.ErrNotDecidedHere))
			return
		}
		s.openRejectModal(ctx, in, b, a, say)
		return
	}
	s.decide(ctx, in.ResponseURL, approvals.Decision{TokenHash: a.TokenHash, Decision: approvals.Approve, Who: who, Via: via,
		PayloadHash: b.PayloadHash, Place: policy.DecideInSlack}, b, say)
}

// current reads the button's approval and says why it cannot be decided: unknown, of
// an older link, already decided (the message is replaced with the outcome), expired.
func (s *Service) current(ctx context.Context, responseURL string, b approvals.SlackButton, say func(string)) (store.Approval, bool) {
	a, err := s.Store.ApprovalByID(ctx, b.ApprovalID)
	if err != nil {
		if !errors.Is(err, store.ErrNotFound) {
			s.Log.Error("slack decision", "err", err)
			say("airlock could not read the approval just now; nothing was decided. Try again in a moment.")
			return store.Approval{}, false
		}
		say(approvals.ErrButtonVoid.Error())
		return store.Approval{}, false
	}
	if a.ConsumedAt != nil {
		s.replaceWithOutcome(ctx, responseURL, a)
		say(decidedLine(a) + " Nothing was changed.")
		return store.Approval{}, false
	}
	if !b.Current(a) {
		say(approvals.ErrButtonVoid.Error())
		return store.Approval{}, false
	}
	if !a.ExpiresAt.After(s.now()) {
		say("This approval has expired: nothing was decided, and nothing will be sent on it.")
		return store.Approval{}, false
	}
	return a, true
}

func decidedLine(a store.Approval) string {
	if a.Decision == "expired" || a.ApproverSubject == "" {
		return "This approval is already closed (" + a.Decision + ")."
	}
	return fmt.Sprintf("Already decided by %s at %s (%s).", a.ApproverSubject, a.ConsumedAt.UTC().Format(time.RFC3339), a.Decision)
}

// decide takes the decision through approvals.DecideBy and replaces the message with
// its outcome; a refusal is told to the user alone.
func (s *Service) decide(ctx context.Context, responseURL string, d approvals.Decision, b approvals.SlackButton, say func(string)) error {
	a, err := s.approvals.DecideBy(ctx, d)
	if errors.Is(err, approvals.ErrNotFound) {
		// Decided, expired or re-issued meanwhile: say which, if it was decided.
		if cur, rerr := s.Store.ApprovalByID(ctx, b.ApprovalID); rerr == nil && cur.ConsumedAt != nil {
			s.replaceWithOutcome(ctx, responseURL, cur)
			say(decidedLine(cur) + " Nothing was changed.")
			return errors.New(decidedLine(cur))
		}
		say("This approval can no longer be decided from this message (re-issued or expired). Nothing was changed.")
		return err
	}
	if err != nil {
		say(userMessage(err))
		return err
	}
	s.replaceWithOutcome(ctx, responseURL, a)
	return nil
}

// userMessage is what a refused user is told: the domain's own words for the gate's
// refusals, a fixed sentence for anything else (its text may name hosts or SQL).
func userMessage(err error) string {
	for _, known := range []error{errNotLinked, errAccountGone, errSignInAgain, approvals.ErrForbidden, approvals.ErrSelfApproval,
		approvals.ErrPayloadChanged, approvals.ErrNotDecidedHere, approvals.ErrDecisionNotAllowed, approvals.ErrButtonVoid} {
		if errors.Is(err, known) {
			msg := known.Error()
			if !strings.Contains(msg, "nothing was decided") && !strings.Contains(msg, "Nothing was") {
				msg += ". Nothing was decided"
			}
			return strings.ToUpper(msg[:1]) + msg[1:] + "."
		}
	}
	return "airlock could not take the decision just now; nothing was decided. Try again in a moment, or use the page."
}

// replaceWithOutcome replaces the message the click came from with the outcome.
func (s *Service) replaceWithOutcome(ctx context.Context, responseURL string, a store.Approval) {
	c, ok := s.approvals.CardOf(ctx, a)
	if !ok {
		return
	}
	body, err := approvals.SlackOutcome(c, a)
	if err != nil {
		return
	}
	s.post(ctx, responseURL, body)
}

// openRejectModal asks for the reason in a modal (views.open, with the bot token): the
// page asks for one too. Without a bot token the user is sent to the page.
func (s *Service) openRejectModal(ctx context.Context, in interaction, b approvals.SlackButton, a store.Approval, say func(string)) {
	c, _ := s.conf()
	link := s.approvals.ConsoleURL(a.ID)
	if c == nil || c.BotToken == "" || in.TriggerID == "" {
		say("A rejection needs a reason: reject on the page, " + link + " (this Slack app has no bot token to ask here).")
		return
	}
	meta, err := json.Marshal(pending{Button: b, ResponseURL: in.ResponseURL})
	if err != nil {
		return
	}
	view := map[string]any{
		"type": "modal", "callback_id": RejectCallback, "private_metadata": string(meta),
		"title":  map[string]any{"type": "plain_text", "text": "Reject", "emoji": false},
		"submit": map[string]any{"type": "plain_text", "text": "Reject", "emoji": false},
		"close":  map[string]any{"type": "plain_text", "text": "Cancel", "emoji": false},
		"blocks": []any{
			map[string]any{"type": "section", "text": map[string]any{"type": "plain_text", "emoji": false,
				"text": "Reject " + a.ActionType + " for " + a.RunKey + ". Nothing will be sent. Say why: your reason is recorded with your name."}},
			map[string]any{"type": "input", "block_id": "reason", "label": map[string]any{"type": "plain_text", "text": "Reason"},
				"element": map[string]any{"type": "plain_text_input", "action_id": "reason", "multiline": true, "max_length": 2000}},
		},
	}
	body, err := json.Marshal(map[string]any{"trigger_id": in.TriggerID, "view": view})
	if err != nil {
		return
	}
	resp, err := s.send(ctx, c.APIURL+"/views.open", c.BotToken, body)
	var ok struct {
		OK    bool   `json:"ok"`
		Error string `json:"error"`
	}
	if err == nil {
		_ = json.Unmarshal(resp, &ok)
	}
	if err != nil || !ok.OK {
		s.Log.Warn("slack reject modal not opened", "reason", err, "slack_error", ok.Error)
		say("Slack did not open the reason form; reject on the page: " + link)
	}
}

// submitReject takes the reject modal's submission: the same checks as a click, then
// DecideBy with the reason. A refusal is shown in the modal.
func (s *Service) submitReject(ctx context.Context, in interaction, team, via string) (Reply, error) {
	var p pending
	if err := json.Unmarshal([]byte(in.View.PrivateMetadata), &p); err != nil {
		return modalError(approvals.ErrButtonVoid.Error()), nil
	}
	reason := strings.TrimSpace(in.View.State.Values["reason"]["reason"].Value)
	if reason == "" {
		return modalError("Say why you reject it."), nil
	}
	if len(reason) > 2000 {
		return modalError("At most 2000 characters."), nil
	}
	var said string
	say := func(text string) { said = text }
	who, err := s.Person(ctx, team, in.User.ID)
	if err != nil {
		return modalError(userMessage(err)), nil
	}
	a, ok := s.current(ctx, p.ResponseURL, p.Button, say)
	if !ok {
		return modalError(said), nil
	}
	if err := s.decide(ctx, p.ResponseURL, approvals.Decision{TokenHash: a.TokenHash, Decision: approvals.Reject, Reason: reason,
		Who: who, Via: via, PayloadHash: p.Button.PayloadHash, Place: policy.DecideInSlack}, p.Button, say); err != nil {
		return modalError(said), nil
	}
	return nil, nil
}

func modalError(msg string) Reply {
	b, _ := json.Marshal(map[string]any{"response_action": "errors", "errors": map[string]string{"reason": msg}})
	return b
}

// Command takes a verified slash command (/airlock link CODE, /airlock unlink,
// /airlock whoami) and answers the user alone.
func (s *Service) Command(ctx context.Context, form url.Values) (Reply, error) {
	team, user := form.Get("team_id"), form.Get("user_id")
	if !s.teamAllowed(team) {
		return nil, ErrTeam
	}
	if user == "" {
		return ephemeral("No Slack user in this request."), nil
	}
	via := "slack:" + team + "/" + user
	args := strings.Fields(form.Get("text"))
	switch {
	case len(args) == 2 && args[0] == "link":
		code, err := s.Store.SlackCodeTake(ctx, hashCode(args[1]), s.At())
		if errors.Is(err, store.ErrNotFound) {
			return ephemeral("That code is unknown, used or expired. Take a new one in the airlock console (Link Slack)."), nil
		}
		if err != nil {
			return nil, err
		}
		if err := s.Link(ctx, team, user, code.Subject, code.AccountID, "person:"+code.Subject+" via "+via); err != nil {
			return nil, err
		}
		return ephemeral("Linked: in airlock you are " + code.Subject + ". Your decisions here are theirs, with their roles."), nil
	case len(args) == 1 && args[0] == "unlink":
		err := s.Unlink(ctx, team, user, via)
		if errors.Is(err, store.ErrNotFound) {
			return ephemeral("Your Slack account is not linked."), nil
		}
		if err != nil {
			return nil, err
		}
		return ephemeral("Unlinked: your clicks here no longer decide anything."), nil
	case len(args) == 1 && args[0] == "whoami":
		who, err := s.Person(ctx, team, user)
		if err != nil {
			return ephemeral(userMessage(err)), nil
		}
		return ephemeral("In airlock you are " + who.Subject + " (roles: " + strings.Join(who.Roles, ", ") + ")."), nil
	}
	return ephemeral("Use /airlock link CODE (the code from the console's Link Slack page), /airlock unlink or /airlock whoami."), nil
}
