package app_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestServicesTakeAtMostSixParameters: no function of the domain services New builds (or
// of New itself) takes more than six parameters; a longer list becomes a request struct
// or a value carried down (runs.Entry, approvals.Ask, ledger.ConfirmRequest, effects'
// sent), as River's functions take a *Params.
func TestServicesTakeAtMostSixParameters(t *testing.T) {
	fset := token.NewFileSet()
	n := 0
	for _, pkg := range []string{"runs", "failures", "effects", "approvals", "ledger", "alerts", "slack", "app"} {
		files, err := filepath.Glob(filepath.Join("..", pkg, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: no Go files (%v)", pkg, err)
		}
		for _, name := range files {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, name, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			ast.Inspect(f, func(node ast.Node) bool {
				var ft *ast.FuncType
				what := "a function literal"
				switch x := node.(type) {
				case *ast.FuncDecl:
					ft, what = x.Type, x.Name.Name
				case *ast.FuncLit:
					ft = x.Type
				default:
					return true
				}
				n++
				if c := ft.Params.NumFields(); c > 6 {
					t.Errorf("%s: %s takes %d parameters", fset.Position(ft.Pos()), what, c)
				}
				return true
			})
		}
	}
	if n < 100 {
		t.Fatalf("only %d functions read: the test looks in the wrong place", n)
	}
}
