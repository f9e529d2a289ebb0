package store

import (
	"errors"
	"go/build"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/airlockhq/airlock/"

// TestStoreImportsNothingAbove: the store, its backends and their conformance suite —
// tests included — reach no package of this module outside internal/store. The domain
// packages sit above the store and carry their own tests (over every backend, through
// storetest.Each); an import from here up would make the store's suite depend on the
// rules it is meant to be independent of.
func TestStoreImportsNothingAbove(t *testing.T) {
	root := filepath.Join("..", "..")
	via := map[string]string{} // module package → the package that first imported it
	var queue []string
	reach := func(from string, imports []string) {
		for _, imp := range imports {
			if rel, ok := strings.CutPrefix(imp, module); ok {
				if _, seen := via[rel]; !seen {
					via[rel] = from
					queue = append(queue, rel)
				}
			}
		}
	}
	// Every package under internal/store, with its tests' imports.
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if d.Name() == "testdata" || d.Name() == "migrations" {
			return filepath.SkipDir
		}
		pkg, err := build.ImportDir(path, 0)
		if errors.As(err, new(*build.NoGoError)) {
			return nil
		} else if err != nil {
			return err
		}
		from := filepath.ToSlash(filepath.Join("internal/store", path)) + " (with its tests)"
		reach(from, pkg.Imports)
		reach(from, pkg.TestImports)
		reach(from, pkg.XTestImports)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// And what those import in turn.
	for len(queue) > 0 {
		rel := queue[0]
		queue = queue[1:]
		pkg, err := build.ImportDir(filepath.Join(root, filepath.FromSlash(rel)), 0)
		if err != nil {
			t.Fatalf("%s (imported by %s): %v", rel, via[rel], err)
		}
		reach(rel, pkg.Imports)
	}
	var above []string
	for rel := range via {
		if rel != "internal/store" && !strings.HasPrefix(rel, "internal/store/") {
			above = append(above, rel)
		}
	}
	slices.Sort(above)
	for _, rel := range above {
		t.Errorf("internal/store reaches %s (imported by %s): the store and its suite must not import upwards; move the test beside the package it tests", rel, via[rel])
	}
	if len(via) < 3 {
		t.Fatalf("found only %d module packages from internal/store (%v): the walk is broken", len(via), via)
	}
}
