package policy

import (
	"encoding/json"
	"errors"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/airlockhq/airlock/internal/connector"
	"github.com/airlockhq/airlock/internal/connector/kinds"
)

// An action type's connector section is the kind's: this file is where the policy asks
// the table (internal/connector/kinds) what a kind's section is and what it decides, so
// no other place in airlock names a kind.

// UnmarshalYAML decodes an action type: every key that names a kind is decoded into that
// kind's section (an empty value counts as left out); the rest into the Action's fields.
// Unknown keys were reported before decoding (checkShape), by the same table.
func (a *Action) UnmarshalYAML(n *yaml.Node) error {
	type fields Action // the Action's fields, without this method
	if n.Kind != yaml.MappingNode {
		return n.Decode((*fields)(a))
	}
	rest := *n
	rest.Content = nil
	var typeErrs []string
	collect := func(err error) error {
		var te *yaml.TypeError
		if errors.As(err, &te) {
			typeErrs = append(typeErrs, te.Errors...)
			return nil
		}
		return err
	}
	sections := map[string]connector.Section{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, value := n.Content[i], n.Content[i+1]
		k, ok := kinds.Lookup(key.Value)
		if !ok {
			rest.Content = append(rest.Content, key, value)
			continue
		}
		if value.Tag == "!!null" {
			continue
		}
		s := k.NewSection()
		if err := collect(value.Decode(s)); err != nil {
			return err
		}
		sections[k.Name] = s
	}
	if err := collect(rest.Decode((*fields)(a))); err != nil {
		return err
	}
	a.sections = sections
	if len(typeErrs) > 0 {
		return &yaml.TypeError{Errors: typeErrs}
	}
	return nil
}

// kindSectionType is the Go type of the section kind name decodes into (unknownFields
// walks it); nil when no kind has that name.
func kindSectionType(name string) any {
	if k, ok := kinds.Lookup(name); ok {
		return k.NewSection()
	}
	return nil
}

// defaultSections fills the defaults of every kind section given (a misplaced one too,
// so the checks that read it judge what it would be), then picks the connector's: an
// empty one when the kind lets it be left out. given is under actions.<type>.
func (a *Action) defaultSections(given func(path ...string) bool) {
	fill := func(name string, s connector.Section) {
		if d, ok := s.(connector.Defaulter); ok {
			d.Defaults(func(path ...string) bool { return given(append([]string{name}, path...)...) })
		}
	}
	for name, s := range a.sections {
		fill(name, s)
	}
	k, ok := kinds.Lookup(a.Connector)
	if !ok {
		return
	}
	a.Section = a.sections[k.Name]
	if a.Section == nil && k.Optional {
		a.Section = k.NewSection()
		fill(k.Name, a.Section)
	}
}

// validateConnector checks that the type names a known connector, gives that
// connector's section and no other's, and that the section is right.
func (a *Action) validateConnector(f string, e *errs, lookupEnv func(string) (string, bool)) {
	for _, name := range kinds.Names() {
		if a.sections[name] != nil && name != a.Connector {
			e.add(f+"."+name, "given, but the connector is %q", a.Connector)
		}
	}
	k, ok := kinds.Lookup(a.Connector)
	switch {
	case a.Connector == "":
		e.add(f+".connector", "required: %s", kinds.List())
	case !ok:
		e.add(f+".connector", "must be %s, not %q", kinds.List(), a.Connector)
	case a.Section == nil:
		e.add(f+"."+k.Name, "required for connector %s", k.Name)
	default:
		sf := f + "." + k.Name
		a.Section.Validate(connector.NewCheck(sf,
			func(field, msg string) { *e = append(*e, field+": "+msg) },
			func(what, env, file string) string { return secret(sf, what, env, file, e, lookupEnv) }))
	}
}

// Kind is the action type's connector kind (the zero Kind when the connector is unknown).
func (a *Action) Kind() connector.Kind {
	k, _ := kinds.Lookup(a.Connector)
	return k
}

// Executor says who performs effects of this type: a worker for a kind performed
// outside airlock, airlock's dispatcher otherwise.
func (a *Action) Executor() string {
	if a.Kind().Outside {
		return "worker"
	}
	return "dispatcher"
}

// NewConnector builds the connector that sends this type's effects (nil, nil for a type
// performed outside airlock).
func (a *Action) NewConnector() (connector.Connector, error) {
	if a.Section == nil || a.Kind().Outside {
		return nil, nil
	}
	return a.Section.New()
}

// ValidTarget reports whether a client may name target for this action type, by its
// kind's rules (a configured target name for http, and for smtp with targets; one bare
// address for smtp without; anything well-formed for a worker, whose target is data, not
// a destination airlock dials).
func (a *Action) ValidTarget(target string) bool {
	if a.Section == nil {
		return target != ""
	}
	return a.Section.ValidTarget(target)
}

// SendTimeout is the connector's timeout for one send (0 for worker types). Every
// section given counts, in table order (a misplaced one, which validation reports, as
// well), as when each kind was a field of its own: the lease check then reports it too.
func (a *Action) SendTimeout() time.Duration {
	for _, name := range kinds.Names() {
		if s := a.sections[name]; s != nil {
			if t := s.SendTimeout(); t > 0 {
				return t
			}
		}
	}
	if a.Section == nil {
		return 0
	}
	return a.Section.SendTimeout()
}

// Recipients are the people an effect to target reaches, for kinds whose targets stand
// for people (an SMTP effect's envelope recipients); nil for other kinds.
func (a *Action) Recipients(target string) []string {
	if r, ok := a.Section.(connector.Recipienter); ok {
		return r.Recipients(target)
	}
	return nil
}

// CheckSendable refuses a payload this action type's connector could never send. It
// runs when the effect is queued, before a gate opens.
func (a *Action) CheckSendable(payload json.RawMessage) error {
	if c, ok := a.Section.(connector.PayloadChecker); ok {
		return c.CheckPayload(payload)
	}
	return nil
}

// CheckRecipients refuses a payload that would send the effect anywhere but its target
// (an SMTP payload's "to"): a *connector.PayloadFieldError names the field.
func (a *Action) CheckRecipients(target string, payload json.RawMessage) error {
	if c, ok := a.Section.(connector.DestinationChecker); ok {
		return c.CheckDestination(target, payload)
	}
	return nil
}

// Card is the approval page's card of an effect of this type, as its connector will
// carry it; ok is false when the kind has none or the payload does not read as it.
func (a *Action) Card(req connector.Request) (connector.Card, bool) {
	if c, ok := a.Section.(connector.Carder); ok {
		return c.Card(req)
	}
	return connector.Card{}, false
}

// Find says how an operator finds an effect of this type at the provider, and the short
// id shown beside its key; ok is false when the kind does not say.
func (a *Action) Find(providerKey, target string) (how, shownID string, ok bool) {
	if f, isFinder := a.Section.(connector.Finder); isFinder {
		how, shownID = f.Find(providerKey, target)
		return how, shownID, true
	}
	return "", "", false
}
