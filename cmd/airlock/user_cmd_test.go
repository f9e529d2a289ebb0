package main

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"slices"
	"strings"
	"testing"
)

// person is a browser: cookies kept, redirects not followed, Origin sent on posts.
type person struct {
	t    *testing.T
	base string
	c    *http.Client
}

func newPerson(t *testing.T, base string) *person {
	jar, _ := cookiejar.New(nil)
	return &person{t: t, base: base, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (p *person) do(method, path string, form url.Values) (int, string) {
	p.t.Helper()
	req, _ := http.NewRequest(method, p.base+path, strings.NewReader(form.Encode()))
	if method == "POST" {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", p.base)
	}
	resp, err := p.c.Do(req)
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (p *person) signIn(name, password string) (int, string) {
	return p.do("POST", "/login", url.Values{"username": {name}, "password": {password}})
}

// signedIn reports who the pages say is signed in ("" for nobody).
func (p *person) signedIn() string {
	_, page := p.do("GET", "/login", nil)
	_, after, ok := strings.Cut(page, "Signed in as ")
	if !ok {
		return ""
	}
	who, _, _ := strings.Cut(after, ")")
	return who + ")"
}

// Accounts are managed from the CLI against a running server; names and
// roles are validated, and disabling, new roles, a new password or removal end the
// person's sessions at once.
func TestUserCommands(t *testing.T) {
	for name, env := range databases(t) {
		t.Run(name, func(t *testing.T) {
			const pw, pw2 = "correct horse battery", "another long passphrase"
			run := func(extra []string, args ...string) (string, error) {
				t.Helper()
				out, errOut, err := airlock(t, slices.Concat(env, extra), args...)
				return out + errOut, err
			}
			withPW := func(p string) []string { return []string{"AIRLOCK_USER_PASSWORD=" + p} }
			if out, err := run(nil, "migrate"); err != nil { // operator commands never create the database
				t.Fatalf("migrate: %v %s", err, out)
			}
			for _, bad := range [][]string{
				{"user", "add", "<img src=x onerror=alert(1)>", "--role", "support-lead"},
				{"user", "add", "ana lopez", "--role", "support-lead"},
				{"user", "add", "ana", "--role", "<img src=x>"},
				{"user", "add", "ana", "--role", "support-lead,<b>x</b>"},
				{"user", "add", "ana", "--role", " , "},
			} {
				if out, err := run(withPW(pw), bad...); err == nil {
					t.Fatalf("%v accepted: %s", bad, out)
				}
			}
			if out, err := run(withPW("short"), "user", "add", "ana", "--role", "support"); err == nil {
				t.Fatalf("a short password was accepted: %s", out)
			}
			if out, err := run(withPW(pw), "user", "add", "lead", "--role", "support-lead"); err != nil {
				t.Fatalf("add: %v %s", err, out)
			}
			if out, err := run(withPW(pw), "user", "add", "lead", "--role", "support-lead"); err == nil {
				t.Fatalf("added twice: %s", out)
			}
			base := serveProcess(t, env)
			lead := newPerson(t, base)
			if code, _ := lead.signIn("lead", pw); code != 200 || lead.signedIn() != "lead (support-lead)" {
				t.Fatalf("sign-in: %d %q", code, lead.signedIn())
			}

			if out, err := run(nil, "user", "disable", "lead"); err != nil {
				t.Fatalf("disable: %v %s", err, out)
			}
			if who := lead.signedIn(); who != "" {
				t.Fatalf("still signed in as %s after disable", who)
			}
			if code, _ := newPerson(t, base).signIn("lead", pw); code != http.StatusUnauthorized {
				t.Fatalf("a disabled account signed in: %d", code)
			}
			out, _ := run(nil, "user", "list")
			var row []string
			for _, line := range strings.Split(out, "\n") {
				if f := strings.Fields(line); len(f) == 4 && f[0] == "lead" {
					row = f
				}
			}
			if row == nil || row[1] != "support-lead" || row[3] == "-" || strings.Contains(out, "$2a$") {
				t.Fatalf("list: %s", out)
			}
			if out, err := run(nil, "user", "enable", "lead"); err != nil {
				t.Fatalf("enable: %v %s", err, out)
			}
			if code, _ := lead.signIn("lead", pw); code != 200 {
				t.Fatalf("sign-in after enable: %d", code)
			}

			if out, err := run(nil, "user", "set-roles", "lead", "--role", "support-lead,billing"); err != nil {
				t.Fatalf("set-roles: %v %s", err, out)
			}
			if who := lead.signedIn(); who != "" {
				t.Fatalf("still signed in as %s after set-roles", who)
			}
			if out, err := run(nil, "user", "set-roles", "lead", "--role", "admin,<script>"); err == nil {
				t.Fatalf("set-roles accepted markup: %s", out)
			}
			if lead.signIn("lead", pw); lead.signedIn() != "lead (support-lead, billing)" {
				t.Fatalf("roles after set-roles: %q", lead.signedIn())
			}

			if out, err := run(withPW(pw2), "user", "reset-password", "lead"); err != nil {
				t.Fatalf("reset-password: %v %s", err, out)
			}
			if who := lead.signedIn(); who != "" {
				t.Fatalf("still signed in as %s after reset-password", who)
			}
			if code, _ := lead.signIn("lead", pw); code != http.StatusUnauthorized {
				t.Fatalf("the old password still works: %d", code)
			}
			if code, _ := lead.signIn("lead", pw2); code != 200 {
				t.Fatalf("the new password: %d", code)
			}

			if out, err := run(nil, "user", "remove", "lead"); err != nil {
				t.Fatalf("remove: %v %s", err, out)
			}
			if who := lead.signedIn(); who != "" {
				t.Fatalf("still signed in as %s after remove", who)
			}
			if code, _ := lead.signIn("lead", pw2); code != http.StatusUnauthorized {
				t.Fatalf("a removed account signed in: %d", code)
			}
			if out, _ := run(nil, "user", "list"); strings.Contains(out, "lead") {
				t.Fatalf("list after remove: %s", out)
			}
			if out, err := run(nil, "user", "disable", "nobody"); err == nil || !strings.Contains(out, "no local account") {
				t.Fatalf("disable of an unknown name: %v %s", err, out)
			}
		})
	}
}

// TestUserLinkSlack links and unlinks Slack users from the CLI: Slack ids are checked, a
// local account is linked by name, a single sign-on subject only with --sso, and an
// unlink of nothing is an error.
func TestUserLinkSlack(t *testing.T) {
	for name, env := range databases(t) {
		t.Run(name, func(t *testing.T) {
			run := func(extra []string, args ...string) (string, error) {
				t.Helper()
				out, errOut, err := airlock(t, slices.Concat(env, extra), args...)
				return out + errOut, err
			}
			if out, err := run(nil, "migrate"); err != nil {
				t.Fatalf("migrate: %v %s", err, out)
			}
			if out, err := run([]string{"AIRLOCK_USER_PASSWORD=correct horse battery"}, "user", "add", "lead", "--role", "support-lead"); err != nil {
				t.Fatalf("add: %v %s", err, out)
			}
			for _, bad := range [][]string{
				{"user", "link-slack", "lead", "--team", "t01", "--user", "U01"},
				{"user", "link-slack", "lead", "--team", "T01", "--user", "<@U01>"},
				{"user", "link-slack", "nobody", "--team", "T01", "--user", "U01"},
				{"user", "link-slack", "lead", "--team", "T01", "--user", "U01", "--sso"},
				{"user", "unlink-slack", "--team", "T01", "--user", "U01"},
			} {
				if out, err := run(nil, bad...); err == nil {
					t.Fatalf("%v accepted: %s", bad, out)
				}
			}
			if out, err := run(nil, "user", "link-slack", "lead", "--team", "T01", "--user", "U01"); err != nil || !strings.Contains(out, "linked slack:T01/U01 to lead") {
				t.Fatalf("link: %v %s", err, out)
			}
			if out, err := run(nil, "user", "link-slack", "idp-7f3a", "--team", "T01", "--user", "U02", "--sso"); err != nil {
				t.Fatalf("link sso: %v %s", err, out)
			}
			for _, u := range []string{"U01", "U02"} {
				if out, err := run(nil, "user", "unlink-slack", "--team", "T01", "--user", u); err != nil || !strings.Contains(out, "unlinked") {
					t.Fatalf("unlink %s: %v %s", u, err, out)
				}
			}
			if out, err := run(nil, "user", "unlink-slack", "--team", "T01", "--user", "U01"); err == nil {
				t.Fatalf("unlinked twice: %s", out)
			}
		})
	}
}
