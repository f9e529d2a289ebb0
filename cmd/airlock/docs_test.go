package main

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/internal/httpapi"
	"github.com/airlockhq/airlock/internal/web"
)

// docFiles are the pages a newcomer reads: the README, docs/, and the n8n package's.
func docFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "../../README.md", "../../integrations/n8n/README.md")
	sort.Strings(files)
	return files
}

var (
	mdLink   = regexp.MustCompile(`\[[^\]]*\]\(([^)\s]+)\)`)
	mdFence  = regexp.MustCompile("(?s)```([a-z]*)[^\n]*\n(.*?)```")
	mdHeader = regexp.MustCompile(`(?m)^#{1,6} +(.+?) *$`)
)

var readmeSection = regexp.MustCompile(`README's \*([^*]+)\*`)

// anchorOf is GitHub's anchor of a heading: lower case, spaces to hyphens, punctuation
// dropped.
func anchorOf(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') || r > 127 && !strings.ContainsRune("—–·…’“”", r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the GitHub anchors of a Markdown file's headings.
func anchors(text string) map[string]bool {
	// Headings inside code blocks (a shell comment) are not headings.
	text = mdFence.ReplaceAllString(text, "")
	out := map[string]bool{}
	seen := map[string]int{}
	for _, m := range mdHeader.FindAllStringSubmatch(text, -1) {
		a := anchorOf(m[1])
		if n := seen[a]; n > 0 {
			out[a+"-"+itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestDocsLinks checks every relative link in the README and docs/: the file exists
// inside the repository and, with a #fragment, has that heading (issue 24, 12).
func TestDocsLinks(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	texts := map[string]string{}
	read := func(p string) (string, bool) {
		if s, ok := texts[p]; ok {
			return s, true
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return "", false
		}
		texts[p] = string(b)
		return string(b), true
	}
	checked := 0
	for _, f := range docFiles(t) {
		text, ok := read(f)
		if !ok {
			t.Fatalf("cannot read %s", f)
		}
		name, _ := filepath.Rel(root, mustAbs(t, f))
		if strings.Contains(text, "../shared/") {
			t.Errorf("%s points outside the repository (../shared/)", name)
		}
		prose := mdFence.ReplaceAllString(text, "")
		// "the README's *Tests*" names a README section in prose: it must exist too.
		readme, _ := read(filepath.Join(root, "README.md"))
		for _, m := range readmeSection.FindAllStringSubmatch(prose, -1) {
			checked++
			if !anchors(readme)[anchorOf(m[1])] {
				t.Errorf("%s: the README has no section %q", name, m[1])
			}
		}
		for _, m := range mdLink.FindAllStringSubmatch(prose, -1) {
			link := m[1]
			if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
				continue
			}
			checked++
			path, frag, _ := strings.Cut(link, "#")
			target := mustAbs(t, f)
			if path != "" {
				target = filepath.Join(filepath.Dir(target), path)
			}
			if rel, err := filepath.Rel(root, target); err != nil || strings.HasPrefix(rel, "..") {
				t.Errorf("%s: link %q points outside the repository", name, link)
				continue
			}
			if _, err := os.Stat(target); err != nil {
				t.Errorf("%s: link %q: no such file", name, link)
				continue
			}
			if frag == "" || !strings.HasSuffix(target, ".md") {
				continue
			}
			tt, _ := read(target)
			if !anchors(tt)[frag] {
				t.Errorf("%s: link %q: %s has no heading #%s", name, link, filepath.Base(target), frag)
			}
		}
	}
	if checked < 50 {
		t.Fatalf("checked only %d links: the scan is broken", checked)
	}
}

func mustAbs(t *testing.T, p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

var (
	inlineAirlock = regexp.MustCompile("`(?:\\./)?airlock ([^`]+)`")
	flagToken     = regexp.MustCompile(`^--([a-z][a-z0-9-]*)`)
)

// commandLines returns each airlock command line a doc names: in shell code blocks and in
// inline code that starts with "airlock " or "./airlock ".
func commandLines(text string) []string {
	var out []string
	for _, m := range mdFence.FindAllStringSubmatch(text, -1) {
		if m[1] != "" && m[1] != "sh" && m[1] != "bash" && m[1] != "console" && m[1] != "shell" {
			continue
		}
		body := strings.ReplaceAll(m[2], "\\\n", " ")
		for _, line := range strings.Split(body, "\n") {
			if i := strings.Index(line, " #"); i >= 0 {
				line = line[:i]
			}
			if strings.HasPrefix(strings.TrimSpace(line), "#") {
				continue
			}
			// A block without a language is often a command's output (explain's
			// actor column says airlock): only its command lines count.
			if l := strings.TrimSpace(line); m[1] == "" && !strings.HasPrefix(l, "airlock ") && !strings.HasPrefix(l, "./airlock ") && !strings.HasPrefix(l, "$ ") {
				continue
			}
			for _, seg := range regexp.MustCompile(`\|\||&&|[|;]|\$\(|\)`).Split(line, -1) {
				f := strings.Fields(seg)
				for i, w := range f {
					if w == "airlock" || strings.HasSuffix(w, "/airlock") {
						if i > 0 && (f[i-1] == "-u" || strings.HasSuffix(f[i-1], "=")) {
							continue // sudo -u airlock, name=airlock
						}
						out = append(out, strings.Join(f[i+1:], " "))
						break
					}
				}
			}
		}
	}
	prose := mdFence.ReplaceAllString(text, "")
	for _, m := range inlineAirlock.FindAllStringSubmatch(prose, -1) {
		if w, _, _ := strings.Cut(m[1], " "); logPhrases[w] {
			continue
		}
		out = append(out, m[1])
	}
	return out
}

// logPhrases start inline code that quotes airlock's log lines and messages ("airlock
// serving", "airlock effect ID: outcome unknown"), not commands.
var logPhrases = map[string]bool{"serving": true, "refused": true, "effect": true}

// checkCommand resolves line (what follows "airlock") against the command tree and
// returns what is wrong with it, or "".
func checkCommand(root *cobra.Command, line string) string {
	words := strings.Fields(line)
	if len(words) == 0 || !regexp.MustCompile(`^[a-z][a-z0-9-]*$`).MatchString(words[0]) {
		return "" // "airlock" alone, or a placeholder (<command>, …)
	}
	cmd := root
	i := 0
	for ; i < len(words); i++ {
		var next *cobra.Command
		for _, c := range cmd.Commands() {
			if c.Name() == words[i] || c.HasAlias(words[i]) {
				next = c
			}
		}
		if next == nil {
			break
		}
		cmd = next
	}
	if cmd == root {
		return "no command " + words[0]
	}
	if i < len(words) && cmd.HasSubCommands() && !cmd.Runnable() && !strings.HasPrefix(words[i], "-") &&
		regexp.MustCompile(`^[a-z][a-z-]*$`).MatchString(words[i]) {
		return "no command " + cmd.CommandPath() + " " + words[i]
	}
	for _, w := range words[i:] {
		m := flagToken.FindStringSubmatch(w)
		if m == nil {
			continue
		}
		if m[1] == "help" {
			continue
		}
		if cmd.Flags().Lookup(m[1]) == nil && cmd.InheritedFlags().Lookup(m[1]) == nil && root.PersistentFlags().Lookup(m[1]) == nil {
			return cmd.CommandPath() + " has no flag --" + m[1]
		}
	}
	return ""
}

// TestDocsCommands checks every `airlock …` command line in the README and docs/
// against the binary's commands and flags (issue 24, 12).
func TestDocsCommands(t *testing.T) {
	root := newRoot()
	n := 0
	for _, f := range docFiles(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range commandLines(string(b)) {
			n++
			if msg := checkCommand(root, line); msg != "" {
				t.Errorf("%s: `airlock %s`: %s", filepath.Base(f), line, msg)
			}
		}
	}
	if n < 40 {
		t.Fatalf("found only %d airlock commands in the docs: the scan is broken", n)
	}
	t.Logf("%d airlock command lines checked", n)
}

// The checker itself: what it must refuse and what it must let through.
func TestDocsCommandChecker(t *testing.T) {
	root := newRoot()
	for _, c := range []struct {
		line string
		bad  bool
	}{
		{"apikey create --name n8n --scope runs", false},
		{"effects resolve ID --outcome sent --note x", false},
		{"serve --config airlock.yaml --migrate=false", false},
		{"<command> --help", false},
		{"apikey mint --name x", true},
		{"effects list --status unknown", true},
		{"frobnicate", true},
		{"serve --listen 127.0.0.1:8080 --tls", true},
	} {
		if got := checkCommand(root, c.line) != ""; got != c.bad {
			t.Errorf("checkCommand(%q) refused=%v, want %v (%s)", c.line, got, c.bad, checkCommand(root, c.line))
		}
	}
}

var docRoute = regexp.MustCompile(`\b(GET|POST|PUT|DELETE|PATCH) (/v1/[A-Za-z0-9_{}./-]*)`)

// TestDocsRoutes checks every "METHOD /v1/…" the README and docs/ name against the
// routes airlock serves (issue 24, 12: architecture.md named a GET /v1/effects/{id}
// that answers 404).
func TestDocsRoutes(t *testing.T) {
	match := func(method, path string) bool {
		ps := strings.Split(strings.TrimRight(path, "/."), "/")
		for _, r := range httpapi.Routes {
			rs := strings.Split(r.Pattern, "/")
			if r.Method != method || len(rs) != len(ps) {
				continue
			}
			ok := true
			for i := range rs {
				if rs[i] != ps[i] && !(strings.HasPrefix(rs[i], "{") && ps[i] != "") {
					ok = false
					break
				}
			}
			if ok {
				return true
			}
		}
		return false
	}
	n := 0
	for _, f := range docFiles(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range docRoute.FindAllStringSubmatch(string(b), -1) {
			n++
			if !match(m[1], m[2]) {
				t.Errorf("%s: %s %s is not a route airlock serves", filepath.Base(f), m[1], m[2])
			}
		}
	}
	if n < 30 {
		t.Fatalf("found only %d routes in the docs: the scan is broken", n)
	}
}

// TestReadmeIsAFrontPage: the README tells a user what airlock is, what they get, how to
// run it, whether it is stable, its known limits and its licence, and nothing from the
// development log (issue 35, 8): history is CHANGELOG.md's, test prerequisites
// docs/testing.md's.
func TestReadmeIsAFrontPage(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	heads := anchors(readme)
	for _, h := range []string{"what-you-get", "quick-start", "where-to-go-next", "is-it-stable", "known-limits", "licence"} {
		if !heads[h] {
			t.Errorf("README has no section #%s", h)
		}
	}
	for _, h := range []string{"status", "tests"} {
		if heads[h] {
			t.Errorf("README has a section #%s: history goes to CHANGELOG.md, test prerequisites to docs/testing.md", h)
		}
	}
	internal := regexp.MustCompile(`(?i)\bcensus\b|\bHOT\b|begin-mark|\(00\d\d\)|\bissue \d+|this round`)
	for _, f := range []string{"../../README.md", "../../CHANGELOG.md"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range internal.FindAllString(string(b), -1) {
			t.Errorf("%s speaks the development log's words: %q", filepath.Base(f), m)
		}
	}
	if n := len(strings.Fields(readme)); n > 1100 {
		t.Errorf("README has %d words: a front page, not a manual (reference goes to docs/)", n)
	}
	if !strings.Contains(readme, "[Apache License 2.0](LICENSE)") {
		t.Error("README does not name its licence, linked to LICENSE")
	}
}

// TestLicence: the licence is Apache-2.0 at the root and in every package's metadata (the
// n8n node MIT, as n8n requires), so
// an evaluator (and a package index) can tell what they may do with it.
func TestLicence(t *testing.T) {
	lic, err := os.ReadFile("../../LICENSE")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(lic), "Apache License\n                           Version 2.0, January 2004") ||
		!strings.Contains(string(lic), "END OF TERMS AND CONDITIONS") {
		t.Error("LICENSE is not the full Apache License 2.0 text")
	}
	for f, want := range map[string]string{
		"../../clients/python/pyproject.toml":              `license = { text = "Apache-2.0" }`,
		"../../clients/python/_backend/airlock_backend.py": `License: Apache-2.0`,
		"../../clients/typescript/package.json":            `"license": "Apache-2.0"`,
		// n8n verifies only MIT community nodes (n8n-node lint's strict mode refuses
		// another licence): the node alone is MIT, with its own LICENSE.
		"../../integrations/n8n/package.json": `"license": "MIT"`,
		"../../integrations/n8n/LICENSE":      "MIT License",
	} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), want) {
			t.Errorf("%s lacks %s", f, want)
		}
	}
}

var (
	routeCell = regexp.MustCompile("(?m)^\\| (`[^|]*?) \\| [^|]+ \\| ")
	backtick  = regexp.MustCompile("`([^`]+)`")
)

// apiTableRoutes reads docs/api.md's route table: each row's first cell names one or more
// routes ("`GET /a` · `POST /a/{id}`", "`GET` / `PUT /a`", "`POST /a/{id}/complete` ·
// `/fail`": a bare path ends the previous one's).
func apiTableRoutes(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(b), "| method and path | scope | does |")
	if !ok {
		t.Fatal("docs/api.md has no route table")
	}
	table, _, _ = strings.Cut(table, "\n\n")
	out := map[string]bool{}
	for _, row := range routeCell.FindAllStringSubmatch(table, -1) {
		var methods []string
		var last string
		for _, code := range backtick.FindAllStringSubmatch(row[1], -1) {
			f := strings.Fields(code[1])
			switch {
			case len(f) == 1 && !strings.HasPrefix(f[0], "/"): // `GET` / `PUT /path`
				methods = append(methods, f[0])
				continue
			case len(f) == 1: // `/fail` after `POST /v1/effects/{id}/complete`
				if last == "" {
					t.Fatalf("docs/api.md: %q has no route before it", code[1])
				}
				m, p, _ := strings.Cut(last, " ")
				last = m + " " + p[:strings.LastIndex(p, "/")] + f[0]
				out[last] = true
				continue
			}
			path, _, _ := strings.Cut(f[1], "?")
			for _, m := range append(methods, f[0]) {
				last = m + " " + path
				out[last] = true
			}
			methods = nil
		}
	}
	return out
}

