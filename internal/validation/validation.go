// Package validation checks AI model output against the JSON Schema
// configured for an action type, before any side effect happens.
//
// It wraps github.com/santhosh-tekuri/jsonschema/v6 with three airlock
// specific guarantees:
//
//   - schemas are compiled offline: only the embedded meta-schemas and local
//     files can be referenced, never http(s) URLs;
//   - violations are flattened into small, sorted, de-duplicated [Error]
//     values whose messages never quote the model output, because they are
//     stored in audit events;
//   - [Repair] extracts (never rewrites) a JSON value that a model wrapped in
//     prose or a Markdown code fence.
package validation

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"iter"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// maxErrors caps the violations returned by [Schema.Validate] so that a
// pathological output (say, 10k bad array items) cannot bloat audit events.
const maxErrors = 50

// printer renders the library's messages; English keeps audit logs stable.
var printer = message.NewPrinter(language.English)

// Schema is a compiled JSON Schema (draft 2020-12 unless the document says
// otherwise via $schema). It is immutable and safe for concurrent use.
type Schema struct{ s *jsonschema.Schema }

// Compile compiles an inline schema document (JSON bytes). name is used in
// error messages (e.g. "actions.ticket_reply.schema").
//
// The document gets a synthetic non-file base URI, so a relative $ref in it
// does not silently resolve against the process's working directory.
func Compile(name string, doc []byte) (*Schema, error) {
	v, err := Decode(doc)
	if err != nil {
		return nil, fmt.Errorf("schema %s: %w", name, err)
	}
	s, err := compile("airlock-inline:///"+url.PathEscape(name), v)
	if err != nil {
		return nil, fmt.Errorf("schema %s: %w", name, err)
	}
	return s, nil
}

// CompileFile compiles a schema from a file path (JSON). Error messages name
// the file but never dump its content. Relative $refs resolve against the
// file's directory.
func CompileFile(path string) (*Schema, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the path is already in our prefix
		}
		return nil, fmt.Errorf("schema file %s: %w", path, err)
	}
	v, err := Decode(b)
	if err != nil {
		return nil, fmt.Errorf("schema file %s: %w", path, err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("schema file %s: %w", path, err)
	}
	s, err := compile(abs, v)
	if err != nil {
		return nil, fmt.Errorf("schema file %s: %w", path, err)
	}
	return s, nil
}

// compile registers doc under loc and compiles it with airlock's settings.
func compile(loc string, doc any) (*Schema, error) {
	c := jsonschema.NewCompiler()
	// Pin the draft: the library's default follows its latest draft and
	// may change under us on upgrade.
	c.DefaultDraft(jsonschema.Draft2020)
	// Draft 2020-12 treats "format" as an annotation only; airlock wants
	// "format": "email" to actually reject a bad address before sending.
	c.AssertFormat()
	c.UseLoader(offlineLoader{})
	if err := c.AddResource(loc, doc); err != nil {
		return nil, err
	}
	s, err := c.Compile(loc)
	if err != nil {
		return nil, schemaError(err)
	}
	return &Schema{s: s}, nil
}

// schemaError flattens the library's multi-line meta-schema report (which
// also names our synthetic base URI) into one line listing the leaf
// problems. The schema is operator config, not model output, so the
// library's own wording, which may quote schema values, is kept.
func schemaError(err error) error {
	var sve *jsonschema.SchemaValidationError
	var ve *jsonschema.ValidationError
	if !errors.As(err, &sve) || !errors.As(sve.Err, &ve) {
		return err
	}
	var leaves []Error
	collect(ve, func(k jsonschema.ErrorKind) string { return k.LocalizedString(printer) }, &leaves)
	slices.SortFunc(leaves, cmpErrors)
	msgs := make([]string, 0, len(leaves))
	for _, l := range slices.Compact(leaves) {
		msgs = append(msgs, fmt.Sprintf("at %q: %s", l.Pointer, l.Message))
	}
	return fmt.Errorf("not a valid JSON Schema: %s", strings.Join(msgs, "; "))
}

