package web

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/sqlite"
)

// TestWriteError holds the one mapper to its rules: an outage is the try-again page, a
// refusal its page and status, a console action's domain refusal its ActionStatuses
// status in the domain's words, anything else a 500 whose cause is logged once and
// never shown.
func TestWriteError(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "airlock.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	w := New(st, nil, slog.New(slog.NewJSONHandler(&logs, nil)), "http://127.0.0.1:8080", func() time.Time { return now })
	const secret = "dial tcp 10.1.2.3:5432: password=hunter2"
	v := viewer{Person: &approvals.Person{Subject: "ana"}}
	for _, c := range []struct {
		name   string
		err    error
		status int
		body   string // the page says
		logged string // the one log line's level, "" for none
		header string // Retry-After
	}{
		{"a failure", fmt.Errorf("pending approvals: %s", secret), 500, "internal error", "ERROR", ""},
		{"an outage", fmt.Errorf("session: %w", store.Unavailable(errors.New(secret))), 503, "Try again in a moment", "WARN", "2"},
		{"a refusal", neutral(v.Person), 404, "This link cannot be used", "", ""},
		{"a refusal with a header", func() error {
			rf := w.loginRefused(429, "Too many sign-in attempts.")
			rf.header = http.Header{"Retry-After": {"7"}}
			return rf
		}(), 429, "Too many sign-in attempts.", "", "7"},
		{"an action the domain refused", &actionError{err: fmt.Errorf("resolve %q: %w", "e-1", effects.ErrNotResolvable), v: v, title: "Not resolved", back: "/console/effects"},
			409, "Not resolved", "", ""},
		{"an action refused for a form field", &actionError{err: &runs.FieldError{Field: "to", Msg: "must be failed_terminal or failed_retryable"}, v: v, title: "Not unparked", back: "/console/parked"},
			422, "To: must be failed_terminal or failed_retryable. Nothing was changed.", "", ""},
		{"an action during an outage", &actionError{err: store.Unavailable(errors.New(secret)), v: v, title: "Not changed", back: "/console"}, 503, "Try again in a moment", "WARN", "2"},
		{"an action that failed", &actionError{err: errors.New(secret), v: v, title: "No new link", back: "/console"}, 500, "Something went wrong; nothing was changed.", "ERROR", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			logs.Reset()
			rec := httptest.NewRecorder()
			r := httptest.NewRequest("GET", "/console", nil)
			r.Pattern = "GET /console"
			w.writeError(rec, r, c.err)
			body := rec.Body.String()
			if rec.Code != c.status || !strings.Contains(body, c.body) || rec.Header().Get("Retry-After") != c.header {
				t.Fatalf("%d Retry-After=%q, want %d %q:\n%s", rec.Code, rec.Header().Get("Retry-After"), c.status, c.header, body)
			}
			if strings.Contains(body, "10.1.2.3") || strings.Contains(body, "hunter2") {
				t.Fatalf("the cause is shown:\n%s", body)
			}
			lines := strings.Count(logs.String(), "\n")
			switch {
			case c.logged == "" && lines != 0:
				t.Fatalf("a refusal is logged:\n%s", logs.String())
			case c.logged != "" && (lines != 1 || !strings.Contains(logs.String(), `"level":"`+c.logged+`"`) ||
				!strings.Contains(logs.String(), `"route":"GET /console"`) || !strings.Contains(logs.String(), "10.1.2.3")):
				t.Fatalf("want one %s line with the route and the cause:\n%s", c.logged, logs.String())
			}
		})
	}
}

// TestOnlyTheMapperAnswersErrors fails when a page handler writes a 500 or a 503 by
// hand instead of returning the error to writeError.
func TestOnlyTheMapperAnswersErrors(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") || path == "errors.go" {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); ok && x.Name == "http" {
				switch sel.Sel.Name {
				case "Error", "StatusInternalServerError", "StatusServiceUnavailable":
					t.Errorf("%s: http.%s outside errors.go: return the error to writeError", fset.Position(sel.Pos()), sel.Sel.Name)
				}
			}
			return true
		})
	}
}
