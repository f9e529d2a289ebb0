package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// One version, stamped at build time, in `airlock version`, the readiness log line,
// openapi.json and /metrics: the four never disagree about which build answers.
func TestVersionStampedEverywhere(t *testing.T) {
	const v = "9.8.7-test"
	bin := filepath.Join(t.TempDir(), "airlock")
	build := exec.Command("go", "build", "-ldflags", "-X github.com/airlockhq/airlock/internal/version.Version="+v, "-o", bin, ".")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil || strings.TrimSpace(string(out)) != "airlock "+v {
		t.Fatalf("airlock version: %v %q", err, out)
	}
	s := startServeBinary(t, bin, []string{"AIRLOCK_DATABASE_URL=" + filepath.Join(t.TempDir(), "a.db")})
	if !strings.Contains(s.Logs(), `"version":"`+v+`"`) {
		t.Errorf("the readiness log line lacks the version:\n%s", s.Logs())
	}
	resp, err := http.Get(s.URL + "/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct{ Info struct{ Version string } }
	err = json.NewDecoder(resp.Body).Decode(&doc)
	resp.Body.Close()
	if err != nil || doc.Info.Version != v {
		t.Errorf("openapi.json info.version %q (%v), want %q", doc.Info.Version, err, v)
	}
	resp, err = http.Get(s.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !regexp.MustCompile(`(?m)^airlock_build_info\{[^}]*version="` + regexp.QuoteMeta(v) + `"[^}]*\} 1$`).Match(body) {
		t.Errorf("/metrics has no airlock_build_info with version %s", v)
	}
	// Unstamped, the test binary says so rather than printing "(devel)".
	if out, _, _ := airlock(t, nil, "version"); strings.Contains(out, "(devel)") {
		t.Errorf("unstamped version %q", out)
	}
}
