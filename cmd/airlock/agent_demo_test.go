package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestTutorialAgentsDemo runs docs/agents.md's example (examples/agent/demo.sh) as the
// tutorial's test runs the tutorial (issue 24, 10): with built binaries, on a free port,
// to the end; and interrupted, it must stop its airlock serve. Neither run writes into
// the repository's docs/.
func TestTutorialAgentsDemo(t *testing.T) {
	for _, tool := range []string{"bash", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("the demo needs %s", tool)
		}
	}
	agent := filepath.Join(t.TempDir(), "agent")
	if out, err := exec.Command("go", "build", "-o", agent, "../../examples/agent").CombinedOutput(); err != nil {
		t.Fatalf("build the agent: %v\n%s", err, out)
	}
	docsBefore := listDir(t, "../../docs")
	demo := func(ctx context.Context) *exec.Cmd {
		cmd := exec.CommandContext(ctx, "bash", "../../examples/agent/demo.sh")
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "AIRLOCK_") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		cmd.Env = append(cmd.Env, "AIRLOCK_BIN="+binary, "AGENT_BIN="+agent, fmt.Sprintf("AIRLOCK_LISTEN=127.0.0.1:%d", freePort(t)), "TMPDIR="+t.TempDir())
		return cmd
	}

	t.Run("to the end", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		out, err := demo(ctx).CombinedOutput()
		if err != nil {
			t.Fatalf("demo.sh: %v\n%s", err, out)
		}
		for _, want := range []string{"report-2026w48: 3 record(s), \"state\":\"completed\"", "report-2026w49: 3 record(s), \"state\":\"completed\"", "\"msg\":\"reconciled\"", "stopped airlock serve"} {
			if !strings.Contains(string(out), want) {
				t.Errorf("demo.sh's output lacks %q:\n%s", want, out)
			}
		}
		assertServerGone(t, string(out))
	})

	t.Run("interrupted, it stops its server", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		cmd := demo(ctx)
		var out bytes.Buffer
		pr, pw, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = pw, pw
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		pw.Close()
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			out.WriteString(sc.Text() + "\n")
			if strings.Contains(sc.Text(), "report-2026w48: claims") { // the server is up
				break
			}
		}
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		for sc.Scan() {
			out.WriteString(sc.Text() + "\n")
		}
		err = cmd.Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 143 {
			t.Errorf("demo.sh after SIGTERM: %v (want exit 143)\n%s", err, out.String())
		}
		if !strings.Contains(out.String(), "stopped airlock serve") {
			t.Errorf("demo.sh did not say it stopped its server:\n%s", out.String())
		}
		assertServerGone(t, out.String())
	})

	if after := listDir(t, "../../docs"); after != docsBefore {
		t.Errorf("the demo wrote into the repository's docs/:\nbefore %s\nafter  %s", docsBefore, after)
	}
}

// assertServerGone checks that the airlock serve the demo named (pid N) has exited.
func assertServerGone(t *testing.T, out string) {
	t.Helper()
	m := regexp.MustCompile(`airlock serve \(pid (\d+)\)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("demo.sh did not name its server's pid:\n%s", out)
	}
	pid, _ := strconv.Atoi(m[1])
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("airlock serve (pid %d) still runs after the demo ended (kill -0: %v)", pid, err)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

func listDir(t *testing.T, dir string) string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return strings.Join(names, " ")
}
