package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/airlockhq/airlock/internal/runs"
)

// decode reads one JSON object into v strictly: JSON content type, size limit, no unknown
// fields, no trailing data. Each failure has its own code.
func decode(r *http.Request, v any) error {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		return apiError(http.StatusUnsupportedMediaType, "unsupported_media_type", "send the body as JSON with Content-Type: application/json")
	}
	dec := json.NewDecoder(r.Body)
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

// validText bounds the free-text fields clients attach (meta, trigger source).
func validText(field, s string, max int) error {
	if len(s) > max {
		return invalid(field, fmt.Sprintf("longer than %d bytes", max))
	}
	if !utf8.ValidString(s) {
		return invalid(field, "not valid UTF-8")
	}
	for _, c := range s {
		if c < 0x20 || c == 0x7f {
			return invalid(field, "holds control characters")
		}
	}
	return nil
}

func validMeta(m *runs.Meta) error {
	if m == nil {
		return nil
	}
	fields := []struct{ name, v string }{
		{"meta.workflow_version", m.WorkflowVersion},
		{"meta.trigger_source", m.TriggerSource},
		{"meta.provider_category", m.ProviderCategory},
		{"meta.requested_by", m.RequestedBy},
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
	return nil
}
