package smtpconn

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"maps"
	netmail "net/mail"
	"slices"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/connector"
)

// Kind is the smtp connector kind: one e-mail per effect, to its target.
var Kind = connector.Kind{
	Name:       "smtp",
	NewSection: func() connector.Section { return &Section{} },
	Approving:  "sends this email, once",
}

// Section is actions.<type>.smtp in the policy file.
type Section struct {
	Host         string             `yaml:"host"`
	Port         int                `yaml:"port"`
	Username     string             `yaml:"username"`
	PasswordEnv  string             `yaml:"password_env"`
	PasswordFile string             `yaml:"password_file"`
	From         string             `yaml:"from"`
	TLS          string             `yaml:"tls"` // starttls (default) | tls | none
	Timeout      connector.Duration `yaml:"timeout"`
	Targets      map[string]string  `yaml:"targets"` // optional fixed recipients by name
	// Password is resolved from PasswordEnv or PasswordFile when the policy is validated.
	Password string `yaml:"-"`
}

// Defaults: STARTTLS and a 30s timeout.
func (s *Section) Defaults(func(path ...string) bool) {
	if s.TLS == "" {
		s.TLS = "starttls"
	}
	if s.Timeout == 0 {
		s.Timeout = connector.Duration(DefaultTimeout)
	}
}

// Validate: a host and port, a From address, a TLS mode, fixed recipients that are
// addresses, and a username with a password.
func (s *Section) Validate(c *connector.Check) {
	if s.Host == "" {
		c.Add("host", "required")
	}
	if s.Port < 1 || s.Port > 65535 {
		c.Add("port", "required: 1 to 65535")
	}
	if _, err := netmail.ParseAddress(s.From); err != nil {
		c.Add("from", "must be an email address")
	}
	if !slices.Contains([]string{"starttls", "tls", "none"}, s.TLS) {
		c.Add("tls", "must be starttls, tls or none")
	}
	for _, name := range slices.Sorted(maps.Keys(s.Targets)) {
		if _, err := netmail.ParseAddress(s.Targets[name]); err != nil {
			c.Add("targets."+name, "must be an email address")
		}
	}
	s.Password = c.Secret("password", s.PasswordEnv, s.PasswordFile)
	if s.Password != "" && s.Username == "" {
		c.Add("username", "required with a password")
	}
}

// ValidTarget: with smtp.targets, one of their names; without, the target is the
// recipient: exactly one bare address, nothing else.
func (s *Section) ValidTarget(target string) bool {
	if len(s.Targets) > 0 {
		_, ok := s.Targets[target]
		return ok
	}
	addr, err := netmail.ParseAddress(target)
	return err == nil && addr.Name == "" && addr.Address == target
}

// Recipients are the envelope recipients of an effect to target: the address
// smtp.targets names for it, else the target itself.
func (s *Section) Recipients(target string) []string {
	if len(s.Targets) > 0 {
		addr, err := netmail.ParseAddress(s.Targets[target])
		if err != nil {
			return nil
		}
		return []string{addr.Address}
	}
	return []string{target}
}

// CheckPayload refuses a payload that is not a mail this connector sends (ParseMail).
func (s *Section) CheckPayload(payload json.RawMessage) error {
	_, err := ParseMail(payload)
	return err
}

// CheckDestination refuses a payload whose "to" would send the mail anywhere but the
// target's recipients: with smtp.targets the payload names none; without, "to" may only
// repeat the target. The target is what the card, the effect and the audit show.
func (s *Section) CheckDestination(target string, payload json.RawMessage) error {
	if len(payload) == 0 {
		return nil
	}
	var p struct {
		To json.RawMessage `json:"to"`
	}
	if err := json.Unmarshal(payload, &p); err != nil || len(p.To) == 0 || string(p.To) == "null" {
		return nil // CheckPayload refuses what is not a mail payload
	}
	refuse := func(msg string) error { return &connector.PayloadFieldError{Field: "to", Msg: msg} }
	if len(s.Targets) > 0 {
		return refuse("the recipient is fixed by smtp.targets for the target; omit to")
	}
	var to []string
	var one string
	if json.Unmarshal(p.To, &one) == nil {
		to = []string{one}
	} else if json.Unmarshal(p.To, &to) != nil || len(to) == 0 {
		return refuse("want the target's address, or omit it")
	}
	for _, r := range to {
		if !SameAddress(r, target) {
			return refuse("names a recipient other than the target: the target is the recipient")
		}
	}
	return nil
}

// SendTimeout bounds connecting and, again, the mail transaction.
func (s *Section) SendTimeout() time.Duration { return s.Timeout.D() }

// New builds the connector the section describes.
func (s *Section) New() (connector.Connector, error) {
	return New(Config{Host: s.Host, Port: s.Port, Username: s.Username, Password: s.Password,
		From: s.From, TLS: s.TLS, Timeout: s.Timeout.D(), Targets: s.Targets})
}

// Card shows the effect as the email the recipient gets; an HTML body as its text.
func (s *Section) Card(req connector.Request) (connector.Card, bool) {
	m, err := ParseMail(req.Payload)
	if err != nil {
		return connector.Card{}, false
	}
	to := s.Recipients(req.Target)
	if len(to) == 0 {
		to = m.To
	}
	c := connector.Card{Heading: "Email to be sent", Fields: []connector.CardField{{Label: "To", Value: strings.Join(to, ", ")}}}
	if s.From != "" {
		c.Fields = append(c.Fields, connector.CardField{Label: "From", Value: s.From})
	}
	if m.ReplyTo != "" {
		c.Fields = append(c.Fields, connector.CardField{Label: "Reply-To", Value: m.ReplyTo})
	}
	c.Fields = append(c.Fields, connector.CardField{Label: "Subject", Value: m.Subject})
	c.Bodies = append(c.Bodies, connector.CardField{Label: "Message", Value: m.Text})
	if m.HTML != "" {
		c.Bodies = append(c.Bodies, connector.CardField{Label: "HTML version", Value: htmlText(m.HTML),
			Note: "shown as its text: tags, scripts and images are not rendered"})
	}
	return c, true
}

// Find: the mail provider's sent log or the mailbox, by the Message-ID every attempt
// carried (its left part: the domain is the connector's).
func (s *Section) Find(providerKey, target string) (string, string) {
	sum := sha256.Sum256([]byte(providerKey))
	id := hex.EncodeToString(sum[:16]) + "@"
	return "In the mail provider's sent log or the recipient's mailbox, search for a message to " + target +
		" whose Message-ID starts with " + id + " (derived from the idempotency key: every attempt carried the same one).", id
}
