package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/sqlite"
)

// serve started while PostgreSQL is down or restarting waits for it (an outage error),
// but returns any other error at once, and gives up after its wait.
func TestWaitForStore(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	real, err := sqlite.Open(ctx, t.TempDir()+"/a.db", sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer real.Close()
	down := fmt.Errorf("connect to postgres: %w", store.ErrUnavailable)

	tries := 0
	st, err := waitForStore(ctx, log, time.Minute, func() (store.Store, error) {
		if tries++; tries < 3 {
			return nil, down
		}
		return real, nil
	})
	if err != nil || st != real || tries != 3 {
		t.Fatalf("after two refusals: %v, %d tries", err, tries)
	}

	tries = 0
	bad := errors.New("password authentication failed")
	if _, err := waitForStore(ctx, log, time.Minute, func() (store.Store, error) { tries++; return nil, bad }); !errors.Is(err, bad) || tries != 1 {
		t.Fatalf("a refusal that is no outage: %v after %d tries", err, tries)
	}

	tries = 0
	start := time.Now()
	if _, err := waitForStore(ctx, log, 500*time.Millisecond, func() (store.Store, error) { tries++; return nil, down }); !errors.Is(err, store.ErrUnavailable) || tries < 2 {
		t.Fatalf("a database that stays down: %v after %d tries", err, tries)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("waited %s past a 500 ms wait", took)
	}
}

// A newcomer's two first failures — the port is taken (the quick start's server still
// runs), the policy file is not where the command looks — say why and what to do, and
// serve exits at once (issue 35, 10).
func TestStartupErrorsSayWhyAndWhatToDo(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	dir := t.TempDir()
	env := []string{"AIRLOCK_DATABASE_URL=" + filepath.Join(dir, "a.db")}
	for _, c := range []struct {
		name string
		args []string
		env  []string
		want []string
	}{
		{"port in use", []string{"serve"}, []string{"AIRLOCK_LISTEN=" + taken.Addr().String()},
			[]string{"cannot listen on " + taken.Addr().String(), "already in use", "another airlock serve", "--listen 127.0.0.1:8081"}},
		{"port needs privileges", []string{"serve", "--listen", "127.0.0.1:1"}, nil,
			[]string{"cannot listen on 127.0.0.1:1", "ports below 1024"}},
		{"policy file missing", []string{"serve", "--config", "airlock.yaml"}, nil,
			[]string{`"airlock.yaml": no such file: ` + filepath.Join(dir, "airlock.yaml") + " (relative to the working directory)", "docs/policy.md", "leave the setting out"}},
		{"policy file missing, an operator command", []string{"effects", "list"}, []string{"AIRLOCK_CONFIG=/nonexistent/airlock.yaml"},
			[]string{"invalid AIRLOCK_CONFIG (from AIRLOCK_CONFIG)", "no such file: /nonexistent/airlock.yaml.", "docs/policy.md"}},
		{"policy file is a directory", []string{"serve", "--config", dir}, nil,
			[]string{"is a directory, not a policy file"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "port needs privileges" && os.Geteuid() == 0 {
				t.Skip("root may listen on any port")
			}
			start := time.Now()
			_, stderr, err := airlockIn(t, dir, append(slices.Clone(env), c.env...), c.args...)
			if err == nil {
				t.Fatalf("%v: exit 0", c.args)
			}
			for _, w := range c.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("%v: stderr lacks %q:\n%s", c.args, w, stderr)
				}
			}
			if took := time.Since(start); took > 20*time.Second {
				t.Errorf("%v: exited after %s", c.args, took)
			}
		})
	}
}
