package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestTutorial runs docs/tutorial.md's blocks marked ```sh tutorial, in order, in one
// bash, against the built binary and the fake provider, so the tutorial cannot rot. Its
// fixed ports (8080, 9090) become free ones.
func TestTutorial(t *testing.T) {
	for _, tool := range []string{"bash", "curl", "jq"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("the tutorial needs %s (.ci/run installs it)", tool)
			}
			t.Skipf("the tutorial needs %s", tool)
		}
	}
	doc, err := os.ReadFile("../../docs/tutorial.md")
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	for _, m := range regexp.MustCompile("(?s)```sh tutorial\n(.*?)```").FindAllStringSubmatch(string(doc), -1) {
		blocks = append(blocks, m[1])
	}
	if len(blocks) < 10 {
		t.Fatalf("docs/tutorial.md has %d blocks marked for the test", len(blocks))
	}
	dir := t.TempDir()
	if err := os.Symlink(binary, filepath.Join(dir, "airlock")); err != nil {
		t.Fatal(err)
	}
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "fakeprovider"), "../../examples/fakeprovider")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the fake provider: %v\n%s", err, out)
	}
	script := strings.Join(blocks, "\n")
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	script = strings.ReplaceAll(script, "127.0.0.1:8080", listen)
	script = strings.ReplaceAll(script, "127.0.0.1:9090", fmt.Sprintf("127.0.0.1:%d", freePort(t)))
	// The last block stops the background jobs; wait for them so the test leaves nothing running.
	script = "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + script + "\nwait\n"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AIRLOCK_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "AIRLOCK_LISTEN="+listen) // the tutorial's serve uses the default, 127.0.0.1:8080
	start := time.Now()
	out, err := cmd.CombinedOutput()
	logs, _ := os.ReadFile(filepath.Join(dir, "airlock.log"))
	if err != nil {
		t.Fatalf("the tutorial failed after %s: %v\n%s\nairlock.log:\n%s", time.Since(start).Round(time.Millisecond), err, out, logs)
	}
	t.Logf("the tutorial ran in %s", time.Since(start).Round(time.Millisecond))
	for _, want := range []string{`{"claimed":false,"state":"processing"}`, "ticket-2: completed", "is now completed", "actions_disabled"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the tutorial's output lacks %q:\n%s", want, out)
		}
	}
}
