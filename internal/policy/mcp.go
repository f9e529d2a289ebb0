package policy

import (
	"bytes"
	"fmt"
	"net/url"
	"regexp"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// MCP configures `airlock mcp`, the gateway between an agent and its MCP servers: the
// upstream servers it fronts and the class of each of their tools. A tool the section
// does not classify is refused (a closed set, like action types).
type MCP struct {
	Upstreams map[string]*Upstream `yaml:"upstreams"`
	// Pins is the file of accepted tool definitions (`airlock mcp tools --accept` writes
	// it), relative to the policy file's directory; default: the policy file's name with
	// .pins.json added.
	Pins string `yaml:"pins"`
}

// Upstream is one MCP server behind the gateway: a command to spawn (stdio) or the URL
// of a streamable HTTP endpoint.
type Upstream struct {
	Name    string            `yaml:"-"`
	Command string            `yaml:"command"`
	Args    []string          `yaml:"args"`
	Env     map[string]string `yaml:"env"` // added to the gateway's environment (minus AIRLOCK_*)
	URL     string            `yaml:"url"`
	// Tools classifies the upstream's tools by name: "read", or an effect.
	Tools map[string]*Tool `yaml:"tools"`
}

// Tool is a tool's class. Read tools pass through untouched (and are recorded); an effect
// tool is planned in the run's ledger under action type Effect before it is forwarded.
type Tool struct {
	Read   bool   `yaml:"-"`
	Effect string `yaml:"effect"` // the action type (connector: worker)
	// EffectIDArgument names a string argument that carries the effect id; without it the
	// id is derived from the tool name and the canonical hash of the arguments.
	EffectIDArgument string `yaml:"effect_id_argument"`
	// RunIDArgument names a string argument that carries the run id (the run's key);
	// without it the gateway's --run-id is used.
	RunIDArgument string `yaml:"run_id_argument"`
	// Lookup settles a call whose earlier attempt stopped between plan and confirm.
	Lookup *Lookup `yaml:"lookup"`
}

// Lookup is a read-only tool of the same upstream that finds what an earlier attempt of
// an effect did: none found → cleared (the call goes through), one → confirmed (it is
// not sent again), several → the run stops for a person.
type Lookup struct {
	Tool string `yaml:"tool"`
	// Arguments are sent to the lookup tool; in every string, {effect_id}, {run_id} and
	// {arg.NAME} (the effect call's string argument NAME) are replaced.
	Arguments map[string]any `yaml:"arguments"`
	// Items is a JSON pointer into the result's structuredContent to the array of records
	// found ("" = structuredContent itself). Without structuredContent, each non-empty
	// line of the text content is a record.
	Items string `yaml:"items"`
	// IDField is the field of a record that becomes the receipt (default: the record's
	// hash).
	IDField string `yaml:"id_field"`
	// None is a text answer that means nothing was found (e.g. "No matches found").
	None string `yaml:"none"`
}

// ClassRead is the scalar form of a read tool's class.
const ClassRead = "read"

// UnmarshalYAML accepts "read" or a mapping {effect, effect_id_argument, run_id_argument,
// lookup}, refusing unknown fields.
func (t *Tool) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		if n.Value != ClassRead {
			return fmt.Errorf("line %d: a tool's class is \"read\" or a mapping with effect: <action type>, not %q", n.Line, n.Value)
		}
		t.Read = true
		return nil
	}
	b, err := yaml.Marshal(n)
	if err != nil {
		return err
	}
	type plain Tool
	var p plain
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&p); err != nil {
		return fmt.Errorf("line %d: %s", n.Line, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	*t = Tool(p)
	return nil
}

var (
	toolNamePattern = regexp.MustCompile(`^[A-Za-z0-9_.\-/]{1,128}$`)
	argNamePattern  = regexp.MustCompile(`^[A-Za-z0-9_\-]{1,64}$`)
)

func (m *MCP) validate(p *Policy, e *errs) {
	if m == nil {
		return
	}
	if len(m.Upstreams) == 0 {
		e.add("mcp.upstreams", "name at least one upstream MCP server")
	}
	seen := map[string]string{} // tool → upstream
	for _, name := range sortedUpstreams(m.Upstreams) {
		u, f := m.Upstreams[name], "mcp.upstreams."+name
		if !namePattern.MatchString(name) {
			e.add(f, "a name is lowercase letters, digits and _ (at most 64)")
		}
		if u == nil {
			e.add(f, "empty")
			continue
		}
		u.Name = name
		switch {
		case u.Command == "" && u.URL == "":
			e.add(f, "give command (spawned, stdio) or url (streamable HTTP)")
		case u.Command != "" && u.URL != "":
			e.add(f, "give command or url, not both")
		case u.URL != "":
			if v, err := url.Parse(u.URL); err != nil || (v.Scheme != "http" && v.Scheme != "https") || v.Host == "" {
				e.add(f+".url", "must be an absolute http(s) URL")
			}
			if len(u.Args) > 0 || len(u.Env) > 0 {
				e.add(f, "args and env are for a command, not a url")
			}
		}
		for k := range u.Env {
			if strings.HasPrefix(k, "AIRLOCK_") || k == "" || strings.ContainsAny(k, "=\x00") {
				e.add(f+".env."+k, "not a variable an upstream may be given")
			}
		}
		if len(u.Tools) == 0 {
			e.add(f+".tools", "classify at least one tool (read, or effect: <action type>); unclassified tools are refused")
		}
		for _, tn := range sortedTools(u.Tools) {
			t, tf := u.Tools[tn], f+".tools."+tn
			if !toolNamePattern.MatchString(tn) {
				e.add(tf, "not a tool name")
			}
			if other, ok := seen[tn]; ok {
				e.add(tf, "also classified under upstream %s: the gateway lists one tool per name", other)
			}
			seen[tn] = name
			if t == nil {
				e.add(tf, "empty: read, or effect: <action type>")
				continue
			}
			if t.Read {
				continue
			}
			t.validate(p, u, tf, e)
		}
	}
}

func (t *Tool) validate(p *Policy, u *Upstream, f string, e *errs) {
	a := p.Actions[t.Effect]
	switch {
	case t.Effect == "":
		e.add(f+".effect", "required: the action type the call is planned under (or write the class as read)")
	case a == nil:
		e.add(f+".effect", "unknown action type %q (configure it under actions, connector: worker)", t.Effect)
	case a.Connector != ConnectorWorker:
		e.add(f+".effect", "action type %q must have connector: worker (the gateway performs it through the upstream)", t.Effect)
	case u.Name != "" && !a.ValidTarget(u.Name): // worker.targets lists names, and not this one
		e.add(f+".effect", "action type %q lists worker.targets; add the upstream's name %q (the target of its calls)", t.Effect, u.Name)
	}
	for _, arg := range []struct{ field, v string }{{"effect_id_argument", t.EffectIDArgument}, {"run_id_argument", t.RunIDArgument}} {
		if arg.v != "" && !argNamePattern.MatchString(arg.v) {
			e.add(f+"."+arg.field, "not an argument name")
		}
	}
	if l := t.Lookup; l != nil {
		lt := u.Tools[l.Tool]
		switch {
		case l.Tool == "":
			e.add(f+".lookup.tool", "required")
		case lt == nil || !lt.Read:
			e.add(f+".lookup.tool", "must be a tool of the same upstream classified read")
		}
		if l.Items != "" && !strings.HasPrefix(l.Items, "/") {
			e.add(f+".lookup.items", "a JSON pointer: empty, or starting with /")
		}
	}
}

func sortedUpstreams(m map[string]*Upstream) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func sortedTools(m map[string]*Tool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
