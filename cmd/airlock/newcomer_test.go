package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// airlockIn runs the binary in dir with only env's AIRLOCK_* settings (none inherited).
func airlockIn(t *testing.T, dir string, env []string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AIRLOCK_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	return out.String(), errb.String(), err
}

// Operator commands run in another directory must not create ./airlock.db and hand out
// a key the server never sees; each says which database it used.
func TestCLIOnlyServeAndMigrateCreateTheDatabase(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		{"apikey", "create", "--name", "n8n"},
		{"apikey", "list"},
		{"actions", "status"},
		{"actions", "disable", "--reason", "test"},
		{"effects", "list"},
		{"purge", "--dry-run"},
		{"user", "list"},
		{"report"},
		{"explain", "k-1"},
	} {
		out, stderr, err := airlockIn(t, dir, nil, args...)
		if err == nil {
			t.Errorf("%v in an empty directory: exit 0 (stdout %q)", args, out)
		}
		if !strings.Contains(stderr, "airlock migrate") || !strings.Contains(stderr, filepath.Join(dir, "airlock.db")) {
			t.Errorf("%v: stderr %q; want the missing database's path and how to create it", args, stderr)
		}
		if _, err := os.Stat(filepath.Join(dir, "airlock.db")); err == nil {
			t.Fatalf("%v created airlock.db", args)
		}
	}
	if _, stderr, err := airlockIn(t, dir, nil, "migrate"); err != nil {
		t.Fatalf("migrate: %v %s", err, stderr)
	}
	raw, stderr, err := airlockIn(t, dir, nil, "apikey", "create", "--name", "n8n")
	if err != nil || !strings.HasPrefix(raw, "alk_") {
		t.Fatalf("apikey create after migrate: %v %q %q", err, raw, stderr)
	}
	if want := "database: sqlite " + filepath.Join(dir, "airlock.db"); !strings.Contains(stderr, want) {
		t.Errorf("apikey create stderr %q; want %q", stderr, want)
	}
}

func TestCLINamesTheDatabaseItUses(t *testing.T) {
	for backend, env := range databases(t) {
		t.Run(backend, func(t *testing.T) {
			if _, stderr, err := airlockIn(t, t.TempDir(), env, "migrate"); err != nil {
				t.Fatalf("migrate: %v %s", err, stderr)
			}
			_, stderr, err := airlockIn(t, t.TempDir(), env, "apikey", "list")
			if err != nil {
				t.Fatalf("apikey list: %v %s", err, stderr)
			}
			if !regexp.MustCompile(`database: ` + backend + ` \S`).MatchString(stderr) {
				t.Errorf("stderr %q does not name the %s database", stderr, backend)
			}
			if backend == "postgres" && strings.Contains(stderr, "password") {
				t.Errorf("stderr shows a password: %q", stderr)
			}
		})
	}
	// A password in a PostgreSQL URL is never shown, even when the server is unreachable.
	_, stderr, _ := airlockIn(t, t.TempDir(), []string{"AIRLOCK_DATABASE_URL=postgres://u:hunter2@127.0.0.1:1/db?connect_timeout=1"}, "apikey", "list")
	if !strings.Contains(stderr, "database: postgres u@127.0.0.1:1/db") || strings.Contains(stderr, "hunter2") {
		t.Errorf("stderr %q", stderr)
	}
}

