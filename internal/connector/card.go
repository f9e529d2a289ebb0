package connector

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
)

// Card is a proposed effect as the person at the gate reads it: what the connector will
// carry, field by field. The approval page shows it with one template; values are text,
// escaped there, never markup.
type Card struct {
	Heading string
	Fields  []CardField
	// Bodies are long texts (an email's text, an HTTP body, an argument), each shown in a
	// pre-wrapped block.
	Bodies []CardField
}

// CardField is one labelled value; Note is a short remark above it; Code shows it as
// code (a name or an id, not prose).
type CardField struct {
	Label, Value, Note string
	Code               bool
}

// NamedFields reads a JSON object as its fields in name order, each value as indented
// JSON (a string as itself); ok is false when raw is not an object.
func NamedFields(raw json.RawMessage) ([]CardField, bool) {
	var obj map[string]json.RawMessage
	if json.Unmarshal(raw, &obj) != nil || obj == nil {
		return nil, false
	}
	out := []CardField{}
	for _, k := range slices.Sorted(maps.Keys(obj)) {
		var s string
		if json.Unmarshal(obj[k], &s) != nil {
			s = PrettyJSON(obj[k])
		}
		out = append(out, CardField{Label: k, Value: s})
	}
	return out, true
}

// PrettyJSON is raw indented, or raw as it is when it is not JSON.
func PrettyJSON(raw json.RawMessage) string {
	var b bytes.Buffer
	if json.Indent(&b, raw, "", "  ") != nil {
		return string(raw)
	}
	return b.String()
}
