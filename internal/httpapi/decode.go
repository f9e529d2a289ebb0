package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/input"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/validation"
)

// decode reads one JSON object into v strictly: JSON content type, size limit, valid
// UTF-8 throughout (no lone surrogate escapes either), at most maxDepth levels of
// nesting, no NUL character in any string or key, no field twice in any object at
// any depth, field names exactly as documented (encoding/json alone would let "KEY" set
// key), no unknown fields, no trailing data. Every route decodes its body here; each
// failure has its own code.
func decode(r *http.Request, v any) error {
	raw, err := readJSON(r)
	if err != nil {
		return err
	}
	return decodeRaw(raw, v)
}

// readJSON checks the content type and reads the body (bounded by handle's limit).
func readJSON(r *http.Request) ([]byte, error) {
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		// The exact type every client sends needs no parsing; anything else (parameters,
		// case, spaces) is read as a media type.
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || mt != "application/json" {
			return nil, apiError(http.StatusUnsupportedMediaType, "unsupported_media_type", "send the body as JSON with Content-Type: application/json")
		}
	}
	raw, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, decodeError(err)
	}
	return raw, nil
}

// decodeRaw is decode's check and decoding of a body already read.
func decodeRaw(raw []byte, v any) error {
	if err := strictJSON(raw, reflect.TypeOf(v)); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return decodeError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		if err != nil {
			return decodeError(err)
		}
		return apiError(http.StatusBadRequest, "malformed_json", "the body must hold exactly one JSON object")
	}
	return nil
}

// strictJSON checks what encoding/json lets through. Syntax errors are left to the
// decoder, which reports them.
func strictJSON(raw []byte, t reflect.Type) error {
	if !utf8.Valid(raw) {
		return apiError(http.StatusBadRequest, "invalid_utf8", "the body is not valid UTF-8")
	}
	if loneSurrogate(raw) {
		return apiError(http.StatusBadRequest, "invalid_utf8", "the body escapes a lone UTF-16 surrogate (\\uD800–\\uDFFF), which is not a character")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	err := (&walker{dec: dec}).value(t, 0)
	var ae *Error
	if errors.As(err, &ae) {
		return err
	}
	return nil
}

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// shape is what a JSON value decodes into: nil when it is free-form (any, RawMessage,
// a type with its own UnmarshalJSON), whose objects are still checked for duplicates.
func shape(t reflect.Type) reflect.Type {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.Kind() == reflect.Interface || reflect.PointerTo(t).Implements(unmarshalerType) {
		return nil
	}
	return t
}

// jsonFields maps the JSON names of a struct's fields (embedded structs' included) to
// their types.
func jsonFields(t reflect.Type, out map[string]reflect.Type) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			if ft := shape(f.Type); ft != nil && ft.Kind() == reflect.Struct {
				jsonFields(ft, out)
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
}

// fieldsByType caches jsonFields per struct type: every request of a route walks the
// same types, and building the map by reflection per object showed in the claim's
// profile. The maps are only read once stored.
var fieldsByType sync.Map // reflect.Type → map[string]reflect.Type

func structFields(t reflect.Type) map[string]reflect.Type {
	if f, ok := fieldsByType.Load(t); ok {
		return f.(map[string]reflect.Type)
	}
	f := map[string]reflect.Type{}
	jsonFields(t, f)
	fieldsByType.Store(t, f)
	return f
}

// maxDepth bounds how deeply a body nests objects and arrays, the body's own object
// being the first level. Deeper bodies are refused before anything else reads them.
const maxDepth = validation.MaxDepth

// pathElem is one step from the body's root to a value: an object key or an array index.
type pathElem struct {
	key   string
	index int
	array bool
}

// walker checks one body's tokens. The path to the value being read is a stack of
// steps, turned into text only when an error names it: building it per level made
// memory grow with the square of the nesting.
type walker struct {
	dec  *json.Decoder
	path []pathElem
}

// name is the dotted path of the current value ("payload.items[1].x"), with last in
// place of the innermost key when it is not "".
func (w *walker) name(last string) string {
	var sb strings.Builder
	for i, p := range w.path {
		switch {
		case p.array:
			fmt.Fprintf(&sb, "[%d]", p.index)
		default:
			if sb.Len() > 0 {
				sb.WriteByte('.')
			}
			if i == len(w.path)-1 && last != "" {
				sb.WriteString(last)
			} else {
				sb.WriteString(p.key)
			}
		}
	}
	return sb.String()
}

// value reads one value of shape t at the current path; depth is the number of
// containers it sits in.
func (w *walker) value(t reflect.Type, depth int) error {
	tok, err := w.dec.Token()
	if err != nil {
		return err
	}
	delim, ok := tok.(json.Delim)
	if !ok {
		if s, ok := tok.(string); ok && strings.ContainsRune(s, 0) {
			return nulError(w.name(""))
		}
		return nil
	}
	if depth >= maxDepth {
		where := w.name("")
		if where == "" {
			where = "the body"
		} else {
			where = strconv.Quote(where)
		}
		return apiError(http.StatusBadRequest, "nesting_too_deep", fmt.Sprintf("%s nests objects and arrays deeper than %d levels", where, maxDepth))
	}
	t = shape(t)
	switch delim {
	case '{':
		if err := w.object(t, depth+1); err != nil {
			return err
		}
	case '[':
		if err := w.array(t, depth+1); err != nil {
			return err
		}
	}
	_, err = w.dec.Token() // the closing delimiter
	return err
}

func (w *walker) object(t reflect.Type, depth int) error {
	var fields map[string]reflect.Type
	if t != nil && t.Kind() == reflect.Struct {
		fields = structFields(t)
	}
	seen := map[string]bool{}
	w.path = append(w.path, pathElem{})
	defer func() { w.path = w.path[:len(w.path)-1] }()
	for w.dec.More() {
		kt, err := w.dec.Token()
		if err != nil {
			return err
		}
		key, _ := kt.(string)
		w.path[len(w.path)-1].key = key
		if strings.ContainsRune(key, 0) {
			return nulError(w.name(""))
		}
		if seen[key] {
			return apiError(http.StatusBadRequest, "duplicate_field", fmt.Sprintf("%s appears twice; give each field once", quoteField(w.name(""))))
		}
		seen[key] = true
		var next reflect.Type
		switch {
		case fields != nil:
			ft, exact := fields[key]
			if !exact {
				for f := range fields {
					if strings.EqualFold(f, key) {
						return apiError(http.StatusBadRequest, "unknown_field", fmt.Sprintf("unknown field %s: field names are case-sensitive; did you mean %q?", quoteField(w.name("")), w.name(f)))
					}
				}
			}
			next = ft
		case t != nil && t.Kind() == reflect.Map:
			next = t.Elem()
		}
		if err := w.value(next, depth); err != nil {
			return err
		}
	}
	return nil
}

func (w *walker) array(t reflect.Type, depth int) error {
	var elem reflect.Type
	if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
		elem = t.Elem()
	}
	w.path = append(w.path, pathElem{array: true})
	defer func() { w.path = w.path[:len(w.path)-1] }()
	for i := 0; w.dec.More(); i++ {
		w.path[len(w.path)-1].index = i
		if err := w.value(elem, depth); err != nil {
			return err
		}
	}
	return nil
}

