package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/store/storetest"
)

// binary is airlock built once for the tests that run it as separate processes.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "airlock-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "airlock")
	// The crash points (AIRLOCK_TEST_CRASH_AT) exist only in a build with this tag.
	build := exec.Command("go", "build", "-tags", "airlock_testhooks", "-o", binary, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build airlock:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// airlock runs the binary to completion with env added.
func airlock(t *testing.T, env []string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	return out.String(), errb.String(), err
}

// databases returns, per backend, the environment that points airlock at a fresh one.
func databases(t *testing.T) map[string][]string {
	dbs := map[string][]string{
		"sqlite": {"AIRLOCK_DATABASE_URL=" + filepath.Join(t.TempDir(), "airlock.db")},
	}
	if os.Getenv("AIRLOCK_TEST_DATABASE_URL") == "" && os.Getenv("CI") != "true" {
		t.Log("AIRLOCK_TEST_DATABASE_URL not set: PostgreSQL skipped (scripts/test.sh sets it)")
		return dbs
	}
	cfg := storetest.NewPostgresSchema(t)
	schema := cfg.ConnConfig.RuntimeParams["search_path"]
	url := storetest.PostgresURL(t)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	dbs["postgres"] = []string{"AIRLOCK_DATABASE_URL=" + url + sep + "search_path=" + schema}
	return dbs
}

// serveProcess starts `airlock serve` on a free port and returns its base URL.
func serveProcess(t *testing.T, env []string) string {
	t.Helper()
	base, _ := serveProcessStop(t, env)
	return base
}

// serveProcessStop is serveProcess that also returns a function stopping the process
// (SIGTERM, then waiting for its exit) before the test ends; the cleanup does it otherwise.
func serveProcessStop(t *testing.T, env []string) (string, func()) {
	t.Helper()
	cmd := exec.Command(binary, "serve")
	cmd.Env = append(os.Environ(), append(env, "AIRLOCK_LISTEN=127.0.0.1:0", "AIRLOCK_LOG_LEVEL=info")...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	var logs bytes.Buffer
	var logMu sync.Mutex
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var line struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "airlock serving" {
				addr <- line.Addr
			}
			logMu.Lock()
			logs.Write(append(sc.Bytes(), '\n'))
			logMu.Unlock()
		}
	}()
	var once sync.Once
	stop := func() { once.Do(func() { stopServe(t, cmd, &logs, &logMu) }) }
	t.Cleanup(stop)
	select {
	case a := <-addr:
		return "http://" + a, stop
	case <-time.After(60 * time.Second):
		logMu.Lock()
		defer logMu.Unlock()
		t.Fatalf("airlock serve did not start:\n%s", logs.String())
	}
	return "", stop
}

// stopServe sends SIGTERM and waits for a clean exit.
func stopServe(t *testing.T, cmd *exec.Cmd, logs *bytes.Buffer, logMu *sync.Mutex) {
	{
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				logMu.Lock()
				t.Errorf("airlock serve exited with %v after SIGTERM:\n%s", err, logs.String())
				logMu.Unlock()
			}
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			t.Error("airlock serve did not stop on SIGTERM")
		}
	}
}

type claimReply struct {
	status  int
	Claimed bool   `json:"claimed"`
	Owner   string `json:"lease_owner"`
	Error   string `json:"error"`
}

var client = &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

