package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
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
// fixed ports (8080, 9090) become free ones. It also runs the tutorial the way a newcomer
// met it (issue 24, 11): with the README quick start's airlock still on the port, and
// with a serve that cannot start; both must stop at once and say why.
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
	// macOS's shell is zsh: bash-only devices print nothing there (issue 35, 10).
	if strings.Contains(string(doc), "/dev/tcp") {
		t.Error("docs/tutorial.md uses bash's /dev/tcp, which zsh does not have: use curl")
	}
	fake := filepath.Join(t.TempDir(), "fakeprovider")
	build := exec.Command("go", "build", "-o", fake, "../../examples/fakeprovider")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the fake provider: %v\n%s", err, out)
	}
	script := strings.Join(blocks, "\n")

	t.Run("from start to end", func(t *testing.T) {
		out, took, err := runTutorial(t, script, fake, nil)
		if err != nil {
			t.Fatalf("the tutorial failed after %s: %v\n%s", took, err, out)
		}
		t.Logf("the tutorial ran in %s", took)
		// §7 creates its approver before it asks: no alert the page does not explain.
		if strings.Contains(out, "undecidable") {
			t.Errorf("the tutorial's approval was undecidable when requested:\n%s", out)
		}
		for _, want := range []string{`{"claimed":false,"state":"processing"}`, `{"created":true,"state":"pending"}`, "ticket-2: completed", "is now completed", "actions_disabled"} {
			if !strings.Contains(out, want) {
				t.Errorf("the tutorial's output lacks %q:\n%s", want, out)
			}
		}
	})

	t.Run("something already on its port", func(t *testing.T) {
		// The README's quick start: ./airlock serve on the default address, left running.
		out, took, err := runTutorial(t, script, fake, func(listen string) {
			qs := exec.Command(binary, "serve")
			qs.Dir = t.TempDir()
			qs.Env = append(os.Environ(), "AIRLOCK_LISTEN="+listen, "AIRLOCK_DATABASE_URL="+filepath.Join(qs.Dir, "airlock.db"))
			if err := qs.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = qs.Process.Kill(); _ = qs.Wait() })
			for i := 0; ; i++ {
				if r, err := http.Get("http://" + listen + "/readyz"); err == nil {
					r.Body.Close()
					break
				}
				if i == 300 {
					t.Fatal("the quick start's airlock did not start")
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
		if err == nil || !strings.Contains(out, "something already listens on 127.0.0.1:") || took > 20*time.Second {
			t.Fatalf("with an airlock already on the port the tutorial ended after %s (%v); want it to stop at once naming the port:\n%s", took, err, out)
		}
	})

	t.Run("pasted past the guard onto a taken port", func(t *testing.T) {
		// Without the guard (a page pasted whole runs on after it), §5's wait must not
		// take another airlock's answers for its own serve's: that serve cannot bind, and
		// the wait stops with its error, which says why.
		listen := ""
		out, took, err := runTutorial(t, strings.Join(blocks[1:], "\n"), fake, func(addr string) {
			listen = addr
			taken, err := net.Listen("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { taken.Close() })
			go func() { _ = http.Serve(taken, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})) }()
		})
		if err == nil || !strings.Contains(out, "airlock serve exited") || !strings.Contains(out, "cannot listen on "+listen) ||
			!strings.Contains(out, "already in use") || took > 20*time.Second {
			t.Fatalf("with the port answering 200 to anything the tutorial ended after %s (%v); want §5 to stop with serve's error:\n%s", took, err, out)
		}
	})

	t.Run("its server cannot start", func(t *testing.T) {
		// serve cannot bind (an address of another host), so the readiness loop must stop
		// with airlock's own error instead of spinning.
		out, took, err := runTutorial(t, script, fake, func(string) {}, "AIRLOCK_LISTEN=192.0.2.1:8080")
		if err == nil || !strings.Contains(out, "airlock serve exited") || !strings.Contains(out, "192.0.2.1") || took > 20*time.Second {
			t.Fatalf("with a serve that cannot start the tutorial ended after %s (%v); want it to stop at once with airlock.log's end:\n%s", took, err, out)
		}
	})
}

// runTutorial runs script in a fresh directory with ./airlock and ./fakeprovider, its
// addresses made free ones; before, when not nil, is called with airlock's address
// first. env overrides the tutorial's environment.
func runTutorial(t *testing.T, script, fake string, before func(listen string), env ...string) (string, time.Duration, error) {
	t.Helper()
	dir := t.TempDir()
	if err := os.Symlink(binary, filepath.Join(dir, "airlock")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(fake, filepath.Join(dir, "fakeprovider")); err != nil {
		t.Fatal(err)
	}
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	script = strings.ReplaceAll(script, "127.0.0.1:8080", listen)
	script = strings.ReplaceAll(script, "127.0.0.1:9090", fmt.Sprintf("127.0.0.1:%d", freePort(t)))
	if before != nil {
		before(listen)
	}
	// The last block stops the background jobs; wait for them so the test leaves nothing running.
	script = "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + script + "\nwait\n"
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AIRLOCK_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "AIRLOCK_LISTEN="+listen) // the tutorial's serve uses the default, 127.0.0.1:8080
	cmd.Env = append(cmd.Env, env...)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(start).Round(time.Millisecond)
	if err != nil {
		logs, _ := os.ReadFile(filepath.Join(dir, "airlock.log"))
		out = append(out, "\nairlock.log:\n"...)
		out = append(out, logs...)
	}
	return string(out), took, err
}