// nulError refuses a NUL character (\u0000) in any string or object key: PostgreSQL
// cannot store one in text or jsonb, so it is refused here, for every store alike.
func nulError(name string) error {
	return apiError(http.StatusBadRequest, "nul_character", fmt.Sprintf("%s holds a NUL character (\\u0000), which cannot be stored; remove it or encode the data (e.g. base64)", quoteField(name)))
}

func quoteField(name string) string {
	return strconv.Quote(strings.TrimSuffix(name, "."))
}

// loneSurrogate reports a \uD800–\uDFFF escape inside a JSON string that is not a high
// surrogate followed by a low one: encoding/json would store U+FFFD in its place.
func loneSurrogate(raw []byte) bool {
	hex4 := func(i int) (rune, bool) {
		if i+6 > len(raw) || raw[i] != '\\' || raw[i+1] != 'u' {
			return 0, false
		}
		v, err := strconv.ParseUint(string(raw[i+2:i+6]), 16, 16)
		return rune(v), err == nil
	}
	inString := false
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		switch {
		case !inString:
			inString = c == '"'
		case c == '"':
			inString = false
		case c == '\\' && i+1 < len(raw) && raw[i+1] == 'u':
			r, ok := hex4(i)
			if !ok {
				i++
				continue
			}
			switch {
			case r >= 0xDC00 && r <= 0xDFFF:
				return true
			case r >= 0xD800 && r <= 0xDBFF:
				lo, ok := hex4(i + 6)
				if !ok || lo < 0xDC00 || lo > 0xDFFF {
					return true
				}
				i += 11
				continue
			}
			i += 5
		case c == '\\':
			i++ // skip the escaped character
		}
	}
	return false
}

