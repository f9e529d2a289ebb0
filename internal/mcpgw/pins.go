package mcpgw

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlockhq/airlock/internal/policy"
)

// Pinned tool definitions: an operator accepts the upstreams' catalogue (`airlock mcp
// tools --accept`), which records a digest of each tool's definition — name, description,
// input schema, annotations — in the pins file beside the policy. A tool whose definition
// differs from its pin afterwards (a "rug pull": a description rewritten to steer the
// model, a schema that grew an argument, annotations that changed) is refused
// (tool_changed, naming what changed) until an operator accepts the catalogue again.

// PinsVersion is the version of the pins file's format.
const PinsVersion = 1

// Pins is the accepted catalogue: each tool's pin by "upstream/tool".
type Pins struct {
	Version    int            `json:"version"`
	AcceptedAt time.Time      `json:"accepted_at"`
	AcceptedBy string         `json:"accepted_by,omitempty"`
	Tools      map[string]Pin `json:"tools"`
}

// Pin is one tool's accepted definition: the digest of the whole, a digest of each part
// (so a change can be named) and the class the policy gave it when accepted.
type Pin struct {
	Digest string            `json:"digest"`
	Parts  map[string]string `json:"parts"`
	Class  string            `json:"class"`
}

// The parts of a tool's definition a pin covers.
var pinParts = []string{"name", "description", "input_schema", "annotations"}

// PinsPath is where the pins of the policy file policyFile live: mcp.pins (relative to
// the policy file's directory), else the policy file's name with .pins.json added.
func PinsPath(policyFile string, m *policy.MCP) string {
	if m != nil && m.Pins != "" {
		if filepath.IsAbs(m.Pins) {
			return m.Pins
		}
		return filepath.Join(filepath.Dir(policyFile), m.Pins)
	}
	return policyFile + ".pins.json"
}

// LoadPins reads a pins file; a file that does not exist gives nil, nil (nothing pinned).
func LoadPins(path string) (*Pins, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var p Pins
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("pins file %s: %w", path, err)
	}
	if p.Version != PinsVersion {
		return nil, fmt.Errorf("pins file %s: version %d, want %d", path, p.Version, PinsVersion)
	}
	if p.Tools == nil {
		p.Tools = map[string]Pin{}
	}
	return &p, nil
}

// WritePins writes p to path atomically (a temporary file renamed over it).
func WritePins(path string, p *Pins) error {
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// PinOf computes the pin of a tool's definition (Class left empty).
func PinOf(t *mcp.Tool) (Pin, error) {
	var ann any
	if t.Annotations != nil {
		ann = t.Annotations
	}
	parts := map[string]any{"name": t.Name, "description": t.Description, "input_schema": t.InputSchema, "annotations": ann}
	p := Pin{Parts: map[string]string{}}
	for _, k := range pinParts {
		b, err := json.Marshal(parts[k])
		if err != nil {
			return Pin{}, fmt.Errorf("tool %s: %s: %w", t.Name, k, err)
		}
		h, err := canonicalHash(b)
		if err != nil {
			return Pin{}, fmt.Errorf("tool %s: %s: %w", t.Name, k, err)
		}
		p.Parts[k] = "sha256:" + h
	}
	whole, err := json.Marshal(p.Parts)
	if err != nil {
		return Pin{}, err
	}
	h, err := canonicalHash(whole)
	if err != nil {
		return Pin{}, err
	}
	p.Digest = "sha256:" + h
	return p, nil
}

// changed says what differs between a tool's current definition and its pin ("" when
// nothing does), e.g. "its description changed".
func changed(now Pin, pinned Pin, ok bool) string {
	if !ok {
		return "it was not offered when the catalogue was accepted"
	}
	if now.Digest == pinned.Digest {
		return ""
	}
	var parts []string
	for _, k := range pinParts {
		if now.Parts[k] != pinned.Parts[k] {
			parts = append(parts, strings.ReplaceAll(k, "_", " "))
		}
	}
	if len(parts) == 0 {
		return "its definition changed"
	}
	return "its " + strings.Join(parts, " and ") + " changed"
}

// Proposed is the class the MCP annotations suggest for an operator to review: read
// (readOnlyHint), gated effect (destructiveHint), otherwise effect. It only proposes:
// the policy decides, and at run time an annotation makes a call stricter, never looser.
func Proposed(t *mcp.Tool) string {
	a := t.Annotations
	switch {
	case a != nil && a.ReadOnlyHint:
		return "read"
	case a != nil && a.DestructiveHint != nil && *a.DestructiveHint:
		return "gated effect"
	}
	return "effect"
}

// annotatedDestructive reports a tool whose annotations say it destroys (destructiveHint
// true, not read-only): a tool the policy calls read is then refused, never passed.
func annotatedDestructive(t *mcp.Tool) bool {
	a := t.Annotations
	return a != nil && !a.ReadOnlyHint && a.DestructiveHint != nil && *a.DestructiveHint
}

// classOf is the policy's class of a tool as `airlock mcp tools` shows it.
func classOf(p *policy.Policy, t *policy.Tool) string {
	switch {
	case t == nil:
		return "unclassified"
	case t.Read:
		return "read"
	}
	if a := p.Action(t.Effect); a != nil && a.Gate != policy.GateNone {
		return "gated effect (" + t.Effect + ")"
	}
	return "effect (" + t.Effect + ")"
}

// CatalogueTool is one upstream tool as `airlock mcp tools` lists it.
type CatalogueTool struct {
	Upstream string
	Tool     *mcp.Tool
	Pin      Pin
	Class    string // the policy's
	Proposed string // the annotations'
	Changed  string // against the pins given ("" when it matches)
}

// Catalogue connects to every upstream of the policy (with connect; nil spawns or
// dials), lists their tools with their pins, and compares them with pins (nil: none).
func Catalogue(ctx context.Context, p *policy.Policy, pins *Pins, connect func(context.Context, *policy.Upstream) (mcp.Transport, error)) ([]CatalogueTool, error) {
	if connect == nil {
		connect = dial
	}
	var out []CatalogueTool
	for _, name := range sortedUpstreams(p.MCP.Upstreams) {
		u := p.MCP.Upstreams[name]
		t, err := connect(ctx, u)
		if err != nil {
			return nil, fmt.Errorf("upstream %s: %w", name, err)
		}
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "airlock-mcp", Version: "1"}, nil).Connect(ctx, t, nil)
		if err != nil {
			return nil, fmt.Errorf("upstream %s: connect: %w", name, err)
		}
		for tool, err := range cs.Tools(ctx, nil) {
			if err != nil {
				cs.Close()
				return nil, fmt.Errorf("upstream %s: list tools: %w", name, err)
			}
			pin, err := PinOf(tool)
			if err != nil {
				cs.Close()
				return nil, err
			}
			ct := CatalogueTool{Upstream: name, Tool: tool, Pin: pin, Class: classOf(p, u.Tools[tool.Name]), Proposed: Proposed(tool)}
			if pins != nil {
				old, ok := pins.Tools[name+"/"+tool.Name]
				ct.Changed = changed(pin, old, ok)
			}
			out = append(out, ct)
		}
		cs.Close()
	}
	return out, nil
}

