package httpapi_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"

	"github.com/airlockhq/airlock/internal/httpapi"
)

// The OpenAPI document is checked by a real OpenAPI 3.1 validator (libopenapi-validator),
// and every live response any test in this package receives through harness.do is
// validated against it: its status must be documented for its route and its body must
// match the documented schema: openapi.json cannot drift from what the server answers.

var (
	openAPIOnce sync.Once
	openAPIV    validator.Validator
	openAPIErr  error
	seenMu      sync.Mutex
	seen        = map[string]bool{} // "METHOD /pattern STATUS" observed live
)

func openAPIDoc() []byte {
	b, err := os.ReadFile("openapi.json")
	if err != nil {
		panic(err)
	}
	return b
}

func openAPIValidator() (validator.Validator, error) {
	openAPIOnce.Do(func() {
		doc, err := libopenapi.NewDocument(openAPIDoc())
		if err != nil {
			openAPIErr = err
			return
		}
		v, errs := validator.NewValidator(doc)
		if len(errs) > 0 {
			openAPIErr = fmt.Errorf("%v", errs)
			return
		}
		openAPIV = v
	})
	return openAPIV, openAPIErr
}

// checkLive validates one live exchange; the body has been read into raw.
func checkLive(t testing.TB, req *http.Request, resp *http.Response, raw []byte) {
	t.Helper()
	route := routeOf(req)
	if route == "" {
		return // pages, redirects: not part of the API document
	}
	seenMu.Lock()
	seen[fmt.Sprintf("%s %d", route, resp.StatusCode)] = true
	seenMu.Unlock()
	v, err := openAPIValidator()
	if err != nil {
		t.Errorf("openapi.json does not load: %v", err)
		return
	}
	if resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified {
		if !documentedStatus(route, resp.StatusCode) {
			t.Errorf("openapi: %s answered %d, which the document does not list", route, resp.StatusCode)
		}
		return
	}
	cp := *resp
	cp.Body = io.NopCloser(bytes.NewReader(raw))
	if ok, errs := v.ValidateHttpResponse(req, &cp); !ok {
		for _, e := range errs {
			msg := e.Message
			if e.Reason != "" {
				msg += ": " + e.Reason
			}
			for _, se := range e.SchemaValidationErrors {
				msg += " [" + se.FieldPath + ": " + se.Reason + "]"
			}
			t.Errorf("openapi: %s → %d does not match the document: %s\nbody: %.400s", route, resp.StatusCode, msg, raw)
		}
	}
}

// routeOf is the route table's pattern a request matches, or "".
func routeOf(req *http.Request) string {
	mux := http.NewServeMux()
	for _, rt := range httpapi.Routes {
		mux.HandleFunc(rt.Method+" "+rt.Pattern, func(http.ResponseWriter, *http.Request) {})
	}
	_, pattern := mux.Handler(req)
	if pattern == "" || !strings.Contains(pattern, " ") {
		return ""
	}
	return pattern
}

type opDoc struct {
	Responses map[string]struct {
		Ref     string `json:"$ref"`
		Content map[string]struct {
			Schema json.RawMessage `json:"schema"`
		} `json:"content"`
	} `json:"responses"`
}

func operations(t *testing.T) map[string]opDoc {
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(openAPIDoc(), &doc); err != nil {
		t.Fatal(err)
	}
	out := map[string]opDoc{}
	for path, ops := range doc.Paths {
		for method, raw := range ops {
			var op opDoc
			if json.Unmarshal(raw, &op) == nil && op.Responses != nil {
				out[strings.ToUpper(method)+" "+path] = op
			}
		}
	}
	return out
}

var opsOnce = sync.OnceValue(func() map[string]opDoc { return operations(&testing.T{}) })

func documentedStatus(route string, status int) bool {
	_, ok := opsOnce()[route].Responses[fmt.Sprint(status)]
	return ok
}

func TestOpenAPIDocumentIsValid31(t *testing.T) {
	v, err := openAPIValidator()
	if err != nil {
		t.Fatal(err)
	}
	if ok, errs := v.ValidateDocument(); !ok {
		for _, e := range errs {
			t.Errorf("%s: %s", e.Message, e.Reason)
			for _, se := range e.SchemaValidationErrors {
				t.Errorf("  %s: %s", se.FieldPath, se.Reason)
			}
		}
	}
	doc := string(openAPIDoc())
	if strings.Contains(doc, `"$ref": "/`) || strings.Contains(doc, `"$ref": "http`) {
		t.Error("openapi.json has a $ref outside the document (validators cannot follow it)")
	}
	for name, op := range operations(t) {
		for status, r := range op.Responses {
			for ct, c := range r.Content {
				var s map[string]any
				if json.Unmarshal(c.Schema, &s) != nil || len(s) == 0 {
					t.Errorf("%s %s (%s): empty schema", name, status, ct)
				}
			}
		}
	}
}

// TestMain checks, after a run of the whole package, that the live responses included
// every status the document lists for an API route: each was then validated by checkLive.
func TestMain(m *testing.M) {
	code := m.Run()
	if f := flag.Lookup("test.run"); code == 0 && f != nil && f.Value.String() == "" {
		if missing := unseenStatuses(); len(missing) > 0 {
			fmt.Fprintf(os.Stderr, "openapi: documented statuses no test saw live: %v\n", missing)
			code = 1
		} else {
			seenMu.Lock()
			fmt.Fprintf(os.Stderr, "openapi: %d (route, status) pairs seen live, each valid against openapi.json\n", len(seen))
			seenMu.Unlock()
		}
	}
	os.Exit(code)
}

// unseenStatuses are the statuses documented on some API route that no live response had.
func unseenStatuses() []string {
	api := map[string]bool{}
	for _, rt := range httpapi.Routes {
		api[rt.Method+" "+rt.Pattern] = true
	}
	want := map[string]bool{}
	for name, op := range opsOnce() {
		if api[name] {
			for status := range op.Responses {
				want[status] = true
			}
		}
	}
	seenMu.Lock()
	defer seenMu.Unlock()
	for k := range seen {
		delete(want, k[strings.LastIndexByte(k, ' ')+1:])
	}
	missing := make([]string, 0, len(want))
	for s := range want {
		missing = append(missing, s)
	}
	sort.Strings(missing)
	return missing
}