// offlineLoader resolves $refs that are not in the document itself. The
// library's default loader already refuses non-file URLs (meta-schemas are
// embedded), but we pin that here with an explicit message so that a schema
// pointing at https://... fails fast and clearly instead of depending on
// library defaults that could one day include an HTTP client.
type offlineLoader struct{}

func (offlineLoader) Load(u string) (any, error) {
	if strings.HasPrefix(u, "file://") {
		return jsonschema.FileLoader{}.Load(u)
	}
	return nil, errors.New("remote $ref loading is disabled (no network access); inline the referenced schema or use a local file")
}

// Error is one schema violation: a JSON pointer into the value (RFC 6901,
// "" for the root), the failing keyword (e.g. "required", "enum",
// "maxLength", "type", "additionalProperties"), and a message.
//
// Message never contains string content from the validated value; it may
// name object keys (which also appear in Pointer) and, for numeric keywords
// such as "maximum", the offending number.
type Error struct {
	Pointer string `json:"pointer"`
	Keyword string `json:"keyword"`
	Message string `json:"message"`
}

// Validate checks a decoded JSON value and returns nil when valid, else the
// leaf violations, sorted by pointer then keyword (then message),
// de-duplicated, at most 50.
//
// value should come from [Decode] (numbers as json.Number, which keeps
// big integers exact); values from a plain json.Unmarshal into any
// (float64 numbers) work too. Go structs or typed maps are not JSON
// values and fail with keyword "type".
func (s *Schema) Validate(value any) []Error {
	err := s.s.Validate(value)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		// Not expected from the library; never echo err, it may embed the value.
		return []Error{{Keyword: "", Message: "validation failed"}}
	}
	var out []Error
	collect(ve, safeMessage, &out)
	slices.SortFunc(out, cmpErrors)
	out = slices.Compact(out)
	if len(out) > maxErrors {
		out = out[:maxErrors]
	}
	return out
}

func cmpErrors(a, b Error) int {
	if c := strings.Compare(a.Pointer, b.Pointer); c != 0 {
		return c
	}
	if c := strings.Compare(a.Keyword, b.Keyword); c != 0 {
		return c
	}
	return strings.Compare(a.Message, b.Message)
}

// collect appends the leaves of the cause tree. Inner nodes ($ref, allOf,
// properties groups, ...) only say "something below failed"; the leaves are
// the actionable violations.
func collect(e *jsonschema.ValidationError, msg func(jsonschema.ErrorKind) string, out *[]Error) {
	if len(e.Causes) == 0 {
		*out = append(*out, Error{
			Pointer: pointer(e.InstanceLocation),
			Keyword: keyword(e.ErrorKind),
			Message: msg(e.ErrorKind),
		})
		return
	}
	for _, c := range e.Causes {
		collect(c, msg, out)
	}
}

// escaper encodes a reference token per RFC 6901; it works in a single
// pass, so an existing "~1" becomes "~01" rather than being double-escaped.
var escaper = strings.NewReplacer("~", "~0", "/", "~1")

// pointer renders an RFC 6901 JSON pointer ("" is the whole document).
func pointer(tokens []string) string {
	var sb strings.Builder
	for _, t := range tokens {
		sb.WriteByte('/')
		sb.WriteString(escaper.Replace(t))
	}
	return sb.String()
}

// keyword names the schema keyword that failed. It uses the first element
// of KeywordPath: for every built-in kind that is the keyword itself, while
// for the two-element paths (dependentRequired/<prop>, dependency/<prop>)
// the last element would be a property name instead.
func keyword(k jsonschema.ErrorKind) string {
	if p := k.KeywordPath(); len(p) > 0 {
		return p[0]
	}
	switch k.(type) {
	case *kind.FalseSchema:
		return "false"
	case *kind.Not:
		return "not"
	case *kind.RefCycle:
		return "$ref"
	case *kind.InvalidJsonValue:
		return "type"
	}
	return ""
}

