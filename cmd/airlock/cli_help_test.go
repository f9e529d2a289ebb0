package main

import (
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// migrate on a new database names what it applied; run again, it says there was nothing
// to apply (issue 24, 13), on both stores.
func TestMigrateSaysWhatItApplied(t *testing.T) {
	for backend, env := range databases(t) {
		t.Run(backend, func(t *testing.T) {
			files, err := filepath.Glob("../../internal/store/" + backend + "/migrations/*.sql")
			if err != nil || len(files) == 0 {
				t.Fatalf("migrations of %s: %v", backend, err)
			}
			out, stderr, err := airlock(t, env, "migrate")
			if err != nil {
				t.Fatalf("migrate: %v %s", err, stderr)
			}
			first := filepath.Base(files[0])
			last := filepath.Base(files[len(files)-1])
			if !strings.Contains(out, "applied "+strconv.Itoa(len(files))+" migration(s): "+first) || !strings.Contains(out, last) {
				t.Errorf("migrate on a new database said %q; want the %d migrations it applied, %s … %s", out, len(files), first, last)
			}
			out, stderr, err = airlock(t, env, "migrate")
			if err != nil {
				t.Fatalf("second migrate: %v %s", err, stderr)
			}
			if !strings.Contains(out, "no migration to apply") || strings.Contains(out, ".sql") {
				t.Errorf("second migrate said %q; want no migration applied", out)
			}
		})
	}
}

// --help shows each global flag with the kind of value it takes, a bool option as a
// switch, and no empty defaults (issue 24, 13); every command has a description.
func TestHelpShowsFlagKindsAndDescriptions(t *testing.T) {
	env := []string{"AIRLOCK_DATABASE_URL=" + filepath.Join(t.TempDir(), "help.db")}
	out, _, err := airlock(t, env, "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`--migrate\s+apply`),
		regexp.MustCompile(`--lease-max duration\s`),
		regexp.MustCompile(`--listen host:port\s`),
		regexp.MustCompile(`--max-body-bytes bytes\s`),
		regexp.MustCompile(`--reclaim-alert-after int\s`),
	} {
		if !want.MatchString(out) {
			t.Errorf("--help lacks %s:\n%s", want, out)
		}
	}
	for _, bad := range []string{" string ", `(default "")`} {
		if strings.Contains(out, bad) {
			t.Errorf("--help shows %q:\n%s", bad, out)
		}
	}
	// --migrate alone is --migrate=true; a value that is not a bool is refused by name.
	_, stderr, err := airlock(t, env, "serve", "--migrate=maybe")
	if err == nil || !strings.Contains(stderr, "AIRLOCK_MIGRATE") {
		t.Errorf("--migrate=maybe: %v %q", err, stderr)
	}
	// Every command and subcommand has a description longer than its name.
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if len(strings.TrimSpace(c.Short)) < 12 {
			t.Errorf("%q has no description (%q)", c.CommandPath(), c.Short)
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRoot())
	runs, _, err := airlock(t, env, "runs", "--help")
	if err != nil || !strings.Contains(runs, "replace") || !strings.Contains(runs, "unpark") || !strings.Contains(runs, "by hand") {
		t.Errorf("runs --help: %v\n%s", err, runs)
	}
}