// Accept makes the pins of a catalogue: every tool as it is now, with its policy class.
func Accept(tools []CatalogueTool, by string, now time.Time) *Pins {
	p := &Pins{Version: PinsVersion, AcceptedAt: now.UTC(), AcceptedBy: by, Tools: map[string]Pin{}}
	for _, t := range tools {
		pin := t.Pin
		pin.Class = t.Class
		p.Tools[t.Upstream+"/"+t.Tool.Name] = pin
	}
	return p
}

// checkPin is what the gateway says of a tool at start or after a list_changed: "" when
// it may be called, else why not (what changed against its pin). Without pins nothing is
// checked.
func (g *Gateway) checkPin(upstream string, t *mcp.Tool) string {
	if g.opts.Pins == nil {
		return ""
	}
	now, err := PinOf(t)
	if err != nil {
		return "its definition cannot be read: " + err.Error()
	}
	old, ok := g.opts.Pins.Tools[upstream+"/"+t.Name]
	return changed(now, old, ok)
}

// relist reads an upstream's tools again after its list_changed notification: a tool
// whose definition no longer matches its pin is refused from then on (a definition that
// matches again is allowed again). New tools are not added to the gateway's list.
func (g *Gateway) relist(ctx context.Context, upstream string, cs *mcp.ClientSession) {
	seen := map[string]bool{}
	for tool, err := range cs.Tools(ctx, nil) {
		if err != nil {
			g.opts.Log.Warn("could not list an upstream's tools after it said they changed", "upstream", upstream, "err", err)
			if g.opts.Pins == nil {
				return
			}
			g.mu.Lock() // refused until the gateway restarts: nothing is known to be accepted
			for name, r := range g.routes {
				if r.upstream == upstream {
					r.changed = "its tools could not be listed after the upstream said they changed"
					g.routes[name] = r
				}
			}
			g.mu.Unlock()
			return
		}
		seen[tool.Name] = true
		why := g.checkPin(upstream, tool) // "" without pins: definitions are not checked
		g.mu.Lock()
		if r, ok := g.routes[tool.Name]; ok && r.upstream == upstream {
			r.changed = why
			r.def = tool
			g.routes[tool.Name] = r
		}
		g.mu.Unlock()
		if why != "" {
			g.opts.Log.Warn("an upstream tool's definition no longer matches its pin: its calls are refused (tool_changed) until an operator accepts the catalogue again (airlock mcp tools --accept)",
				"upstream", upstream, "tool", tool.Name, "changed", why)
		}
	}
	if g.opts.Pins == nil {
		return
	}
	g.mu.Lock()
	for name, r := range g.routes {
		if r.upstream == upstream && !seen[name] {
			r.changed = "the upstream no longer offers it"
			g.routes[name] = r
		}
	}
	g.mu.Unlock()
}

// Changed says what differs between a tool's pin now and its accepted pin in p under key
// ("upstream/tool"): "" when nothing does.
func Changed(now Pin, p *Pins, key string) string {
	old, ok := p.Tools[key]
	return changed(now, old, ok)
}
