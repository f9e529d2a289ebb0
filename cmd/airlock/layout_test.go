package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// docs/architecture.md's layout names every package directory under internal/ and every
// top-level directory: a new maintainer reading it finds each one.
func TestLayoutNamesEveryDirectory(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, layout, ok := strings.Cut(string(doc), "## Layout")
	if !ok {
		t.Fatal("docs/architecture.md has no Layout section")
	}
	named := map[string]bool{}
	for _, line := range strings.Split(layout, "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasSuffix(f[0], "/") {
			named[strings.TrimSuffix(f[0], "/")] = true
		}
	}
	var dirs []string
	top, _ := os.ReadDir(filepath.Join("..", ".."))
	for _, d := range top {
		if d.IsDir() && !strings.HasPrefix(d.Name(), ".") && d.Name() != "internal" {
			dirs = append(dirs, d.Name())
		}
	}
	internal, _ := os.ReadDir(filepath.Join("..", "..", "internal"))
	for _, d := range internal {
		if d.IsDir() {
			dirs = append(dirs, "internal/"+d.Name())
		}
	}
	for _, d := range dirs {
		if !namedUnder(named, d) {
			t.Errorf("docs/architecture.md's layout does not name %s/", d)
		}
	}
}

// namedUnder: d or a directory inside it is named (cmd/ by cmd/airlock/).
func namedUnder(named map[string]bool, d string) bool {
	for n := range named {
		if n == d || strings.HasPrefix(n, d+"/") {
			return true
		}
	}
	return false
}
