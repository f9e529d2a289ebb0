package web

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/airlockhq/airlock/internal/input"
)

// formField is one posted field and its rules.
type formField struct {
	name      string
	label     string // as the page names it
	max       int    // characters
	multiline bool   // tab and line breaks allowed (a reason)
}

// postForm reads the posted fields; a message for a 400 page when it refuses them.
func postForm(r *http.Request, fields ...formField) (map[string]string, string) {
	if err := r.ParseForm(); err != nil {
		return nil, formReadError(err)
	}
	out := make(map[string]string, len(fields))
	for _, f := range fields {
		if len(r.PostForm[f.name]) > 1 {
			return nil, fmt.Sprintf("The %s was sent more than once.", f.label)
		}
		v := r.PostForm.Get(f.name)
		if msg := checkField(f, v); msg != "" {
			return nil, msg
		}
		out[f.name] = v
	}
	return out, ""
}

func formReadError(err error) string {
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return "The form is too large."
	}
	return "The form could not be read. Go back and send it again."
}

// checkField is input's rule for one field, in the page's words; "" when it passes.
func checkField(f formField, v string) string {
	err := input.Text(v, input.Rule{Max: f.max, Multiline: f.multiline})
	var e *input.Error
	if !errors.As(err, &e) {
		return ""
	}
	switch e.Problem {
	case input.InvalidUTF8:
		return fmt.Sprintf("The %s is not valid text (UTF-8).", f.label)
	case input.TooLong:
		return fmt.Sprintf("The %s is too long: at most %d characters.", f.label, f.max)
	case input.NUL:
		return fmt.Sprintf("The %s contains a NUL character.", f.label)
	case input.Invisible:
		return fmt.Sprintf("The %s contains an invisible or bidirectional format character.", f.label)
	}
	return fmt.Sprintf("The %s contains a control character.", f.label)
}

// maxParam bounds any console query parameter or form field: none is longer than a
// reason.
const maxParam = maxReason

// badInput checks everything a console request carries as text — its path, every query
// parameter and every posted field, names and values — by input's rules, before the
// session or anything else is looked up: one check for every console page and action,
// so no handler sees a NUL (a 500 on PostgreSQL), invalid UTF-8 or a control character
// (line breaks and tabs only in posted values: a reason may have several lines). The
// handlers' own rules (a required reason, one line) come after. "" when it passes.
func badInput(r *http.Request) string {
	check := func(what, v string, multiline bool) string {
		return checkField(formField{label: what, max: maxParam, multiline: multiline}, v)
	}
	if msg := check("address", r.URL.Path, false); msg != "" {
		return msg
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return "The address could not be read."
	}
	for k, vs := range q {
		if msg := check("address's parameter name", k, false); msg != "" {
			return msg
		}
		for _, v := range vs {
			if msg := check(fmt.Sprintf("address's %q parameter", k), v, false); msg != "" {
				return msg
			}
		}
	}
	if r.Method != http.MethodPost {
		return ""
	}
	if err := r.ParseForm(); err != nil {
		return formReadError(err)
	}
	for k, vs := range r.PostForm {
		if msg := check("form's field name", k, false); msg != "" {
			return msg
		}
		for _, v := range vs {
			if msg := check(fmt.Sprintf("%q field", k), v, true); msg != "" {
				return msg
			}
		}
	}
	return ""
}
