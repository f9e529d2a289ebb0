package httpapi

import (
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/errcodes"
)

// codesInCode returns every error code this package answers, with its statuses: the
// error table, and each apiError(http.StatusX, "code", …) call and Code: "code" literal
// in its source (the readiness answers included).
func codesInCode(t *testing.T) map[string]map[int]bool {
	t.Helper()
	codes := map[string]map[int]bool{}
	add := func(code string, status int) {
		if codes[code] == nil {
			codes[code] = map[int]bool{}
		}
		codes[code][status] = true
	}
	for _, e := range errorTable {
		add(e.code, e.status)
	}
	statusOf := func(x ast.Expr) int {
		switch v := x.(type) {
		case *ast.SelectorExpr:
			if pkg, ok := v.X.(*ast.Ident); !ok || pkg.Name != "http" {
				return 0 // t.status: the error table's, counted above
			}
			if s, ok := httpStatus[v.Sel.Name]; ok {
				return s
			}
			t.Fatalf("errors_doc_test: add http.%s to httpStatus", v.Sel.Name)
		case *ast.BasicLit:
			n, _ := strconv.Atoi(v.Value)
			return n
		}
		return 0
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch v := n.(type) {
			case *ast.CallExpr:
				if id, ok := v.Fun.(*ast.Ident); ok && id.Name == "apiError" && len(v.Args) == 3 {
					if lit, ok := v.Args[1].(*ast.BasicLit); ok {
						if code, _ := strconv.Unquote(lit.Value); statusOf(v.Args[0]) != 0 {
							add(code, statusOf(v.Args[0]))
						} else {
							t.Errorf("apiError(%s, %q): not a status this test can read", fset.Position(v.Pos()), code)
						}
					}
				}
			case *ast.CompositeLit:
				var code string
				status := 0
				for _, el := range v.Elts {
					kv, ok := el.(*ast.KeyValueExpr)
					if !ok {
						continue
					}
					key, _ := kv.Key.(*ast.Ident)
					if key == nil {
						continue
					}
					switch key.Name {
					case "Code":
						if lit, ok := kv.Value.(*ast.BasicLit); ok {
							code, _ = strconv.Unquote(lit.Value)
						}
					case "Status":
						status = statusOf(kv.Value)
					}
				}
				if code != "" {
					if status == 0 { // readiness: /readyz answers 503
						status = http.StatusServiceUnavailable
					}
					add(code, status)
				}
			}
			return true
		})
	}
	return codes
}

var httpStatus = map[string]int{
	"StatusBadRequest": 400, "StatusUnauthorized": 401, "StatusForbidden": 403, "StatusNotFound": 404,
	"StatusMethodNotAllowed": 405, "StatusConflict": 409, "StatusRequestEntityTooLarge": 413,
	"StatusUnsupportedMediaType": 415, "StatusUnprocessableEntity": 422, "StatusLocked": 423,
	"StatusTooManyRequests": 429, "StatusInternalServerError": 500, "StatusServiceUnavailable": 503,
}

// TestErrorCodesAreTheCatalog keeps the server's answers and internal/errcodes' list
// (from which docs/errors.md, openapi.json's enum and the clients' classes are generated)
// the same: every code the API answers is listed with the status it is answered with, and
// every listed code is one the API answers.
func TestErrorCodesAreTheCatalog(t *testing.T) {
	inCode := codesInCode(t)
	if len(inCode) < 40 {
		t.Fatalf("found only %d codes in the code: the scan is broken", len(inCode))
	}
	var names []string
	for c := range inCode {
		names = append(names, c)
	}
	sort.Strings(names)
	for _, c := range names {
		listed, ok := errcodes.ByName(c)
		if !ok {
			t.Errorf("the server answers %q (status %v), which internal/errcodes/errcodes.go does not list: add it there and run `make generate`", c, keys(inCode[c]))
			continue
		}
		for s := range inCode[c] {
			if s != listed.Status {
				t.Errorf("internal/errcodes lists %q with %d; the server answers it with %d", c, listed.Status, s)
			}
		}
	}
	for _, c := range errcodes.All {
		if _, ok := inCode[c.Name]; !ok {
			t.Errorf("internal/errcodes lists %q, which the API never answers", c.Name)
		}
	}
}

func keys(m map[int]bool) []int {
	var out []int
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}
