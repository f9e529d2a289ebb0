package validation

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/message"
)

// secret stands in for model output that must never reach an audit event.
const secret = "SECRET-7f3a9-do-not-log"

const ticketSchema = `{
  "type": "object",
  "required": ["ticket_id", "status", "body"],
  "additionalProperties": false,
  "properties": {
    "ticket_id": {"type": "string", "pattern": "^T-[0-9]+$"},
    "status":    {"enum": ["open", "pending", "closed"]},
    "kind":      {"const": "reply"},
    "body":      {"type": "string", "maxLength": 20},
    "email":     {"type": "string", "format": "email"},
    "priority":  {"type": "integer", "minimum": 1, "maximum": 5},
    "items": {
      "type": "array",
      "items": {
        "type": "object",
        "required": ["label"],
        "properties": {"label": {"type": "string", "maxLength": 5}}
      }
    },
    "meta": {
      "type": "object",
      "properties": {"a/b": {"type": "string"}, "c~d": {"type": "string"}}
    }
  }
}`

func mustCompile(t *testing.T, doc string) *Schema {
	t.Helper()
	s, err := Compile("test.schema", []byte(doc))
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	return s
}

func mustDecode(t *testing.T, doc string) any {
	t.Helper()
	v, err := Decode([]byte(doc))
	if err != nil {
		t.Fatalf("Decode(%s): %v", doc, err)
	}
	return v
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCompileErrors(t *testing.T) {
	dir := t.TempDir()
	badFile := writeFile(t, dir, "bad.json", `{"description": "`+secret+`", "type": }`)
	badSchemaFile := writeFile(t, dir, "badschema.json", `{"description": "`+secret+`", "type": 5}`)
	danglingRef := writeFile(t, dir, "dangling.json", `{"$ref": "missing.json"}`)

	tests := []struct {
		name    string
		compile func() (*Schema, error)
		want    []string // substrings of the error
	}{
		{"invalid JSON",
			func() (*Schema, error) { return Compile("actions.ticket_reply.schema", []byte(`{"type": "object",}`)) },
			[]string{"schema actions.ticket_reply.schema", "invalid JSON at line 1, column 19"}},
		{"truncated JSON",
			func() (*Schema, error) { return Compile("s", []byte(`{"type":`)) },
			[]string{"schema s: invalid JSON: unexpected end of input"}},
		{"empty document",
			func() (*Schema, error) { return Compile("s", nil) },
			[]string{"schema s: invalid JSON: empty input"}},
		{"trailing data",
			func() (*Schema, error) { return Compile("s", []byte(`{} {}`)) },
			[]string{"unexpected data after top-level value"}},
		{"type is a number",
			func() (*Schema, error) { return Compile("actions.x.schema", []byte(`{"type": 5}`)) },
			[]string{"schema actions.x.schema: not a valid JSON Schema", `at "/type"`, "got number, want array"}},
		{"invalid regex",
			func() (*Schema, error) { return Compile("s", []byte(`{"pattern": "("}`)) },
			[]string{`at "/pattern"`, "not valid regex"}},
		{"https $ref is refused",
			func() (*Schema, error) { return Compile("s", []byte(`{"$ref": "https://example.com/s.json"}`)) },
			[]string{`"https://example.com/s.json"`, "remote $ref loading is disabled"}},
		{"http $schema is refused",
			func() (*Schema, error) { return Compile("s", []byte(`{"$schema": "http://example.com/meta"}`)) },
			[]string{"remote $ref loading is disabled"}},
		{"relative $ref in inline schema does not touch the cwd",
			func() (*Schema, error) { return Compile("s", []byte(`{"$ref": "other.json"}`)) },
			[]string{"remote $ref loading is disabled"}},
		{"missing file",
			func() (*Schema, error) { return CompileFile(filepath.Join(dir, "nope.json")) },
			[]string{"schema file " + filepath.Join(dir, "nope.json") + ": no such file or directory"}},
		{"file with invalid JSON",
			func() (*Schema, error) { return CompileFile(badFile) },
			[]string{"schema file " + badFile + ": invalid JSON at line 1"}},
		{"file with invalid schema",
			func() (*Schema, error) { return CompileFile(badSchemaFile) },
			[]string{"schema file " + badSchemaFile + ": not a valid JSON Schema"}},
		{"file with dangling relative $ref",
			func() (*Schema, error) { return CompileFile(danglingRef) },
			[]string{"schema file " + danglingRef, "missing.json", "no such file or directory"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			s, err := tt.compile()
			if err == nil {
				t.Fatalf("got schema %v, want error", s)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("took %v; remote refs must fail fast, not hang", d)
			}
			msg := err.Error()
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not contain %q", msg, w)
				}
			}
			if strings.Contains(msg, secret) || strings.Contains(msg, "\n") {
				t.Errorf("error dumps file content or spans lines: %q", msg)
			}
		})
	}
}