// safeMessage renders k without the validated value. It is an allow-list:
// kinds whose library message embeds the value (enum/const for future
// versions, format, pattern, content*) get our own wording, kinds known to
// print only schema-side or structural data use the library's message, and
// anything else (e.g. a custom vocabulary) gets a generic message.
func safeMessage(k jsonschema.ErrorKind) string {
	switch k := k.(type) {
	case *kind.Enum:
		if l, ok := shortList(k.Want); ok {
			return "must be one of the allowed values: " + l
		}
		return "must be one of the allowed values"
	case *kind.Const:
		if l, ok := shortList([]any{k.Want}); ok {
			return "must equal the constant " + l
		}
		return "must equal the constant value"
	case *kind.Format:
		return "is not a valid " + k.Want
	case *kind.Pattern:
		return fmt.Sprintf("does not match the required pattern %q", k.Want)
	case *kind.ContentEncoding:
		return "is not valid " + k.Want + "-encoded content"
	case *kind.ContentMediaType:
		return "is not valid " + k.Want + " content"
	case *kind.Type, *kind.Required, *kind.AdditionalProperties,
		*kind.AdditionalItems, *kind.PropertyNames, *kind.Dependency,
		*kind.DependentRequired, *kind.MinLength, *kind.MaxLength,
		*kind.MinItems, *kind.MaxItems, *kind.MinProperties,
		*kind.MaxProperties, *kind.UniqueItems, *kind.Contains,
		*kind.MinContains, *kind.MaxContains, *kind.Minimum, *kind.Maximum,
		*kind.ExclusiveMinimum, *kind.ExclusiveMaximum, *kind.MultipleOf,
		*kind.AllOf, *kind.AnyOf, *kind.OneOf, *kind.Not, *kind.FalseSchema,
		*kind.RefCycle, *kind.InvalidJsonValue, *kind.ContentSchema:
		return k.LocalizedString(printer)
	}
	if kw := keyword(k); kw != "" {
		return "fails " + kw
	}
	return "validation failed"
}

// shortList renders schema-side values as compact JSON when they fit in a
// short message; long lists are better read from the schema itself.
func shortList(vs []any) (string, bool) {
	if len(vs) > 10 {
		return "", false
	}
	parts := make([]string, len(vs))
	n := 0
	for i, v := range vs {
		b, err := json.Marshal(v)
		if err != nil {
			return "", false
		}
		parts[i] = string(b)
		n += len(b)
	}
	if n > 200 {
		return "", false
	}
	return strings.Join(parts, ", "), true
}

// Decode parses JSON bytes into the value form Validate expects: any with
// objects as map[string]any, arrays as []any and numbers as json.Number
// (exact, unlike float64). Trailing data after the value is an error.
// Error messages give a position but never quote the input.
func Decode(b []byte) (any, error) {
	if Depth(b) > MaxDepth {
		return nil, fmt.Errorf("invalid JSON: nests objects and arrays deeper than %d levels", MaxDepth)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		var se *json.SyntaxError
		switch {
		case errors.As(err, &se):
			line := 1 + bytes.Count(b[:se.Offset], []byte("\n"))
			col := int(se.Offset) - bytes.LastIndexByte(b[:se.Offset], '\n') - 1
			return nil, fmt.Errorf("invalid JSON at line %d, column %d (byte offset %d)", line, col, se.Offset)
		case errors.Is(err, io.EOF):
			return nil, errors.New("invalid JSON: empty input")
		case errors.Is(err, io.ErrUnexpectedEOF):
			return nil, errors.New("invalid JSON: unexpected end of input")
		}
		return nil, errors.New("invalid JSON")
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, fmt.Errorf("invalid JSON: unexpected data after top-level value at byte offset %d", d.InputOffset())
	}
	return v, nil
}