func postClaim(base, apiKey, key string) (claimReply, error) {
	req, _ := http.NewRequest("POST", base+"/v1/runs/claim", strings.NewReader(`{"key":"`+key+`","payload":{"k":"`+key+`"}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+apiKey)
	resp, err := client.Do(req)
	if err != nil {
		return claimReply{}, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var r claimReply
	if err := json.Unmarshal(b, &r); err != nil {
		return claimReply{}, fmt.Errorf("%s: %s", resp.Status, b)
	}
	r.status = resp.StatusCode
	if r.status != 201 && r.status != 200 {
		return r, fmt.Errorf("claim %s: %s: %s", key, resp.Status, b)
	}
	return r, nil
}

// TestSeparateProcessesRace runs three airlock processes on one database — a PostgreSQL
// schema, and a SQLite file — and races claims across them.
func TestSeparateProcessesRace(t *testing.T) {
	for name, env := range databases(t) {
		t.Run(name, func(t *testing.T) {
			if _, stderr, err := airlock(t, env, "migrate"); err != nil {
				t.Fatalf("migrate: %v\n%s", err, stderr)
			}
			key, stderr, err := airlock(t, env, "apikey", "create", "--name", "race", "--scope", "runs")
			if err != nil {
				t.Fatalf("apikey create: %v\n%s", err, stderr)
			}
			key = strings.TrimSpace(key)
			var servers []string
			for range 3 {
				servers = append(servers, serveProcess(t, env))
			}

			// 10 concurrent deliveries of one key, spread over the processes.
			var wg sync.WaitGroup
			var claimed, refused atomic.Int64
			start := make(chan struct{})
			for i := range 10 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					r, err := postClaim(servers[i%3], key, "hot-key")
					if err != nil {
						t.Error(err)
						return
					}
					if r.Claimed {
						claimed.Add(1)
					} else {
						refused.Add(1)
					}
				}()
			}
			close(start)
			wg.Wait()
			if claimed.Load() != 1 || refused.Load() != 9 {
				t.Fatalf("one key, 10 deliveries over 3 processes: %d claimed, %d refused; want 1 and 9", claimed.Load(), refused.Load())
			}

			// 500 keys × 10 deliveries, shuffled over 30 workers and 3 processes.
			const keys, deliveries, workers = 500, 10, 30
			jobs := make([]int, 0, keys*deliveries)
			for k := range keys {
				for range deliveries {
					jobs = append(jobs, k)
				}
			}
			rand.Shuffle(len(jobs), func(i, j int) { jobs[i], jobs[j] = jobs[j], jobs[i] })
			wins := make([]atomic.Int64, keys)
			var next atomic.Int64
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						n := next.Add(1) - 1
						if n >= int64(len(jobs)) {
							return
						}
						k := jobs[n]
						r, err := postClaim(servers[(w+int(n))%3], key, fmt.Sprintf("key-%d", k))
						if err != nil {
							t.Error(err)
							return
						}
						if r.Claimed {
							wins[k].Add(1)
						}
					}
				}()
			}
			wg.Wait()
			for k := range wins {
				if n := wins[k].Load(); n != 1 {
					t.Fatalf("key-%d: %d processes were told they own it; want exactly 1", k, n)
				}
			}
		})
	}
}

func TestCLI(t *testing.T) {
	env := []string{"AIRLOCK_DATABASE_URL=" + filepath.Join(t.TempDir(), "cli.db")}

	t.Run("help explains each command", func(t *testing.T) {
		out, _, err := airlock(t, env, "--help")
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"serve", "migrate", "apikey", "version", "bench", "AIRLOCK_DATABASE_URL", "AIRLOCK_LEASE_LIFETIME_MAX"} {
			if !strings.Contains(out, want) {
				t.Errorf("--help does not mention %s", want)
			}
		}
	})

	t.Run("bad option stops start-up naming it", func(t *testing.T) {
		for _, c := range []struct{ env, flag, want string }{
			{"AIRLOCK_LEASE_DEFAULT=soon", "", "AIRLOCK_LEASE_DEFAULT"},
			{"AIRLOCK_LISTEN=nowhere", "", "AIRLOCK_LISTEN"},
			{"", "--max-body-bytes=12", "AIRLOCK_MAX_BODY_BYTES (from --max-body-bytes)"},
			{"AIRLOCK_LEASE_MAX=10m", "--lease-default=20m", "AIRLOCK_LEASE_DEFAULT"},
			{"AIRLOCK_SQLITE_SYNCHRONOUS=off", "", "AIRLOCK_SQLITE_SYNCHRONOUS"},
		} {
			e := append([]string{}, env...)
			if c.env != "" {
				e = append(e, c.env)
			}
			args := []string{"serve"}
			if c.flag != "" {
				args = append(args, c.flag)
			}
			_, stderr, err := airlock(t, e, args...)
			if err == nil || !strings.Contains(stderr, c.want) {
				t.Errorf("%s %s: err=%v, stderr=%q; want it to name %s", c.env, c.flag, err, stderr, c.want)
			}
		}
	})

	t.Run("a bad policy file stops start-up naming the field", func(t *testing.T) {
		for _, c := range []struct{ doc, want string }{
			{"retry: {gremlins: {retry: transport, max_attempts: 2}}\n", "retry.gremlins: unknown failure class"},
			{"actions: {reply: {connector: worker, schema: {type: 5}}}\n", "actions.reply.schema"},
			{"actions: {note: {connector: http, http: {url: 'https://x/', token_env: AIRLOCK_TEST_NOPE}}}\n", "actions.note.http.token_env"},
		} {
			f := filepath.Join(t.TempDir(), "airlock.yaml")
			if err := os.WriteFile(f, []byte(c.doc), 0o600); err != nil {
				t.Fatal(err)
			}
			_, stderr, err := airlock(t, env, "serve", "--config", f, "--listen", "127.0.0.1:0")
			if err == nil || !strings.Contains(stderr, c.want) {
				t.Errorf("%q: err=%v stderr=%q; want %q", c.doc, err, stderr, c.want)
			}
		}
	})

	t.Run("a database password never reaches an error", func(t *testing.T) {
		_, stderr, err := airlock(t, nil, "migrate", "--database-url", "postgres://u:hunter2@127.0.0.1:1/db?connect_timeout=1")
		if err == nil || strings.Contains(stderr, "hunter2") {
			t.Fatalf("err=%v stderr=%q", err, stderr)
		}
	})

	t.Run("apikey create, list, revoke", func(t *testing.T) {
		raw, stderr, err := airlock(t, env, "apikey", "create", "--name", "n8n", "--scope", "runs,read")
		if err != nil {
			t.Fatalf("%v: %s", err, stderr)
		}
		raw = strings.TrimSpace(raw)
		if !strings.HasPrefix(raw, "alk_") || strings.Contains(stderr, raw) {
			t.Fatalf("created key %q, stderr %q", raw, stderr)
		}
		list, _, err := airlock(t, env, "apikey", "list")
		if err != nil || !strings.Contains(list, "n8n") || !strings.Contains(list, "runs,read") || strings.Contains(list, raw) {
			t.Fatalf("list (%v):\n%s", err, list)
		}
		id := strings.Fields(strings.Split(list, "\n")[1])[0]
		if _, stderr, err := airlock(t, env, "apikey", "revoke", id); err != nil {
			t.Fatalf("revoke: %v %s", err, stderr)
		}
		if _, stderr, err := airlock(t, env, "apikey", "revoke", id); err == nil || !strings.Contains(stderr, "no unrevoked API key") {
			t.Fatalf("second revoke: %v %s", err, stderr)
		}
		if _, stderr, err := airlock(t, env, "apikey", "create", "--name", "x", "--scope", "root"); err == nil || !strings.Contains(stderr, "unknown scope") {
			t.Fatalf("bad scope: %v %s", err, stderr)
		}
		// A key acting for a person, a worker key limited to types; types only on worker keys,
		// and an evaluator key that cannot also act.
		if _, stderr, err := airlock(t, env, "apikey", "create", "--name", "ana-assistant", "--scope", "runs", "--on-behalf-of", "ana"); err != nil {
			t.Fatalf("on-behalf-of: %v %s", err, stderr)
		}
		if _, stderr, err := airlock(t, env, "apikey", "create", "--name", "digest-bot", "--scope", "worker", "--types", "slack_digest,task"); err != nil {
			t.Fatalf("types: %v %s", err, stderr)
		}
		if _, stderr, err := airlock(t, env, "apikey", "create", "--name", "x", "--scope", "runs", "--types", "task"); err == nil || !strings.Contains(stderr, "worker") {
			t.Fatalf("types on a runs key: %v %s", err, stderr)
		}
		if _, stderr, err := airlock(t, env, "apikey", "create", "--name", "x", "--scope", "runs,evaluator"); err == nil || !strings.Contains(stderr, "evaluator") {
			t.Fatalf("runs and evaluator: %v %s", err, stderr)
		}
		list, _, _ = airlock(t, env, "apikey", "list")
		if !strings.Contains(list, "ana-assistant") || !regexp.MustCompile(`digest-bot\s+worker\s+-\s+slack_digest,task`).MatchString(list) ||
			!regexp.MustCompile(`ana-assistant\s+runs\s+ana\s+-`).MatchString(list) {
			t.Fatalf("list with on-behalf-of and types:\n%s", list)
		}
		// The database holds the hash, never the key.
		db, err := os.ReadFile(strings.TrimPrefix(env[0], "AIRLOCK_DATABASE_URL="))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(db, []byte(raw)) {
			t.Fatal("the raw API key is in the database file")
		}
	})

	t.Run("serve refuses an unmigrated database with --migrate=false", func(t *testing.T) {
		e := []string{"AIRLOCK_DATABASE_URL=" + filepath.Join(t.TempDir(), "fresh.db"), "AIRLOCK_LISTEN=127.0.0.1:0"}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, binary, "serve", "--migrate=false")
		cmd.Env = append(os.Environ(), e...)
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "airlock migrate") {
			t.Fatalf("err=%v out=%s", err, out)
		}
	})

	t.Run("purge --dry-run says what it would remove", func(t *testing.T) {
		out, stderr, err := airlock(t, env, "purge", "--dry-run")
		if err != nil || !strings.Contains(out, "WOULD REMOVE") || !strings.Contains(out, "effect_payloads") || !strings.Contains(out, "events") {
			t.Fatalf("%v %q %q", err, out, stderr)
		}
	})

	t.Run("version", func(t *testing.T) {
		out, _, err := airlock(t, env, "version")
		if err != nil || !strings.HasPrefix(out, "airlock ") {
			t.Fatalf("%v %q", err, out)
		}
	})
}
