package approvals

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"

	"github.com/airlockhq/airlock/internal/store"
)

// Decisions in Slack (policy approval.decide_in: [page, slack]). The message is the
// card's summary (slackBlocks, the same facts in the same words), then the payload hash
// and the Approve / Reject buttons, then the link to the page. A button's value names
// the approval, the payload hash shown and the link's generation (ButtonGen): a value
// is not a credential — who clicks is proven by Slack's signature and the user's link,
// what they may do by DecideBy — but a re-issued approval (a new token hash) or another
// payload makes old buttons void.

// Slack action ids of the decision buttons.
const (
	SlackActionApprove = "airlock_approve"
	SlackActionReject  = "airlock_reject"
)

// SlackButton is what a decision button carries.
type SlackButton struct {
	ApprovalID  string `json:"a"`
	PayloadHash string `json:"h"`
	Gen         string `json:"g"`
}

// ButtonGen is the generation of an approval's link: derived one-way from its token
// hash, so it changes when the approval is re-issued and tells nothing of the token.
func ButtonGen(tokenHash string) string {
	sum := sha256.Sum256([]byte("airlock slack button\n" + tokenHash))
	return hex.EncodeToString(sum[:16])
}

// ErrButtonVoid: the button is of an older link (the approval was re-issued) or is not
// one of airlock's.
var ErrButtonVoid = errors.New("this message's buttons are no longer valid: the approval was re-issued; use the newest message or the page")

// ParseSlackButton reads a button's value.
func ParseSlackButton(value string) (SlackButton, error) {
	var b SlackButton
	if err := json.Unmarshal([]byte(value), &b); err != nil || b.ApprovalID == "" || b.PayloadHash == "" || b.Gen == "" {
		return SlackButton{}, ErrButtonVoid
	}
	return b, nil
}

// Current reports whether the button belongs to the approval's current link.
func (b SlackButton) Current(a store.Approval) bool {
	return b.ApprovalID == a.ID && subtle.ConstantTimeCompare([]byte(b.Gen), []byte(ButtonGen(a.TokenHash))) == 1
}

// SlackDecisionPayload is SlackPayload with the payload hash and the decision buttons.
func SlackDecisionPayload(c Card, a store.Approval) ([]byte, error) {
	value, err := json.Marshal(SlackButton{ApprovalID: a.ID, PayloadHash: a.PayloadHash, Gen: ButtonGen(a.TokenHash)})
	if err != nil {
		return nil, err
	}
	button := func(id, label, style string) map[string]any {
		return map[string]any{"type": "button", "action_id": id, "style": style, "value": string(value),
			"text": map[string]any{"type": "plain_text", "text": label, "emoji": false}}
	}
	extra := []any{
		map[string]any{"type": "context", "elements": []any{
			map[string]any{"type": "mrkdwn", "text": "*Payload hash*", "verbatim": true},
			map[string]any{"type": "plain_text", "text": slackEscape.Replace(orDash(a.PayloadHash)), "emoji": false},
		}},
		map[string]any{"type": "actions", "block_id": "airlock_decision", "elements": []any{
			button(SlackActionApprove, "Approve", "primary"), button(SlackActionReject, "Reject", "danger"),
		}},
	}
	text, blocks := slackBlocks(c, extra)
	return json.Marshal(map[string]any{"text": text, "mrkdwn": false, "blocks": blocks})
}

// SlackOutcome is the message that replaces a decided approval's, with every decision
// button gone: the outcome, who decided and when.
func SlackOutcome(c Card, a store.Approval) ([]byte, error) {
	line := "Decided"
	switch a.Decision {
	case Approve:
		line = "Approved"
	case Reject:
		line = "Rejected"
	case Cancel:
		line = "Cancelled"
	case "expired":
		line = "Expired without a decision"
	}
	facts := [][2]string{{"Outcome", line}}
	if a.ApproverSubject != "" {
		facts = append(facts, [2]string{"Decided by", a.ApproverSubject})
	}
	if a.ConsumedAt != nil {
		facts = append(facts, [2]string{"At", a.ConsumedAt.UTC().Format("2006-01-02T15:04:05Z07:00")})
	}
	if a.Decision == Reject && a.Reason != "" {
		facts = append(facts, [2]string{"Reason", a.Reason})
	}
	var fields []any
	for _, f := range facts {
		fields = append(fields,
			map[string]any{"type": "mrkdwn", "text": "*" + slackEscape.Replace(f[0]) + "*", "verbatim": true},
			map[string]any{"type": "plain_text", "text": slackEscape.Replace(orDash(f[1])), "emoji": false})
	}
	c.Title = line + ": " + c.Action
	_, blocks := slackBlocks(c, []any{map[string]any{"type": "section", "fields": fields}})
	text := slackEscape.Replace(strings.Join([]string{line, c.Key, a.ApproverSubject}, " · "))
	return json.Marshal(map[string]any{"replace_original": true, "text": text, "mrkdwn": false, "blocks": blocks})
}

// CardOf is the summary of approval a, as its notifications show it; false when its
// action type is no longer in the policy.
func (s *Service) CardOf(ctx context.Context, a store.Approval) (Card, bool) {
	act := s.Policy.Action(a.ActionType)
	if act == nil {
		return Card{}, false
	}
	return s.cardOf(ctx, a, act, s.Log), true
}