func TestCompileFile(t *testing.T) {
	dir := t.TempDir()
	main := writeFile(t, dir, "reply.json", `{"type": "object", "properties": {"to": {"$ref": "email.json"}}}`)
	writeFile(t, dir, "email.json", `{"type": "string", "maxLength": 3}`)
	s, err := CompileFile(main)
	if err != nil {
		t.Fatal(err)
	}
	if errs := s.Validate(mustDecode(t, `{"to": "abc"}`)); errs != nil {
		t.Errorf("valid value: got %v", errs)
	}
	want := []Error{{Pointer: "/to", Keyword: "maxLength", Message: "maxLength: got 4, want 3"}}
	if got := s.Validate(mustDecode(t, `{"to": "abcd"}`)); !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestDraftSelection(t *testing.T) {
	// Tuple-form "items" is only legal before 2020-12.
	tuple := `"type": "array", "items": [{"type": "string"}]`
	if _, err := Compile("s", []byte(`{`+tuple+`}`)); err == nil {
		t.Error("array-valued items compiled under the default draft; want 2020-12 to reject it")
	}
	s := mustCompile(t, `{"$schema": "http://json-schema.org/draft-07/schema#", `+tuple+`}`)
	got := s.Validate(mustDecode(t, `[1]`))
	if len(got) != 1 || got[0].Pointer != "/0" || got[0].Keyword != "type" {
		t.Errorf("draft-07 tuple validation: got %v", got)
	}
}

func TestValidate(t *testing.T) {
	s := mustCompile(t, ticketSchema)
	type want struct{ ptr, kw, msg string } // msg: substring
	tests := []struct {
		name  string
		value string
		want  []want
	}{
		{"valid minimal", `{"ticket_id": "T-1", "status": "open", "body": "hi"}`, nil},
		{"valid full", `{"ticket_id": "T-12", "status": "closed", "body": "thanks", "kind": "reply",
			"email": "a@example.com", "priority": 5, "items": [{"label": "x"}], "meta": {"a/b": "y"}}`, nil},
		{"missing required", `{"ticket_id": "T-1"}`, []want{
			{"", "required", "missing properties 'status', 'body'"}}},
		{"enum", `{"ticket_id": "T-1", "status": "solved", "body": "hi"}`, []want{
			{"/status", "enum", `must be one of the allowed values: "open", "pending", "closed"`}}},
		{"maxLength", `{"ticket_id": "T-1", "status": "open", "body": "this body is far too long"}`, []want{
			{"/body", "maxLength", "maxLength: got 25, want 20"}}},
		{"additionalProperties", `{"ticket_id": "T-1", "status": "open", "body": "hi", "cc": "x"}`, []want{
			{"", "additionalProperties", "additional properties 'cc' not allowed"}}},
		{"root type", `["not", "an", "object"]`, []want{
			{"", "type", "got array, want object"}}},
		{"nested array pointer", `{"ticket_id": "T-1", "status": "open", "body": "hi",
			"items": [{"label": "a"}, {"label": "b"}, {"label": "toolong"}, {}]}`, []want{
			{"/items/2/label", "maxLength", "got 7, want 5"},
			{"/items/3", "required", "missing property 'label'"}}},
		{"keys needing escaping", `{"ticket_id": "T-1", "status": "open", "body": "hi",
			"meta": {"a/b": 1, "c~d": 2}}`, []want{
			{"/meta/a~1b", "type", "got number, want string"},
			{"/meta/c~0d", "type", "got number, want string"}}},
		{"several, sorted by pointer then keyword", `{"ticket_id": "X", "status": "nope", "priority": 9, "zz": 1}`, []want{
			{"", "additionalProperties", "'zz'"},
			{"", "required", "missing property 'body'"},
			{"/priority", "maximum", "maximum: got 9, want 5"},
			{"/status", "enum", "allowed values"},
			{"/ticket_id", "pattern", `does not match the required pattern "^T-[0-9]+$"`}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := s.Validate(mustDecode(t, tt.value))
			if tt.want == nil {
				if got != nil {
					t.Fatalf("got %v, want nil", got)
				}
				return
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %d errors %v, want %d", len(got), got, len(tt.want))
			}
			for i, w := range tt.want {
				g := got[i]
				if g.Pointer != w.ptr || g.Keyword != w.kw || !strings.Contains(g.Message, w.msg) {
					t.Errorf("error %d = %+v, want pointer %q keyword %q message containing %q", i, g, w.ptr, w.kw, w.msg)
				}
			}
		})
	}
}

func TestValidateNumbers(t *testing.T) {
	s := mustCompile(t, `{"type": "integer", "maximum": 9007199254740993}`)
	// json.Number keeps this exact; as float64 it would round to ...992.
	if got := s.Validate(mustDecode(t, `9007199254740993`)); got != nil {
		t.Errorf("big integer: %v", got)
	}
	if got := s.Validate(mustDecode(t, `9007199254740994`)); len(got) != 1 || got[0].Keyword != "maximum" {
		t.Errorf("big integer over maximum: %v", got)
	}
	// Values from a plain json.Unmarshal (float64) are accepted too.
	var v any
	if err := json.Unmarshal([]byte(`1.5`), &v); err != nil {
		t.Fatal(err)
	}
	if got := s.Validate(v); len(got) != 1 || got[0].Keyword != "type" {
		t.Errorf("float64 1.5 against integer: %v", got)
	}
	// A Go struct is not a decoded JSON value.
	if got := s.Validate(struct{}{}); len(got) != 1 || got[0].Keyword != "type" {
		t.Errorf("struct: %v", got)
	}
}

func TestValidateDedupAndCap(t *testing.T) {
	s := mustCompile(t, `{"anyOf": [{"required": ["a"]}, {"required": ["a"]}]}`)
	want := []Error{{Pointer: "", Keyword: "required", Message: "missing property 'a'"}}
	if got := s.Validate(mustDecode(t, `{}`)); !slices.Equal(got, want) {
		t.Errorf("duplicates: got %v, want %v", got, want)
	}

	s = mustCompile(t, `{"type": "array", "items": {"type": "string"}}`)
	got := s.Validate(mustDecode(t, "["+strings.Repeat("1,", 99)+"1]"))
	if len(got) != maxErrors {
		t.Fatalf("got %d errors, want %d", len(got), maxErrors)
	}
	if !slices.IsSortedFunc(got, cmpErrors) {
		t.Error("errors are not sorted")
	}
}

func TestPrivacy(t *testing.T) {
	s := mustCompile(t, `{
	  "type": "object",
	  "properties": {
	    "enum":    {"enum": ["a", "b"]},
	    "bigenum": {"enum": [`+strings.Repeat(`"x",`, 20)+`"y"]},
	    "const":   {"const": "reply"},
	    "pattern": {"pattern": "^[0-9]+$"},
	    "format":  {"format": "email"},
	    "ipv4":    {"format": "ipv4"},
	    "date":    {"format": "date"},
	    "max":     {"maxLength": 3},
	    "type":    {"type": "integer"},
	    "anyOf":   {"anyOf": [{"const": 1}, {"enum": [2, 3]}, {"pattern": "^z"}]},
	    "not":     {"not": {"type": "string"}}
	  }
	}`)
	keys := []string{"enum", "bigenum", "const", "pattern", "format", "ipv4", "date", "max", "type", "anyOf", "not"}
	obj := map[string]any{}
	for _, k := range keys {
		obj[k] = secret + " " + k
	}
	got := s.Validate(obj)
	seen := map[string]bool{}
	for _, e := range got {
		seen[e.Keyword] = true
		if strings.Contains(e.Message, secret) || strings.Contains(e.Message, "7f3a9") {
			t.Errorf("message leaks the instance value: %+v", e)
		}
	}
	for _, kw := range []string{"enum", "const", "pattern", "format", "maxLength", "type", "not"} {
		if !seen[kw] {
			t.Errorf("no %q violation among %v", kw, got)
		}
	}
	b, _ := json.Marshal(got)
	if strings.Contains(string(b), secret) {
		t.Errorf("serialized errors leak the instance value: %s", b)
	}
}

// customKind stands for an ErrorKind the allow-list does not know.
type customKind struct{}

func (customKind) KeywordPath() []string                   { return []string{"x-custom"} }
func (customKind) LocalizedString(*message.Printer) string { return "got " + secret }

// TestSafeMessageKinds exercises the value-carrying kinds directly,
// including ones (contentEncoding, contentMediaType) that airlock's compiler
// settings never assert, so a future settings change cannot leak.
func TestSafeMessageKinds(t *testing.T) {
	leak := fmt.Errorf("decoder said %q", secret)
	kinds := []jsonschema.ErrorKind{
		&kind.Enum{Got: secret, Want: []any{"a", json.Number("1")}},
		&kind.Enum{Got: secret, Want: []any{map[string]any{"k": "v"}}},
		&kind.Const{Got: secret, Want: "c"},
		&kind.Format{Got: secret, Want: "email", Err: leak},
		&kind.Pattern{Got: secret, Want: "^a$"},
		&kind.ContentEncoding{Want: "base64", Err: leak},
		&kind.ContentMediaType{Got: []byte(secret), Want: "application/json", Err: leak},
		&kind.Type{Got: "string", Want: []string{"integer"}},
		customKind{},
	}
	for _, k := range kinds {
		msg := safeMessage(k)
		if strings.Contains(msg, secret) || msg == "" {
			t.Errorf("%T: message %q", k, msg)
		}
	}
	if got := safeMessage(customKind{}); got != "fails x-custom" {
		t.Errorf("unknown kind: %q", got)
	}
}

func TestDecode(t *testing.T) {
	v := mustDecode(t, `{"n": 12345678901234567890, "a": [true, null]}`)
	if n, ok := v.(map[string]any)["n"].(json.Number); !ok || n.String() != "12345678901234567890" {
		t.Errorf("number decoded as %T %v, want exact json.Number", v.(map[string]any)["n"], v.(map[string]any)["n"])
	}
	for _, bad := range []string{`{"a": ` + secret + `}`, `{"a": "` + secret + `"`, `{} ` + secret, ``} {
		_, err := Decode([]byte(bad))
		if err == nil {
			t.Errorf("Decode(%q): no error", bad)
		} else if strings.Contains(err.Error(), "SECRET") || strings.Contains(err.Error(), "'S'") {
			t.Errorf("Decode error quotes the input: %v", err)
		}
	}
}

func TestRepair(t *testing.T) {
	tests := []struct {
		name, text, want string // want "" means not found
	}{
		{"json fence in prose",
			"Sure! Here is the reply:\n```json\n{\"status\": \"open\"}\n```\nLet me know.", `{"status": "open"}`},
		{"bare fence",
			"Result:\n```\n{\"a\": [1, 2]}\n```", `{"a": [1, 2]}`},
		{"non-JSON fence is skipped",
			"```python\nprint({1})\n```\nAnswer: {\"a\": 1}", `{"a": 1}`},
		{"invalid JSON in fence is not fixed",
			"```json\n{\"a\": 1,}\n```", ""},
		{"fence marker inside a JSON string",
			"```json\n{\"body\": \"run ```ls``` now\"}\n```", `{"body": "run ` + "```ls```" + ` now"}`},
		{"braces and escaped quotes in strings",
			`Here you go: {"msg": "use {braces} and \"quotes\" }", "path": "C:\\"} -- done {`,
			`{"msg": "use {braces} and \"quotes\" }", "path": "C:\\"}`},
		{"nested objects",
			`Answer: {"a": {"b": {"c": [1, {"d": 2}]}}} end.`, `{"a": {"b": {"c": [1, {"d": 2}]}}}`},
		{"no JSON", "I'm sorry, I can't help with that.", ""},
		{"empty", "", ""},
		{"unbalanced object", `Here: {"a": {"b": 1}`, ""},
		{"unterminated string", `Here: {"a": "b}`, ""},
		{"array only", `The labels are [{"x": 1}, {"x": 2}] as requested.`, `[{"x": 1}, {"x": 2}]`},
		{"array of scalars", `Numbers: [1, 2, 3].`, `[1, 2, 3]`},
		{"truncated array around an object", `Items: [{"x": 1}, {"x":`, ""},
		{"first of two objects", `First {"a": 1} then {"b": 2}.`, `{"a": 1}`},
		{"invalid braces before the object are skipped", `Note {this} then {"a": 1}`, `{"a": 1}`},
		{"citation before the object", `As shown in [1], the answer is {"a": 1}.`, `{"a": 1}`},
		{"plain JSON", "  {\"a\": 1}\n", `{"a": 1}`},
		{"plain JSON array", `[1]`, `[1]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := Repair(tt.text)
			if ok != (tt.want != "") || string(got) != tt.want {
				t.Errorf("Repair(%q) = %q, %v; want %q", tt.text, got, ok, tt.want)
			}
		})
	}
}

func TestConcurrentValidate(t *testing.T) {
	s := mustCompile(t, ticketSchema)
	v := mustDecode(t, `{"ticket_id": "T-1", "status": "bad", "body": "hi"}`)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				if got := s.Validate(v); len(got) != 1 {
					t.Errorf("got %v", got)
					return
				}
			}
		})
	}
	wg.Wait()
}

// Model output is JSON inside a JSON string, so the request decoder's
// depth cap does not reach it; Decode allowed encoding/json's 10,000 levels, each of
// which the schema validator then walked. Deeper than MaxDepth is refused here too.
func TestDecodeRefusesDeepNesting(t *testing.T) {
	for _, c := range []struct {
		doc  string
		deep bool
	}{
		{strings.Repeat("[", 9_000) + strings.Repeat("]", 9_000), true},
		{strings.Repeat(`{"a":`, 65) + "1" + strings.Repeat("}", 65), true},
		{strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth), false},
		{`{"s":"` + strings.Repeat("[", 200) + `\"{{{"}`, false}, // brackets in strings are text
	} {
		_, err := Decode([]byte(c.doc))
		if got := err != nil && strings.Contains(err.Error(), "deeper than 64"); got != c.deep {
			t.Errorf("Decode(%.40s…) = %v; want refused for depth: %v", c.doc, err, c.deep)
		}
	}
	if Depth([]byte(`"[[["`)) != 0 || Depth([]byte(`[{"a":["\\"]"]}]`)) != 3 {
		t.Error("Depth counts brackets inside strings")
	}
}