func decodeError(err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		return apiError(http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("the body is larger than %d bytes", tooBig.Limit))
	case errors.As(err, &syn), errors.Is(err, io.ErrUnexpectedEOF):
		return apiError(http.StatusBadRequest, "malformed_json", "the body is not valid JSON")
	case errors.Is(err, io.EOF):
		return apiError(http.StatusBadRequest, "malformed_json", "the body is empty")
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			return apiError(http.StatusBadRequest, "wrong_type", "the body must be a JSON object")
		}
		return apiError(http.StatusBadRequest, "wrong_type", fmt.Sprintf("%s must be %s, not %s", field, jsonKind(typ.Type.Kind().String()), typ.Value))
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return apiError(http.StatusBadRequest, "unknown_field", strings.TrimPrefix(err.Error(), "json: ")+" (not part of this request)")
	}
	return apiError(http.StatusBadRequest, "malformed_json", "the body could not be read as JSON")
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "a string"
	case "int", "int64", "int32", "uint", "uint64", "float64":
		return "a number"
	case "bool":
		return "a boolean"
	case "struct", "map", "ptr":
		return "an object"
	case "slice", "array":
		return "an array"
	}
	return "of another type"
}

func missing(field string) error {
	return apiError(http.StatusBadRequest, "missing_field", field+" is required")
}

func invalid(field, msg string) error {
	return apiError(http.StatusBadRequest, "invalid_field", field+": "+msg)
}

const maxKeyLen = 200

// validKey accepts 1–200 characters from letters, digits and . _ : @ + = ~ - so a key is
// safe in a URL path segment, a log line and a file name alike.
func validKey(field, k string) error {
	if k == "" {
		return missing(field)
	}
	if len(k) > maxKeyLen {
		return invalid(field, fmt.Sprintf("longer than %d characters", maxKeyLen))
	}
	for _, c := range k {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("._:@+=~-", c)) {
			return invalid(field, "may hold only letters, digits and . _ : @ + = ~ -")
		}
	}
	return nil
}

// The API's checks of text a client gives, by internal/input's rules; each problem is
// answered with its code. Lengths are in characters.

// validText bounds a free-text field (a note, a reason, a class): one line.
func validText(field, s string, max int) error {
	return textError(field, input.Text(s, input.Rule{Max: max}))
}

// validVisible is validText for text that must read as it is used (a target, a
// provider's id): no invisible or bidirectional format characters either.
func validVisible(field, s string, max int) error {
	return textError(field, input.Text(s, input.Rule{Max: max, Visible: true}))
}

// validIdentity checks a name that stands for a person (requested_by).
func validIdentity(field, s string) error {
	return textError(field, input.Identity(s))
}

func textError(field string, err error) error {
	var e *input.Error
	if !errors.As(err, &e) {
		return err
	}
	switch e.Problem {
	case input.Invisible:
		return apiError(http.StatusUnprocessableEntity, "invisible_character", field+" "+e.Error())
	case input.NotIdentity:
		return apiError(http.StatusUnprocessableEntity, "invalid_identity", field+" "+e.Error())
	}
	return invalid(field, e.Error())
}

func validMeta(m *runs.Meta) error {
	if m == nil {
		return nil
	}
	fields := []struct{ name, v string }{
		{"meta.workflow_version", m.WorkflowVersion},
		{"meta.trigger_source", m.TriggerSource},
		{"meta.provider_category", m.ProviderCategory},
	}
	if m.Model != nil {
		fields = append(fields,
			struct{ name, v string }{"meta.model.provider", m.Model.Provider},
			struct{ name, v string }{"meta.model.name", m.Model.Name},
			struct{ name, v string }{"meta.model.revision", m.Model.Revision})
	}
	for _, f := range fields {
		if err := validText(f.name, f.v, 200); err != nil {
			return err
		}
	}
	if err := validSourceURL(m.SourceURL); err != nil {
		return err
	}
	// Who asked is compared with who approves (separation of duties): a name that only
	// looks like another must not pass for someone else.
	return validIdentity("meta.requested_by", m.RequestedBy)
}

// declared refuses a meta.requested_by that reads like a known person's name without
// being it (422 confusable_identity), before anything is written: a look-alike never
// reaches a gate. validMeta has checked the text.
func (s *server) declared(ctx context.Context, m *runs.Meta) error {
	if m == nil || strings.TrimSpace(m.RequestedBy) == "" {
		return nil
	}
	if err := approvals.CheckDeclared(ctx, s.Store, s.Effects.Policy, m.RequestedBy); err != nil {
		return fmt.Errorf("meta.requested_by: %w", err)
	}
	return nil
}

// maxSourceURL bounds meta.source_url.
const maxSourceURL = 2000

// validSourceURL checks meta.source_url, which the card makes a link: an absolute http
// or https URL with a host and no credentials, visible characters only. javascript:,
// data:, relative and scheme-relative URLs are refused, not dropped, so the workflow
// learns its link will not show.
func validSourceURL(s string) error {
	if s == "" {
		return nil
	}
	if err := validVisible("meta.source_url", s, maxSourceURL); err != nil {
		return err
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || strings.ContainsAny(s, " \t\r\n") {
		return apiError(http.StatusUnprocessableEntity, "invalid_source_url", "meta.source_url must be an absolute http or https URL without credentials")
	}
	return nil
}
