package httpconn

import (
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/connector"
)

// Kind is the http connector kind: POST JSON to a URL the policy file names.
var Kind = connector.Kind{
	Name:       "http",
	NewSection: func() connector.Section { return &Section{} },
	Approving:  "sends this request, once",
}

// Section is actions.<type>.http in the policy file.
type Section struct {
	URL                 string             `yaml:"url"`     // the single target, named "default"
	Targets             map[string]string  `yaml:"targets"` // or several, by name
	Idempotent          bool               `yaml:"idempotent"`
	TokenEnv            string             `yaml:"token_env"`
	TokenFile           string             `yaml:"token_file"`
	TokenHeader         string             `yaml:"token_header"`
	Timeout             connector.Duration `yaml:"timeout"`
	LookupURL           string             `yaml:"lookup_url"`
	LookupAuthoritative bool               `yaml:"lookup_authoritative"`
	IDField             string             `yaml:"id_field"`
	// Token is resolved from TokenEnv or TokenFile when the policy is validated.
	Token string `yaml:"-"`
}

// Defaults: a 10s timeout unless one is given; url is the target named "default".
func (h *Section) Defaults(given func(path ...string) bool) {
	if h.Timeout == 0 && !given("timeout") {
		h.Timeout = connector.Duration(defaultTimeout)
	}
	if h.URL != "" && h.Targets == nil {
		h.Targets = map[string]string{DefaultTarget: h.URL}
	}
}

// Validate: the targets are absolute http(s) URLs without credentials; a lookup_url
// holds {effect_id}; the timeout is from 100ms to 5m.
func (h *Section) Validate(c *connector.Check) {
	if h.URL != "" && len(h.Targets) > 1 {
		c.Add("url", "give url or targets, not both")
	}
	if len(h.Targets) == 0 {
		c.Add("url", "required (or targets: {name: url})")
	}
	for _, name := range sortedKeys(h.Targets) {
		if u, err := url.Parse(h.Targets[name]); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil {
			c.Add("targets."+name, "must be an absolute http(s) URL without credentials")
		}
	}
	if h.LookupURL != "" {
		if u, err := url.Parse(strings.ReplaceAll(h.LookupURL, Placeholder, "x")); err != nil || u.Host == "" || u.User != nil {
			c.Add("lookup_url", "must be an absolute http(s) URL without credentials")
		}
		if !strings.Contains(h.LookupURL, Placeholder) {
			c.Add("lookup_url", "must contain {effect_id}")
		}
	} else if h.LookupAuthoritative {
		c.Add("lookup_authoritative", "needs a lookup_url")
	}
	if h.Timeout.D() < 100*time.Millisecond || h.Timeout.D() > 5*time.Minute {
		c.Add("timeout", "must be from 100ms to 5m")
	}
	h.Token = c.Secret("token", h.TokenEnv, h.TokenFile)
}

// ValidTarget: a client names one of the configured targets, never a URL.
func (h *Section) ValidTarget(target string) bool {
	_, ok := h.Targets[target]
	return ok
}

// SendTimeout bounds one request.
func (h *Section) SendTimeout() time.Duration { return h.Timeout.D() }

// New builds the connector the section describes.
func (h *Section) New() (connector.Connector, error) {
	return New(Config{Targets: h.Targets, Idempotent: h.Idempotent, Token: h.Token,
		TokenHeader: h.TokenHeader, Timeout: h.Timeout.D(), LookupURL: h.LookupURL,
		LookupAuthoritative: h.LookupAuthoritative, IDField: h.IDField})
}

// Card shows the effect as the request the connector makes; the token is named, never
// shown.
func (h *Section) Card(req connector.Request) (connector.Card, bool) {
	c := connector.Card{Heading: "HTTP request to be made", Fields: []connector.CardField{
		{Label: "Method", Value: "POST"},
		{Label: "URL", Value: shownURL(h.Targets[req.Target]), Code: true},
		{Label: "Content-Type", Value: "application/json"},
		{Label: "Idempotency-Key", Value: req.EffectID, Code: true},
		{Label: "X-Airlock-Run-Key", Value: req.RunKey, Code: true},
		{Label: "X-Airlock-Action-Type", Value: req.ActionType, Code: true},
	}}
	if h.TokenEnv != "" || h.TokenFile != "" {
		header := h.TokenHeader
		if header == "" {
			header = "Authorization"
		}
		c.Fields = append(c.Fields, connector.CardField{Label: header, Value: "(secret, not shown)"})
	}
	c.Bodies = []connector.CardField{{Label: "Body", Value: connector.PrettyJSON(req.Payload)}}
	return c, true
}

// Find: the provider's idempotency lookup or request log, by the header it saw.
func (h *Section) Find(providerKey, _ string) (string, string) {
	return "At the provider, look up the request sent with the header Idempotency-Key: " + providerKey +
		" (its API's idempotency lookup, or its request log).", ""
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

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
