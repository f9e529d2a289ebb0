package audit

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/store"
)

// TestSummaryKnowsEveryKind fails when a kind airlock writes would reach Summary's
// catch-all without being listed in Generic, or a Generic kind has gained a case.
func TestSummaryKnowsEveryKind(t *testing.T) {
	for _, k := range store.EventKinds {
		probe := store.Event{Kind: string(k), Detail: []byte(`{"zz_probe":"x"}`)}
		fellThrough := Summary(probe) == "zz_probe=x"
		if generic := slices.Contains(Generic, k); fellThrough != generic {
			t.Errorf("kind %q: falls through to the generic summary %v, listed in Generic %v", k, fellThrough, generic)
		}
	}
}

// TestEveryWrittenKindIsAConstant scans the non-test code for the calls that write events
// (runs.Event, and store.EventInsertParams literals) and fails on a kind spelt as a string
// literal: each must be a store.EventKind constant, so it is in store.EventKinds, which the
// test above holds the audit to. (A misspelt constant does not compile.)
func TestEveryWrittenKindIsAConstant(t *testing.T) {
	root := filepath.Join("..", "..")
	fset := token.NewFileSet()
	calls := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		// storetest is test code (its own made-up kinds) in non-test files.
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || d.Name() == "node_modules" || d.Name() == "storetest") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		literal := func(e ast.Expr, what string) {
			if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				t.Errorf("%s: %s writes the kind %s as a string literal; use a store.EventKind constant",
					fset.Position(lit.Pos()), what, lit.Value)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				if isEventCall(f, n.Fun) && len(n.Args) == 4 {
					calls++ // runs.Event(ctx, q, now, runs.Entry{…}): its Entry is checked below
				}
			case *ast.CompositeLit:
				// The kind an event is written with: store.EventInsertParams' Kind, or
				// runs.Entry's (runs.Event's argument).
				if what := name(n.Type); what == "EventInsertParams" || what == "Entry" {
					for _, el := range n.Elts {
						if kv, ok := el.(*ast.KeyValueExpr); ok && name(kv.Key) == "Kind" {
							literal(kv.Value, what)
						}
					}
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if calls < 40 {
		t.Fatalf("found %d runs.Event calls; the scan is not seeing the code", calls)
	}
}

// isEventCall is runs.Event from another package, or Event inside package runs.
func isEventCall(f *ast.File, fun ast.Expr) bool {
	switch fn := fun.(type) {
	case *ast.SelectorExpr:
		x, ok := fn.X.(*ast.Ident)
		return ok && x.Name == "runs" && fn.Sel.Name == "Event"
	case *ast.Ident:
		return f.Name.Name == "runs" && fn.Name == "Event"
	}
	return false
}

func name(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return e.Sel.Name
	}
	return ""
}

// TestEventKindsListsEveryConstant keeps store.EventKinds complete: a constant added
// without its entry would escape the summary test.
func TestEventKindsListsEveryConstant(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join("..", "store", "eventkinds.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var consts []string
	for _, d := range f.Decls {
		if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.CONST {
			for _, s := range g.Specs {
				if v := s.(*ast.ValueSpec); name(v.Type) == "EventKind" {
					for i := range v.Names {
						consts = append(consts, strings.Trim(v.Values[i].(*ast.BasicLit).Value, `"`))
					}
				}
			}
		}
	}
	if len(consts) == 0 {
		t.Fatal("no EventKind constants found")
	}
	for _, c := range consts {
		if !slices.Contains(store.EventKinds, store.EventKind(c)) {
			t.Errorf("the kind %q is a constant but not in store.EventKinds", c)
		}
	}
	if len(consts) != len(store.EventKinds) {
		t.Errorf("%d constants, %d in store.EventKinds", len(consts), len(store.EventKinds))
	}
}

// TestDetailKindsAreIndexed holds the report's detail kinds, and the gate waits'
// approval_decided, to store.ReportKinds: the only kinds events_report_kind_at holds
// (migration 0023). A kind added here alone would be read from events_at's whole window.
func TestDetailKindsAreIndexed(t *testing.T) {
	if !store.AreReportKinds(append(slices.Clone(detailKinds), string(store.EventApprovalDecided))) {
		t.Fatalf("detail kinds %v are not all store.ReportKinds %v", detailKinds, store.ReportKinds)
	}
	if store.AreReportKinds([]string{"alert", "claimed"}) {
		t.Fatal("claimed counts as a report kind")
	}
}

// TestAlertSummarySaysWhy: a workflow that gives up with a reason (transition's alert)
// shows it on the timeline, not only the alert's kind.
func TestAlertSummarySaysWhy(t *testing.T) {
	e := store.Event{Kind: "alert", Detail: []byte(`{"alert":"workflow_gave_up","reason":"model answered prose twice"}`)}
	if got, want := Summary(e), "alert: workflow_gave_up; reason: model answered prose twice"; got != want {
		t.Errorf("Summary = %q, want %q", got, want)
	}
	e = store.Event{Kind: "alert", Detail: []byte(`{"alert":"effect_unknown","effect_id":"e1","error_class":"timeout"}`)}
	if got, want := Summary(e), "alert: effect_unknown on effect e1, timeout"; got != want {
		t.Errorf("Summary = %q, want %q", got, want)
	}
}