// Repair finds the JSON value in model output that is not plain JSON: a
// fenced code block (```json ... ``` or ``` ... ```), or else the first
// balanced {...} object (or [...] array if no object) embedded in prose,
// scanning with awareness of JSON strings and escapes so braces inside
// strings do not confuse it. Returns the extracted JSON bytes and true if
// what it found parses as JSON; false otherwise. It never "fixes" JSON (no
// quote or comma guessing): extraction only.
//
// It errs on the side of false: a truncated object or array is never
// mined for a smaller, valid fragment inside it, since that fragment could
// pass a lax schema while not being what the model meant.
func Repair(text string) ([]byte, bool) {
	if t := strings.TrimSpace(text); json.Valid([]byte(t)) {
		return []byte(t), true
	}
	for body := range fences(text) {
		if json.Valid([]byte(body)) {
			return []byte(body), true
		}
	}

	objStart, objEnd := -1, -1
	for s, e := range spans(text, '{', '}') {
		if e < 0 {
			return nil, false // truncated object: do not mine it for arrays
		}
		if json.Valid([]byte(text[s:e])) {
			objStart, objEnd = s, e
			break
		}
	}
	for s, e := range spans(text, '[', ']') {
		if objStart >= 0 && s > objStart {
			break // array starts after the object: the object wins
		}
		if e < 0 {
			return nil, false // truncated array (possibly around the object)
		}
		if objStart >= 0 && e < objEnd {
			continue // an earlier array such as a "[1]" citation
		}
		if json.Valid([]byte(text[s:e])) {
			return []byte(text[s:e]), true // no object, or the object is an element
		}
		if objStart >= 0 {
			return nil, false // the object sits inside a broken array
		}
	}
	if objStart >= 0 {
		return []byte(text[objStart:objEnd]), true
	}
	return nil, false
}

// fences yields the trimmed body of each ``` code fence, skipping the info
// string ("json", "JSON", ...). An unclosed fence runs to the end of text.
func fences(text string) iter.Seq[string] {
	return func(yield func(string) bool) {
		for {
			i := strings.Index(text, "```")
			if i < 0 {
				return
			}
			rest := strings.TrimLeft(text[i+3:], "`")
			// Info string: a word right after the fence, e.g. "json".
			rest = strings.TrimLeftFunc(rest, func(r rune) bool {
				return r == '_' || r == '-' || r == '+' || r == '.' ||
					r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
			})
			body, after, _ := strings.Cut(rest, "```")
			if !yield(strings.TrimSpace(body)) {
				return
			}
			text = after
		}
	}
}

// spans yields, in order, the balanced open...close spans of text as
// [start, end) pairs, skipping each yielded span entirely so that nothing
// nested in it is yielded on its own. Characters inside JSON strings
// (including escaped quotes) are ignored. An unbalanced span is yielded
// with end == -1 and ends the sequence.
func spans(text string, open, close byte) iter.Seq2[int, int] {
	return func(yield func(int, int) bool) {
		for i := 0; ; {
			j := strings.IndexByte(text[i:], open)
			if j < 0 {
				return
			}
			start := i + j
			end := matchEnd(text, start, open, close)
			if !yield(start, end) || end < 0 {
				return
			}
			i = end
		}
	}
}

// matchEnd returns the index just past the close byte that balances the
// open byte at text[start], or -1 if the text ends first.
func matchEnd(text string, start int, open, close byte) int {
	depth, inStr, esc := 0, false, false
	for i := start; i < len(text); i++ {
		c := text[i]
		switch {
		case inStr:
			if esc {
				esc = false
			} else if c == '\\' {
				esc = true
			} else if c == '"' {
				inStr = false
			}
		case c == '"':
			inStr = true
		case c == open:
			depth++
		case c == close:
			if depth--; depth == 0 {
				return i + 1
			}
		}
	}
	return -1
}

// MaxDepth is how deeply airlock lets JSON from outside nest objects and arrays: request
// bodies (the body's own object is the first level), model output and MCP results alike.
// encoding/json alone allows 10,000 levels, and what walks a value recursively (a
// schema's validator, a canonicaliser) then pays for each.
const MaxDepth = 64

// Depth is how deeply b nests objects and arrays (0 for a scalar), read in one pass
// that allocates nothing; brackets inside strings do not count. It does not check that
// b is JSON.
func Depth(b []byte) int {
	depth, deepest, inStr, esc := 0, 0, false, false
	for _, c := range b {
		switch {
		case inStr:
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				inStr = false
			}
		case c == '"':
			inStr = true
		case c == '{' || c == '[':
			depth++
			deepest = max(deepest, depth)
		case c == '}' || c == ']':
			depth--
		}
	}
	return deepest
}
