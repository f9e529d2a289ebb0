package app_test

import (
	"go/build"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/airlockhq/airlock/"

// TestHandlerPackagesMountNoOther: internal/app mounts the API and the pages side by side
// (Mount); neither handler package reaches the other through its imports, tests aside, so
// neither can mount the other again.
func TestHandlerPackagesMountNoOther(t *testing.T) {
	for _, c := range []struct{ from, other string }{{"internal/httpapi", "internal/web"}, {"internal/web", "internal/httpapi"}} {
		if path := importPath(t, c.from, c.other); path != nil {
			t.Errorf("%s imports %s: %s", c.from, c.other, strings.Join(path, " → "))
		}
	}
}

// importPath is the chain of the module's packages by which from imports target (tests
// aside), or nil.
func importPath(t *testing.T, from, target string) []string {
	t.Helper()
	via := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		rel := queue[0]
		queue = queue[1:]
		if rel == target {
			var chain []string
			for p := rel; p != ""; p = via[p] {
				chain = append([]string{p}, chain...)
			}
			return chain
		}
		pkg, err := build.ImportDir(filepath.Join("..", "..", rel), 0)
		if err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		for _, imp := range pkg.Imports {
			if next, ok := strings.CutPrefix(imp, module); ok {
				if _, seen := via[next]; !seen {
					via[next] = rel
					queue = append(queue, next)
				}
			}
		}
	}
	return nil
}