// Operator commands send nothing, so they need no connector secret: a policy whose
// token_env is unset does not stop them.
func TestOperatorCommandsNeedNoConnectorSecrets(t *testing.T) {
	dir := t.TempDir()
	pol := filepath.Join(dir, "airlock.yaml")
	doc := `notify: {webhook_url_env: AIRLOCK_TEST_UNSET_HOOK}
actions:
  crm_note:
    connector: http
    gate: none
    http: {url: "https://crm.example/notes", token_env: AIRLOCK_TEST_UNSET_TOKEN}
  mail:
    connector: smtp
    gate: none
    smtp: {host: smtp.example, port: 587, from: a@example.com, username: a, password_file: /nonexistent/secret}
`
	if err := os.WriteFile(pol, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{"AIRLOCK_DATABASE_URL=" + filepath.Join(dir, "a.db"), "AIRLOCK_CONFIG=" + pol}
	if _, stderr, err := airlockIn(t, dir, env, "migrate"); err != nil {
		t.Fatalf("migrate: %v %s", err, stderr)
	}
	for _, args := range [][]string{
		{"actions", "disable", "--type", "crm_note", "--reason", "incident 12"},
		{"actions", "status"},
		{"actions", "enable", "--type", "crm_note", "--reason", "fixed"},
		{"effects", "list"},
		{"purge", "--dry-run"},
	} {
		if out, stderr, err := airlockIn(t, dir, env, args...); err != nil {
			t.Errorf("%v: %v\n%s%s", args, err, out, stderr)
		}
	}
	// serve sends, so it still refuses the missing secrets.
	_, stderr, err := airlockIn(t, dir, append(env, "AIRLOCK_LISTEN=127.0.0.1:0"), "serve")
	if err == nil || !strings.Contains(stderr, "AIRLOCK_TEST_UNSET_TOKEN") {
		t.Errorf("serve without the token: %v %s", err, stderr)
	}
	// A policy that is wrong in shape still stops an operator command.
	if err := os.WriteFile(pol, []byte("actions: {crm_note: {connector: ftp}}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, stderr, err := airlockIn(t, dir, env, "actions", "status"); err == nil || !strings.Contains(stderr, "actions.crm_note.connector") {
		t.Errorf("bad policy: %v %s", err, stderr)
	}
}

// Scopes may be repeated or comma-separated, and help lists every one.
func TestAPIKeyScopesRepeatAndCommas(t *testing.T) {
	dir := t.TempDir()
	env := []string{"AIRLOCK_DATABASE_URL=" + filepath.Join(dir, "a.db")}
	if _, stderr, err := airlockIn(t, dir, env, "migrate"); err != nil {
		t.Fatalf("migrate: %v %s", err, stderr)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--name", "a", "--scope", "runs", "--scope", "read"}, `a\s+runs,read\s`},
		{[]string{"--name", "b", "--scope", "worker,operator", "--scope", "read"}, `b\s+worker,operator,read\s`},
		{[]string{"--name", "c"}, `c\s+runs\s`},
	} {
		if _, stderr, err := airlockIn(t, dir, env, append([]string{"apikey", "create"}, c.args...)...); err != nil {
			t.Fatalf("%v: %v %s", c.args, err, stderr)
		}
		list, _, _ := airlockIn(t, dir, env, "apikey", "list")
		if !regexp.MustCompile(`(?m)` + c.want).MatchString(list) {
			t.Errorf("%v: list\n%s\nwant %s", c.args, list, c.want)
		}
	}
	for _, args := range [][]string{{"apikey", "--help"}, {"apikey", "create", "--help"}} {
		out, _, _ := airlockIn(t, dir, env, args...)
		for _, sc := range []string{"runs", "read", "worker", "operator", "admin", "evaluator"} {
			if !strings.Contains(out, sc) {
				t.Errorf("%v does not list scope %s", args, sc)
			}
		}
	}
}

// An unknown state is an error, not an empty table that reads as "nothing in that state".
func TestEffectsListRefusesUnknownState(t *testing.T) {
	dir := t.TempDir()
	env := []string{"AIRLOCK_DATABASE_URL=" + filepath.Join(dir, "a.db")}
	if _, stderr, err := airlockIn(t, dir, env, "migrate"); err != nil {
		t.Fatalf("migrate: %v %s", err, stderr)
	}
	out, stderr, err := airlockIn(t, dir, env, "effects", "list", "--state", "unknown,bogus")
	if err == nil || !strings.Contains(stderr, `"bogus"`) || !strings.Contains(stderr, "pending") {
		t.Errorf("effects list --state bogus: %v %q %q", err, out, stderr)
	}
	if _, stderr, err := airlockIn(t, dir, env, "effects", "list", "--state", "unknown", "--state", "failed"); err != nil {
		t.Errorf("valid states: %v %s", err, stderr)
	}
}
