package httpapi

import (
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/apikeys"
	"github.com/airlockhq/airlock/internal/web"
)

// domainPackages are the packages whose sentinel errors reach HTTP only through errorTable.
var domainPackages = map[string]bool{"runs": true, "effects": true, "approvals": true, "failures": true,
	"ledger": true, "policy": true, "apikeys": true}

// TestDomainErrorsMapOnlyInTheTable fails when a handler tests a domain sentinel itself
// (and so could answer it with a code of its own) instead of returning it to the table.
// The one exception is authenticated: for apikeys.ErrInvalid and ErrRevoked it sets the
// WWW-Authenticate header and a message that does not tell unknown from revoked; the
// status and code are the table's (checked here too).
func TestDomainErrorsMapOnlyInTheTable(t *testing.T) {
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
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) != 2 || name(call.Fun) != "errors.Is" {
				return true
			}
			sentinel := name(call.Args[1])
			pkg, _, _ := strings.Cut(sentinel, ".")
			if !domainPackages[pkg] {
				return true
			}
			if pkg == "apikeys" && path == "server.go" {
				return true
			}
			t.Errorf("%s: errors.Is(…, %s) outside errors.go: return the error and let errorTable answer it",
				fset.Position(call.Pos()), sentinel)
			return true
		})
	}
	for _, err := range []error{apikeys.ErrInvalid, apikeys.ErrRevoked} {
		if ae, _ := toAPIError(err); ae.Code != "unauthenticated" || ae.Status != http.StatusUnauthorized {
			t.Errorf("the table answers %v with %d %s; authenticated answers 401 unauthenticated", err, ae.Status, ae.Code)
		}
	}
}

// name is a call's or an expression's dotted name ("errors.Is", "approvals.ErrNotFound").
func name(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		if x := name(e.X); x != "" {
			return x + "." + e.Sel.Name
		}
	}
	return ""
}

// TestConsoleStatusesAreTheTables keeps the console's second list of refusals to the
// statuses the API answers them with.
func TestConsoleStatusesAreTheTables(t *testing.T) {
	for _, a := range web.ActionStatuses {
		if ae, known := toAPIError(a.Err); !known || ae.Status != a.Status {
			t.Errorf("the console answers %v with %d, the API with %d %s", a.Err, a.Status, ae.Status, ae.Code)
		}
	}
}
