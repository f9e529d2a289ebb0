package httpapi

import (
	"net/http"
	"regexp"

	"github.com/airlockhq/airlock/internal/input"
)

var patternWildcard = regexp.MustCompile(`\{([a-z_]+)(?:\.\.\.)?\}`)

// textChecked is the one text rule for everything a route reads besides its body: the
// query string (it must parse; every name and value) and the path's values pass
// internal/input's rule — valid UTF-8, no NUL, no control character, at most 2,000
// characters — before authentication or the handler, so no handler and no store sees a
// NUL (a 500 on PostgreSQL) or invalid UTF-8 (matched as bytes on SQLite). Refused: 400
// invalid_field naming the parameter. Bodies are checked field by field by the decoder.
func textChecked(pattern string, next handlerFunc) handlerFunc {
	var names []string
	for _, m := range patternWildcard.FindAllStringSubmatch(pattern, -1) {
		names = append(names, m[1])
	}
	return func(w http.ResponseWriter, r *http.Request) error {
		for _, n := range names {
			if err := input.Text(r.PathValue(n), input.Rule{}); err != nil {
				return textError("path "+n, err)
			}
		}
		if r.URL.RawQuery != "" {
			field, err := input.Params(r.URL.RawQuery, false)
			if err != nil && field == "" {
				return invalid("query", "cannot be read (a malformed %-escape or a semicolon)")
			}
			if err != nil {
				return textError("query "+field, err)
			}
		}
		return next(w, r)
	}
}
