package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/postgres"
	"github.com/airlockhq/airlock/internal/store/sqlite"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// openEnvStore opens, in this process, the database env points a binary at.
func openEnvStore(t *testing.T, env []string) store.Store {
	t.Helper()
	url := strings.TrimPrefix(env[0], "AIRLOCK_DATABASE_URL=")
	var st store.Store
	var err error
	if strings.HasPrefix(url, "postgres") {
		st, err = postgres.Open(context.Background(), url)
	} else {
		st, err = sqlite.Open(context.Background(), url, sqlite.Options{})
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// TestWriterLevelProcess: a serve at level L registers; a later release's migration to
// L+1 is refused while it is live, naming it; forced, the serve learns the level from its
// heartbeat and refuses writes with 503 writer_level_behind over HTTP (reads and liveness
// go on), its readiness fails, and a CLI purge of the same binary refuses; once the
// serve has stopped (deregistered), the next raise needs no --force.
func TestWriterLevelProcess(t *testing.T) {
	for name, env := range databases(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if _, stderr, err := airlock(t, env, "migrate"); err != nil {
				t.Fatalf("migrate: %v\n%s", err, stderr)
			}
			out, stderr, err := airlock(t, env, "apikey", "create", "--name", "levels", "--scope", "runs")
			if err != nil {
				t.Fatalf("apikey create: %v\n%s", err, stderr)
			}
			key := strings.TrimSpace(out)
			base, stop := serveProcessStop(t, env)
			if _, err := postClaim(base, key, "before-raise"); err != nil {
				t.Fatal(err)
			}
			st := openEnvStore(t, env)

			_, err = storetest.ApplyLater(t, st, store.WriterLevel+1, store.MigrateParams{})
			var lw *store.LowerWriters
			if !errors.As(err, &lw) || len(lw.Instances) != 1 || lw.Instances[0].Role != "serve" || !strings.Contains(err.Error(), "(serve, pid ") {
				t.Fatalf("a raise with the serve live: %v; want it refused naming the serve", err)
			}
			if _, err := storetest.ApplyLater(t, st, store.WriterLevel+1, store.MigrateParams{Force: true}); err != nil {
				t.Fatalf("forced raise: %v", err)
			}

			// The serve learns the level within a heartbeat.
			deadline := time.Now().Add(3 * store.InstanceHeartbeat)
			var r claimReply
			for {
				r, err = postClaim(base, key, "after-raise")
				if r.status == http.StatusServiceUnavailable || time.Now().After(deadline) {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			if r.status != http.StatusServiceUnavailable || r.Error != "writer_level_behind" {
				t.Fatalf("claim after the raise: %d %q (%v); want 503 writer_level_behind", r.status, r.Error, err)
			}
			for path, want := range map[string]string{"/readyz": "writer_level_behind", "/healthz": ""} {
				resp, err := http.Get(base + path)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if want == "" && resp.StatusCode != http.StatusOK || want != "" && (resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), want)) {
					t.Fatalf("GET %s: %d %s; want %q", path, resp.StatusCode, b, want)
				}
			}
			_, stderr, err = airlock(t, env, "purge")
			if err == nil || !strings.Contains(stderr, "refusing to write") || !strings.Contains(stderr, fmt.Sprintf("requires %d", store.WriterLevel+1)) {
				t.Fatalf("purge on a database above its level: %v\n%s", err, stderr)
			}

			stop()
			ins, err := st.InstanceList(context.Background(), time.Time{})
			if err != nil || len(ins) != 0 {
				t.Fatalf("after SIGTERM the serve is still registered: %+v, %v", ins, err)
			}
			if _, err := storetest.ApplyLater(t, st, store.WriterLevel+2, store.MigrateParams{}); err != nil {
				t.Fatalf("a raise with no live lower writer: %v", err)
			}
		})
	}
}
