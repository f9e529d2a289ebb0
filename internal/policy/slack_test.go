package policy

import (
	"slices"
	"strings"
	"testing"
)

const slackPolicy = `
slack:
  signing_secret_env: SLACK_SIGNING_SECRET
  bot_token_env: SLACK_BOT_TOKEN
notify:
  webhooks:
    approvers: {format: slack, url_env: SLACK_HOOK}
    finance: {format: teams, url_env: TEAMS_HOOK}
actions:
  refund:
    connector: worker
    approvers: {roles: [finance]}
    notify: [approvers]
    approval: {decide_in: [page, slack]}
  note:
    connector: worker
    approvers: {roles: [finance]}
    notify: [approvers]
`

var slackEnv = env(map[string]string{"SLACK_SIGNING_SECRET": "s3cret-signing", "SLACK_BOT_TOKEN": "xoxb-1", "SLACK_HOOK": "https://hooks.slack.com/services/T/B/X", "TEAMS_HOOK": "https://teams.example/hook"})

// TestDecideIn: slack is opt-in per type (page alone is the default), secrets come from
// the environment, and every way to misconfigure it stops start-up naming the field.
func TestDecideIn(t *testing.T) {
	p, err := Parse([]byte(slackPolicy), slackEnv)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Action("refund").DecidesIn(DecideInSlack) || p.Action("note").DecidesIn(DecideInSlack) || !slices.Equal(p.Action("note").Approval.DecideIn, []string{DecideInPage}) {
		t.Fatalf("decide_in: %v %v", p.Action("refund").Approval.DecideIn, p.Action("note").Approval.DecideIn)
	}
	if p.Slack.SigningSecret != "s3cret-signing" || p.Slack.BotToken != "xoxb-1" || p.Slack.APIURL != "https://slack.com/api" ||
		!slices.Equal(p.Slack.ResponseURLPrefixes, []string{"https://hooks.slack.com/"}) {
		t.Fatalf("slack: %+v", p.Slack)
	}
	for _, c := range []struct{ from, to, want string }{
		{"decide_in: [page, slack]", "decide_in: [slack]", "actions.refund.approval.decide_in: must include page"},
		{"decide_in: [page, slack]", "decide_in: [page, teams]", `"teams" is not a place to decide`},
		{"notify: [approvers]\n    approval", "notify: [finance]\n    approval", "actions.refund.approval.decide_in: slack needs a Slack webhook in notify"},
		{"slack:\n  signing_secret_env: SLACK_SIGNING_SECRET\n", "slack:\n", "slack: needs signing_secret_env or signing_secret_file"},
		{"signing_secret_env: SLACK_SIGNING_SECRET", "signing_secret_env: NOT_SET", "slack.signing_secret_env: environment variable NOT_SET is not set"},
		{"  bot_token_env: SLACK_BOT_TOKEN\n", "  bot_token_env: SLACK_BOT_TOKEN\n  response_url_prefixes: [\"https://hooks.slack.com\"]\n", "slack.response_url_prefixes"},
	} {
		src := strings.Replace(slackPolicy, c.from, c.to, 1)
		if src == slackPolicy {
			t.Fatalf("%q not in the policy", c.from)
		}
		_, err := Parse([]byte(src), slackEnv)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s → %v, want %q", c.to, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret-signing") {
			t.Errorf("the signing secret is in an error: %v", err)
		}
	}
	// Without the slack section, decide_in slack stops start-up.
	src := strings.Replace(slackPolicy, "slack:\n  signing_secret_env: SLACK_SIGNING_SECRET\n  bot_token_env: SLACK_BOT_TOKEN\n", "", 1)
	if _, err := Parse([]byte(src), slackEnv); err == nil || !strings.Contains(err.Error(), "slack needs the slack section") {
		t.Fatalf("no slack section: %v", err)
	}
}
