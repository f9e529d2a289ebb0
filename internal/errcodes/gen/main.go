// Command gen writes the files that list airlock's error codes from internal/errcodes
// (go generate ./internal/errcodes, make generate); with -check it writes nothing and
// fails when one of them is stale (make verify).
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/airlockhq/airlock/internal/errcodes"
)

func main() {
	check := flag.Bool("check", false, "write nothing; exit 1 when a generated file is stale")
	flag.Parse()
	if err := run(*check); err != nil {
		fmt.Fprintln(os.Stderr, "errcodes:", err)
		os.Exit(1)
	}
}

func run(check bool) error {
	root, err := repoRoot()
	if err != nil {
		return err
	}
	if check {
		stale, err := errcodes.Stale(root)
		if err != nil {
			return err
		}
		if len(stale) > 0 {
			return fmt.Errorf("stale: %v; run `make generate` (go generate ./internal/errcodes) and commit the result", stale)
		}
		return nil
	}
	unlisted, err := errcodes.Unlisted(root)
	if err != nil {
		return err
	}
	if len(unlisted) > 0 {
		fmt.Fprintln(os.Stderr, "errcodes: these codes are in the generated files but not in internal/errcodes/errcodes.go,")
		fmt.Fprintln(os.Stderr, "and are dropped from them; if the server answers them, add them to errcodes.All:")
		for _, l := range unlisted {
			fmt.Fprintln(os.Stderr, "\t"+l)
		}
	}
	files, err := errcodes.Generate(root)
	if err != nil {
		return err
	}
	for _, p := range errcodes.Paths() {
		full := filepath.Join(root, p)
		if old, err := os.ReadFile(full); err == nil && string(old) == string(files[p]) {
			continue
		}
		if err := os.WriteFile(full, files[p], 0o644); err != nil {
			return err
		}
		fmt.Println("wrote", p)
	}
	return nil
}

// repoRoot is the nearest directory up from here that holds go.mod: go generate runs in
// the package's directory, make in the repository's.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}
