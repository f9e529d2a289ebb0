package errcodes

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestGeneratedFilesAreCurrent is `make verify` inside the test command: a code added to
// All without `go generate`, or a generated list edited by hand, fails here.
func TestGeneratedFilesAreCurrent(t *testing.T) {
	stale, err := Stale(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range stale {
		t.Errorf("%s is stale: run `make generate` (go generate ./internal/errcodes) and commit it", p)
	}
}

// copyTargets copies the generated files into a scratch repository root.
func copyTargets(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, p := range Paths() {
		b, err := os.ReadFile(filepath.Join("..", "..", p))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestGenerateRewritesOnlyTheLists: a list edited by hand (a code added the old way, one
// dropped) comes back as All says, the hand-written prose around it stays, and a second
// run changes nothing — so merging a branch that edited the copies is one `go generate`.
func TestGenerateRewritesOnlyTheLists(t *testing.T) {
	dir := copyTargets(t)
	edit := func(p, old, new string) {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), old) {
			t.Fatalf("%s has no %q", p, old)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte(strings.Replace(string(b), old, new, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	edit("docs/errors.md", "| 409 | `lease_lost` |", "| 409 | `hand_added` | by hand |\n| 409 | `lease_lost` |")
	edit("docs/errors.md", "## Outages", "A hand-written paragraph.\n\n## Outages")
	edit("internal/httpapi/openapi.json", `"lease_lost",`, `"hand_added", "lease_lost",`+"\n")
	edit("internal/httpapi/openapi.json", `"run_not_found",`+"\n", "")
	edit("clients/python/airlock/errors.py", `    code = "no_link"`+"\n", `    code = "no_link"`+"\n\n\nclass HandAddedError(APIError):\n    code = \"hand_added\"\n")
	edit("clients/typescript/errors.js", "export class LeaseLostError", "export class HandAddedError extends APIError { static code = 'hand_added'; }\nexport class LeaseLostError")
	edit("clients/typescript/index.d.ts", "export class NoLinkError", "export class Gone extends APIError {}\nexport class NoLinkError")

	unlisted, err := Unlisted(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(unlisted) != 1 || unlisted[0] != `{"hand_added", 409, "by hand"},` {
		t.Errorf("Unlisted = %q, want the hand-added docs row as a line for All", unlisted)
	}
	stale, err := Stale(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(stale) != len(Paths()) {
		t.Fatalf("stale = %v, want every file", stale)
	}
	files, err := Generate(dir)
	if err != nil {
		t.Fatal(err)
	}
	for p, b := range files {
		if strings.Contains(string(b), "hand_added") || strings.Contains(string(b), "HandAdded") || strings.Contains(string(b), "class Gone") {
			t.Errorf("%s keeps the hand-added code", p)
		}
		if p != "docs/errors.md" && !strings.Contains(string(b), "run_not_found") {
			t.Errorf("%s lacks run_not_found after generation", p)
		}
		if err := os.WriteFile(filepath.Join(dir, p), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if !strings.Contains(string(files["docs/errors.md"]), "A hand-written paragraph.\n\n## Outages") {
		t.Error("docs/errors.md lost its hand-written prose")
	}
	if stale, err := Stale(dir); err != nil || len(stale) != 0 {
		t.Errorf("after one run, stale = %v, %v: generation is not idempotent", stale, err)
	}
	// The result is what the repository holds: nothing else differs.
	for p, b := range files {
		orig, _ := os.ReadFile(filepath.Join("..", "..", p))
		if p != "docs/errors.md" && string(orig) != string(b) {
			t.Errorf("%s differs from the repository's after regeneration", p)
		}
	}
}

// TestGenerateNeedsItsMarkers: a file whose markers were lost is an error, not a file
// rewritten from scratch or silently left stale.
func TestGenerateNeedsItsMarkers(t *testing.T) {
	dir := copyTargets(t)
	p := filepath.Join(dir, "clients/python/airlock/errors.py")
	b, _ := os.ReadFile(p)
	if err := os.WriteFile(p, []byte(strings.Replace(string(b), "# "+endMark+"\n", "", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Generate(dir); err == nil || !strings.Contains(err.Error(), "errors.py") {
		t.Fatalf("Generate without an end marker: %v", err)
	}
}

func TestValidate(t *testing.T) {
	ok := Code{"lease_lost", 409, "you do not hold a lease"}
	for _, tc := range []struct {
		name  string
		codes []Code
	}{
		{"twice", []Code{ok, ok}},
		{"upper case", []Code{{"Lease_lost", 409, "m"}}},
		{"not an error status", []Code{{"ok_code", 200, "m"}}},
		{"pipe breaks the table", []Code{{"a_code", 409, "a | b"}}},
		{"closes a comment", []Code{{"a_code", 409, "a */ b"}}},
		{"no meaning", []Code{{"a_code", 409, ""}}},
	} {
		if err := validate(tc.codes); err == nil {
			t.Errorf("%s: validate accepted %v", tc.name, tc.codes)
		}
	}
	if err := validate(All); err != nil {
		t.Fatal(err)
	}
	if got := ClassName("idempotency_key_reused"); got != "IdempotencyKeyReusedError" {
		t.Errorf("ClassName = %s", got)
	}
}
