package connector

import (
	"encoding/json"
	"fmt"
	"time"

	"go.yaml.in/yaml/v3"
)

// Kind is one connector kind: what an action type's `connector:` names, and everything
// airlock decides by it. A kind is one package that supplies a Kind value, and one row in
// the table of internal/connector/kinds (caddy's modules.go is the model: a module gives
// its name and a constructor, and the optional interfaces it implements say the rest).
// Nothing else in airlock switches on a kind's name.
type Kind struct {
	// Name is the `connector:` value and the key of the kind's own section of an action
	// type (actions.crm_note.http).
	Name string
	// NewSection returns an empty section for the policy file to decode into.
	NewSection func() Section
	// Optional: the section may be left out (an empty one is used); otherwise leaving it
	// out is "required for connector <name>".
	Optional bool
	// Outside: effects of this kind are performed outside airlock, by a worker that
	// claims them; airlock's dispatcher never sends them and the section builds no
	// connector.
	Outside bool
	// Approving is what approving an effect of this kind does, in an approval
	// notification's words ("sends this email, once"); "" for the generic words.
	Approving string
}

// Section is a kind's part of an action type in the policy file (actions.<type>.<kind>):
// a struct with yaml tags, decoded from the file, its defaults filled, then validated as
// a whole before anything is built from it.
type Section interface {
	// Validate reports every problem of the section to c; it also resolves the section's
	// secrets (c.Secret).
	Validate(c *Check)
	// ValidTarget reports whether a client may name target for this action type.
	ValidTarget(target string) bool
	// SendTimeout bounds one send (0 for a kind performed outside airlock).
	SendTimeout() time.Duration
	// New builds the connector that sends the type's effects (nil, nil for a kind
	// performed outside airlock).
	New() (Connector, error)
}

// Defaulter is a section with defaults: it fills what the file left out. given says
// whether the file named a field of the section (a path of keys under it), so an explicit
// zero stays for Validate to judge.
type Defaulter interface {
	Defaults(given func(path ...string) bool)
}

// PayloadChecker is a section that refuses, when an effect is queued and before any
// approval opens, a payload its connector could never send (unsendable_payload). The
// error says what makes it unsendable.
type PayloadChecker interface {
	CheckPayload(payload json.RawMessage) error
}

// DestinationChecker is a section whose payload may name where it goes (a mail's "to"):
// it refuses a payload that would send anywhere but the target, with a *PayloadFieldError
// naming the field.
type DestinationChecker interface {
	CheckDestination(target string, payload json.RawMessage) error
}

// PayloadFieldError is a payload refused for one of its fields (a 422 on payload.<Field>).
type PayloadFieldError struct {
	Field, Msg string
}

func (e *PayloadFieldError) Error() string { return e.Msg }

// Recipienter is a section whose target stands for people: the recipients an approval
// card and notification name for target.
type Recipienter interface {
	Recipients(target string) []string
}

// Carder is a section that shows an effect as what its connector will carry: the
// approval page's card. ok is false when the payload does not read as this kind (the page
// then shows the JSON as it is). req.EffectID is the provider's idempotency key.
type Carder interface {
	Card(req Request) (card Card, ok bool)
}

// Finder is a section that tells an operator how to find an effect of this kind at the
// provider (the console's page of an effect whose outcome is unknown): the sentence, and
// the short id the page shows beside the idempotency key ("" for none).
type Finder interface {
	Find(providerKey, target string) (how, shownID string)
}

// Check collects a section's validation problems, each under its field path in the
// policy file, and resolves its secrets the way the rest of the file's are.
type Check struct {
	// Field is the section's path (actions.crm_note.http).
	Field  string
	report func(field, msg string)
	secret func(what, env, file string) string
}

// NewCheck returns a Check of the section at field: report receives each problem by its
// full path; secret resolves a secret from an environment variable or a file (what names
// the field pair: token → token_env, token_file), reporting its own problems.
func NewCheck(field string, report func(field, msg string), secret func(what, env, file string) string) *Check {
	return &Check{Field: field, report: report, secret: secret}
}

// Add reports a problem of the section's field (a path under the section: "url",
// "targets.eu").
func (c *Check) Add(field, format string, args ...any) {
	c.report(c.Field+"."+field, fmt.Sprintf(format, args...))
}

// Secret is the secret named by the section's <what>_env or <what>_file, never written
// in the policy file itself; "" when neither is given, or when secrets are not resolved
// (operator commands that send nothing).
func (c *Check) Secret(what, env, file string) string {
	return c.secret(what, env, file)
}

// Duration is a time.Duration written as "5s" in the policy file.
type Duration time.Duration

func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil || v < 0 {
		return fmt.Errorf("line %d: %q is not a duration such as 500ms, 5s or 2m", n.Line, n.Value)
	}
	*d = Duration(v)
	return nil
}

// D is d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }
