package policy

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/airlockhq/airlock/internal/connector/kinds"
)

// unknownFields reports every key of the document that no field of the policy takes, by
// its YAML path (actions.crm_note.http.idempotant), with the nearest known name when one
// is close: the decoder's own message names a Go type and a line.
func unknownFields(n *yaml.Node, t reflect.Type, path string, out *[]string) {
	if n == nil {
		return
	}
	if n.Kind == yaml.DocumentNode {
		for _, c := range n.Content {
			unknownFields(c, t, path, out)
		}
		return
	}
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	// Types that decode themselves (durations, inline JSON schemas) take any shape; an MCP
	// tool's class in its mapping form, and an action type (which decodes its connector
	// section by kind), are checked like any struct.
	if reflect.PointerTo(t).Implements(reflect.TypeFor[yaml.Unmarshaler]()) &&
		!((t == reflect.TypeFor[Tool]() || t == reflect.TypeFor[Action]()) && n.Kind == yaml.MappingNode) {
		return
	}
	join := func(k string) string {
		if path == "" {
			return k
		}
		return path + "." + k
	}
	switch {
	case t.Kind() == reflect.Struct && n.Kind == yaml.MappingNode:
		fields := map[string]reflect.Type{}
		var names []string
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if name == "-" || !f.IsExported() {
				continue
			}
			if name == "" {
				name = strings.ToLower(f.Name)
			}
			fields[name] = f.Type
			names = append(names, name)
			if t == reflect.TypeFor[Action]() && name == "gate" {
				// An action type's connector sections are the kinds' (in table order, where
				// the Action's own fields once listed them).
				for _, k := range kinds.Names() {
					fields[k] = reflect.TypeOf(kindSectionType(k))
					names = append(names, k)
				}
			}
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i].Value
			ft, ok := fields[k]
			if !ok {
				msg := join(k) + ": unknown field"
				if near := nearest(k, names); near != "" {
					msg += "; did you mean " + near + "?"
				}
				*out = append(*out, msg)
				continue
			}
			unknownFields(n.Content[i+1], ft, join(k), out)
		}
	case t.Kind() == reflect.Map && n.Kind == yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			unknownFields(n.Content[i+1], t.Elem(), join(n.Content[i].Value), out)
		}
	case t.Kind() == reflect.Slice && n.Kind == yaml.SequenceNode:
		for i, c := range n.Content {
			unknownFields(c, t.Elem(), path+"["+strconv.Itoa(i)+"]", out)
		}
	}
}

// nearest is the known name within a small edit distance of k, or "".
func nearest(k string, names []string) string {
	best, bestD := "", 1<<30
	for _, n := range names {
		if d := editDistance(strings.ToLower(k), n); d < bestD {
			best, bestD = n, d
		}
	}
	if bestD > 2 || bestD > max(1, len(best)/3) {
		return ""
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

// checkShape reports the document's unknown keys, or that it is empty.
func checkShape(b []byte) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return fmt.Errorf("%s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	if len(doc.Content) == 0 {
		return errors.New("the policy file is empty: it needs at least one section (actions, for one)")
	}
	var out []string
	unknownFields(&doc, reflect.TypeFor[Policy](), "", &out)
	if len(out) > 0 {
		return fmt.Errorf("%s", strings.Join(out, "; "))
	}
	return nil
}
