package policy

import (
	"net/url"
	"slices"
	"strings"
)

// Where an approval may be decided (approval.decide_in).
const (
	DecideInPage  = "page"  // the signed-in approval page (always; the default)
	DecideInSlack = "slack" // Approve / Reject buttons in the Slack message
)

// Slack configures decisions in Slack: the app's signing secret (every request airlock
// takes from Slack is checked against it), the bot token that opens the reject modal,
// and where Slack's API and response URLs are (a test points them at a stand-in).
type Slack struct {
	SigningSecretEnv  string `yaml:"signing_secret_env"`
	SigningSecretFile string `yaml:"signing_secret_file"`
	SigningSecret     string `yaml:"-"`
	BotTokenEnv       string `yaml:"bot_token_env"`
	BotTokenFile      string `yaml:"bot_token_file"`
	BotToken          string `yaml:"-"`
	// APIURL is Slack's Web API base (default https://slack.com/api).
	APIURL string `yaml:"api_url"`
	// ResponseURLPrefixes are where a response_url may point (default
	// https://hooks.slack.com/): airlock posts to no other address a payload names.
	ResponseURLPrefixes []string `yaml:"response_url_prefixes"`
	// TeamIDs, when set, are the only Slack workspaces whose requests are taken.
	TeamIDs []string `yaml:"team_ids"`
}

// DecidesIn reports whether this type's approvals may be decided in the place named.
func (a *Action) DecidesIn(place string) bool { return slices.Contains(a.Approval.DecideIn, place) }

func (s *Slack) validate(f string, e *errs, lookupEnv func(string) (string, bool)) {
	if s == nil {
		return
	}
	if s.SigningSecretEnv == "" && s.SigningSecretFile == "" {
		e.add(f, "needs signing_secret_env or signing_secret_file (the Slack app's signing secret)")
	} else {
		s.SigningSecret = secret(f, "signing_secret", s.SigningSecretEnv, s.SigningSecretFile, e, lookupEnv)
	}
	s.BotToken = secret(f, "bot_token", s.BotTokenEnv, s.BotTokenFile, e, lookupEnv)
	if s.APIURL == "" {
		s.APIURL = "https://slack.com/api"
	}
	s.APIURL = strings.TrimRight(s.APIURL, "/")
	if u, err := url.Parse(s.APIURL); err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		e.add(f+".api_url", "must be an absolute http(s) URL")
	}
	if len(s.ResponseURLPrefixes) == 0 {
		s.ResponseURLPrefixes = []string{"https://hooks.slack.com/"}
	}
	for _, p := range s.ResponseURLPrefixes {
		if u, err := url.Parse(p); err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") || !strings.HasSuffix(p, "/") {
			e.add(f+".response_url_prefixes", "%q must be an absolute http(s) URL ending in /", p)
		}
	}
}

// validateDecideIn checks approval.decide_in: page is always one of the places (it is
// the default, and the only one for anything chat cannot do); slack needs the slack
// section and a Slack webhook among the type's notify list to carry the buttons.
func (p *Policy) validateDecideIn(f string, a *Action, e *errs) {
	if len(a.Approval.DecideIn) == 0 {
		a.Approval.DecideIn = []string{DecideInPage}
	}
	for _, d := range a.Approval.DecideIn {
		if d != DecideInPage && d != DecideInSlack {
			e.add(f, "%q is not a place to decide (page, slack)", d)
		}
	}
	if !slices.Contains(a.Approval.DecideIn, DecideInPage) {
		e.add(f, "must include page: the signed-in page is where every decision can be made")
	}
	if !a.DecidesIn(DecideInSlack) {
		return
	}
	if a.Gate != GateApproveBeforeAct && a.Gate != GateApproveByException {
		e.add(f, "slack decides approvals; gate %s has none to decide there", a.Gate)
	}
	if p.Slack == nil {
		e.add(f, "slack needs the slack section (the app's signing secret)")
	}
	hasSlack := false
	for _, n := range a.Notify {
		if w := p.Notify.Webhooks[n]; w != nil && w.Format == WebhookSlack {
			hasSlack = true
		}
	}
	if !hasSlack {
		e.add(f, "slack needs a Slack webhook in notify to carry the buttons")
	}
}