// TestAPIDocListsEveryRoute keeps docs/api.md's route table and the router the same (issue
// 35, 10: it lacked 9 of the API's routes): every API route has a row, and every row names
// a route the API or the pages serve.
func TestAPIDocListsEveryRoute(t *testing.T) {
	inDoc := apiTableRoutes(t)
	served := map[string]bool{}
	for _, r := range httpapi.Routes {
		name := r.Method + " " + r.Pattern
		served[name] = true
		if !inDoc[name] {
			t.Errorf("docs/api.md's route table has no row for %s", name)
		}
	}
	for _, p := range web.Patterns {
		served[p] = true
	}
	for name := range inDoc {
		if !served[name] {
			t.Errorf("docs/api.md's route table names %s, which airlock does not serve", name)
		}
	}
	if len(inDoc) < 30 {
		t.Fatalf("read only %d routes from docs/api.md's table: the parser is broken", len(inDoc))
	}
}

// TestConfigurationDocListsEveryCommand keeps configuration.md's command table and the
// CLI the same (issue 35, 10: it lacked 5 commands): every command a user can run — each
// leaf of the command tree, or its parent when the table names the parent's subcommands
// on one row ("`airlock user list` · `disable` · …") — has a row, and every row resolves.
func TestConfigurationDocListsEveryCommand(t *testing.T) {
	b, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(b), "| command | does |")
	if !ok {
		t.Fatal("docs/configuration.md has no command table")
	}
	table, _, _ = strings.Cut(table, "\n\n")
	root := newRoot()
	named := map[string]bool{}
	for _, line := range strings.Split(table, "\n") {
		cell, _, ok := strings.Cut(strings.TrimPrefix(line, "| "), " | ")
		if !ok || !strings.HasPrefix(cell, "`airlock ") {
			continue
		}
		var parent string
		for _, code := range backtick.FindAllStringSubmatch(cell, -1) {
			words := strings.Fields(code[1])
			if words[0] == "airlock" {
				words = words[1:]
				parent = words[0]
			} else if parent != "" { // `disable` after `airlock user list`
				words = append([]string{parent}, words...)
			}
			var path []string
			for _, w := range words {
				if !regexp.MustCompile(`^[a-z][a-z-]*$`).MatchString(w) {
					break
				}
				path = append(path, w)
			}
			named[strings.Join(path, " ")] = true
			if msg := checkCommand(root, strings.Join(words, " ")); msg != "" {
				t.Errorf("docs/configuration.md: `airlock %s`: %s", strings.Join(words, " "), msg)
			}
		}
	}
	var walk func(c *cobra.Command, path string)
	walk = func(c *cobra.Command, path string) {
		for _, sub := range c.Commands() {
			if sub.Hidden || sub.Name() == "help" || sub.Name() == "completion" {
				continue
			}
			p := strings.TrimSpace(path + " " + sub.Name())
			if sub.HasSubCommands() {
				walk(sub, p)
				continue
			}
			if !named[p] {
				t.Errorf("docs/configuration.md's command table has no row for `airlock %s`", p)
			}
		}
	}
	walk(root, "")
}

// TestMakeBuildWarnsFirst: the first `make build` compiles the SQLite driver for minutes
// in silence; it says so before it starts (issue 35, 10).
func TestMakeBuildWarnsFirst(t *testing.T) {
	b, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	_, target, ok := strings.Cut(string(b), "\nbuild:\n")
	if !ok {
		t.Fatal("the Makefile has no build target")
	}
	first, rest, _ := strings.Cut(target, "\n")
	if !strings.HasPrefix(first, "\t@echo ") || !strings.Contains(first, "first build") || !strings.Contains(first, "minutes") ||
		!strings.Contains(strings.SplitN(rest, "\n\n", 2)[0], "go build") {
		t.Errorf("make build's first line is %q; want an echo that the first build takes minutes, then go build", first)
	}
}
