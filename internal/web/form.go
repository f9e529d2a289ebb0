package web

import (
	"errors"
	"fmt"
	"net/http"
	"unicode"
	"unicode/utf8"
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
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, "The form is too large."
		}
		return nil, "The form could not be read. Go back and send it again."
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

func checkField(f formField, v string) string {
	if !utf8.ValidString(v) {
		return fmt.Sprintf("The %s is not valid text (UTF-8).", f.label)
	}
	if n := utf8.RuneCountInString(v); n > f.max {
		return fmt.Sprintf("The %s is too long: at most %d characters.", f.label, f.max)
	}
	for _, c := range v {
		switch {
		case c == 0:
			return fmt.Sprintf("The %s contains a NUL character.", f.label)
		case f.multiline && (c == '\t' || c == '\n' || c == '\r'):
		case unicode.IsControl(c):
			return fmt.Sprintf("The %s contains a control character.", f.label)
		}
	}
	return ""
}
