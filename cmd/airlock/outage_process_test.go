package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/store/storetest"
)

// pgCluster is a PostgreSQL server of one test's own, which the test stops and starts:
// the shared test server cannot go down under the other tests. It uses the server
// binaries scripts/with-postgres.sh uses, as the postgres user when the test runs as root
// (initdb refuses root).
type pgCluster struct {
	t      *testing.T
	bindir string
	dir    string
	port   int
	asUser *user.User // nil: run the binaries as ourselves
	opts   string     // more server options for start (-c name=value …)
}

func pgBindir() string {
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		d := strings.TrimSpace(string(out))
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { // version order: 9 < 10 < 15
		a, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		b, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return a < b
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			return dirs[i]
		}
	}
	return ""
}

// newPGCluster creates and starts a cluster; it is stopped and removed when t ends.
func newPGCluster(t *testing.T) *pgCluster {
	t.Helper()
	c := newPGClusterDir(t)
	c.run("initdb", "-D", c.data(), "--auth=trust", "-U", "postgres", "-E", "UTF8", "--no-locale", "--no-sync")
	c.start()
	return c
}

// newPGClusterDir prepares a cluster's directory and port, with nothing in it yet (a
// standby's comes from pg_basebackup); whatever runs there is stopped when t ends.
func newPGClusterDir(t *testing.T) *pgCluster {
	t.Helper()
	storetest.PostgresURL(t) // PostgreSQL tests run (under CI they must)
	c := &pgCluster{t: t, bindir: pgBindir()}
	if c.bindir == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("no PostgreSQL server binaries (initdb): under CI this test must run")
		}
		t.Skip("no PostgreSQL server binaries (initdb) for a cluster of the test's own")
	}
	dir, err := os.MkdirTemp("", "airlock-pg-outage-")
	if err != nil {
		t.Fatal(err)
	}
	c.dir = dir
	t.Cleanup(func() { os.RemoveAll(dir) })
	if os.Geteuid() == 0 {
		if c.asUser, err = user.Lookup("postgres"); err != nil {
			t.Fatalf("running as root, but no postgres user to run the server as: %v", err)
		}
		uid, _ := strconv.Atoi(c.asUser.Uid)
		gid, _ := strconv.Atoi(c.asUser.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c.port = ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	t.Cleanup(func() {
		if _, err := os.Stat(filepath.Join(c.data(), "postmaster.pid")); err == nil {
			c.run("pg_ctl", "-D", c.data(), "-m", "immediate", "-w", "-t", "30", "stop")
		}
	})
	return c
}

func (c *pgCluster) data() string { return filepath.Join(c.dir, "data") }

func (c *pgCluster) run(bin string, args ...string) {
	c.t.Helper()
	path := filepath.Join(c.bindir, bin)
	cmd := exec.Command(path, args...)
	if c.asUser != nil {
		cmd = exec.Command("runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	}
	cmd.Dir = c.dir
	if out, err := cmd.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(c.dir, "server.log"))
		c.t.Fatalf("%s %s: %v\n%s\nserver log:\n%s", bin, strings.Join(args, " "), err, out, log)
	}
}

// start starts the server and waits until it accepts connections.
func (c *pgCluster) start() {
	c.t.Helper()
	// fsync off: the test is about availability, and the disk is shared.
	c.run("pg_ctl", "-D", c.data(), "-l", filepath.Join(c.dir, "server.log"), "-w", "-t", "60",
		"-o", fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -k %s -c fsync=off -c max_connections=100 %s", c.port, c.dir, c.opts), "start")
}

// stop shuts the server down: fast (sessions are ended with 57P01) or immediate (a crash;
// the next start recovers, and answers 57P03 until it has).
func (c *pgCluster) stop(mode string) {
	c.t.Helper()
	c.run("pg_ctl", "-D", c.data(), "-m", mode, "-w", "-t", "60", "stop")
}

func (c *pgCluster) url() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// answer is one response seen by a client during the test.
type answer struct {
	at         time.Time
	status     int // 0: no answer at all
	code       string
	retryAfter string
	body       string
}

// During a PostgreSQL restart clients used to get a bare 500 internal. Now, with
// PostgreSQL stopped while clients write: every failed write answers 503
// store_unavailable with Retry-After and none 500; /readyz says 503 while it is down and
// 200 after; /healthz stays 200; and each client, retrying with the same
// Idempotency-Key, finishes every run exactly once.
func TestPostgresRestartIsAnOutage(t *testing.T) {
	pg := newPGCluster(t)
	env := []string{"AIRLOCK_DATABASE_URL=" + pg.url()}
	apiKey := setupDB(t, env)
	srv := startServe(t, env)
	hc := &http.Client{Timeout: 30 * time.Second}

	call := func(method, path, idem, body string) answer {
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		if idem != "" {
			req.Header.Set("Authorization", "Bearer "+apiKey)
			req.Header.Set("Idempotency-Key", idem)
		}
		resp, err := hc.Do(req)
		a := answer{at: time.Now()}
		if err != nil {
			a.body = err.Error()
			return a
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var e struct{ Error string }
		_ = json.Unmarshal(raw, &e)
		a.status, a.code, a.retryAfter, a.body = resp.StatusCode, e.Error, resp.Header.Get("Retry-After"), string(raw)
		return a
	}

	for _, mode := range []string{"fast", "immediate"} {
		t.Run(mode, func(t *testing.T) {
			var mu sync.Mutex
			var writes, ready, health []answer
			var keys []string
			var stop atomic.Bool
			var wg sync.WaitGroup
			// until sends one write until it is answered with anything but an outage,
			// waiting Retry-After between tries (the same Idempotency-Key each time).
			until := func(path, idem, body string) answer {
				for deadline := time.Now().Add(60 * time.Second); ; {
					a := call("POST", path, idem, body)
					mu.Lock()
					writes = append(writes, a)
					mu.Unlock()
					if a.status != 503 || time.Now().After(deadline) {
						return a
					}
					s, _ := strconv.Atoi(a.retryAfter)
					time.Sleep(time.Duration(max(s, 1)) * time.Second / 4) // a quarter: more tries in the window
				}
			}
			for w := range 6 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for n := 0; !stop.Load(); n++ {
						key := fmt.Sprintf("%s-%d-%d", mode, w, n)
						mu.Lock()
						keys = append(keys, key)
						mu.Unlock()
						c := until("/v1/runs/claim", "c-"+key, `{"key":"`+key+`","payload":{"w":`+strconv.Itoa(w)+`}}`)
						var cl struct {
							Owner   string `json:"lease_owner"`
							Version int64  `json:"version"`
						}
						if c.status != 201 || json.Unmarshal([]byte(c.body), &cl) != nil {
							t.Errorf("claim %s: %d %s", key, c.status, c.body)
							return
						}
						tr := until("/v1/runs/"+key+"/transition", "t-"+key,
							fmt.Sprintf(`{"lease_owner":%q,"version":%d,"to":"completed","result":{"n":%d}}`, cl.Owner, cl.Version, n))
						if tr.status != 200 {
							t.Errorf("transition %s: %d %s", key, tr.status, tr.body)
							return
						}
					}
				}()
			}
			probeDone := make(chan struct{})
			go func() {
				defer close(probeDone)
				for !stop.Load() {
					r, h := call("GET", "/readyz", "", ""), call("GET", "/healthz", "", "")
					mu.Lock()
					ready, health = append(ready, r), append(health, h)
					mu.Unlock()
					time.Sleep(100 * time.Millisecond)
				}
			}()

			time.Sleep(1500 * time.Millisecond)
			stopAt := time.Now()
			pg.stop(mode)
			downAt := time.Now()
			time.Sleep(3 * time.Second)
			startAt := time.Now()
			pg.start()
			upAt := time.Now()
			// Until readiness is back, then a little more traffic.
			var readyAgain time.Time
			for deadline := time.Now().Add(30 * time.Second); readyAgain.IsZero() && time.Now().Before(deadline); {
				mu.Lock()
				if n := len(ready); n > 0 && ready[n-1].status == 200 && ready[n-1].at.After(upAt) {
					readyAgain = ready[n-1].at
				}
				mu.Unlock()
				time.Sleep(50 * time.Millisecond)
			}
			if readyAgain.IsZero() {
				t.Error("/readyz did not answer 200 within 30 s of PostgreSQL starting again")
			}
			time.Sleep(1500 * time.Millisecond)
			stop.Store(true)
			wg.Wait()
			<-probeDone

			byStatus := func(as []answer, from, to time.Time) map[string]int {
				out := map[string]int{}
				for _, a := range as {
					if (from.IsZero() || !a.at.Before(from)) && (to.IsZero() || a.at.Before(to)) {
						k := strconv.Itoa(a.status)
						if a.code != "" {
							k += " " + a.code
						}
						out[k]++
					}
				}
				return out
			}
			outageEnd := readyAgain
			if outageEnd.IsZero() {
				outageEnd = time.Now()
			}
			t.Logf("PostgreSQL stop -m %s took %s, down %s, start took %s; /readyz 200 again %s after start",
				mode, downAt.Sub(stopAt).Round(time.Millisecond), startAt.Sub(downAt).Round(time.Millisecond),
				upAt.Sub(startAt).Round(time.Millisecond), outageEnd.Sub(upAt).Round(time.Millisecond))
			t.Logf("writes, whole cycle (%d runs started): %v", len(keys), byStatus(writes, time.Time{}, time.Time{}))
			t.Logf("writes from the stop until /readyz is 200 again: %v", byStatus(writes, stopAt, outageEnd))
			t.Logf("/readyz: before %v, while down %v, starting %v, after %v", byStatus(ready, time.Time{}, stopAt),
				byStatus(ready, downAt, startAt), byStatus(ready, startAt, outageEnd), byStatus(ready, outageEnd, time.Time{}))
			t.Logf("/healthz: %v", byStatus(health, time.Time{}, time.Time{}))

			for _, a := range writes {
				switch {
				case a.status == 503:
					if s, err := strconv.Atoi(a.retryAfter); a.code != "store_unavailable" || err != nil || s < 1 || s > 10 {
						t.Errorf("an outage answer without its code or Retry-After (%q): %s", a.retryAfter, a.body)
					}
				case a.status != 200 && a.status != 201:
					t.Errorf("a write answered %d: %s", a.status, a.body)
				}
			}
			for _, a := range health {
				if a.status != 200 {
					t.Errorf("/healthz answered %d during the outage: %s", a.status, a.body)
				}
			}
			// While the server is down (the cached answer of a second ago aside), readiness
			// is 503 with its reason; before the stop and at the end it is 200.
			var down []answer
			for _, a := range ready {
				if a.at.After(downAt.Add(1100*time.Millisecond)) && a.at.Before(startAt) {
					down = append(down, a)
				}
			}
			if len(down) == 0 {
				t.Error("no /readyz probe while PostgreSQL was down")
			}
			for _, a := range down {
				if a.status != 503 || a.code != "store_unavailable" {
					t.Errorf("/readyz with PostgreSQL down: %d %s", a.status, a.body)
				}
			}
			if a := ready[len(ready)-1]; a.status != 200 {
				t.Errorf("/readyz at the end: %d %s", a.status, a.body)
			}
			// Every run the clients started ended once: retried writes were answered from
			// their Idempotency-Key's record or run once, never twice.
			for _, key := range keys {
				var run struct {
					State      string `json:"state"`
					Version    int64  `json:"version"`
					Duplicates int64  `json:"duplicates"`
					Reclaims   int64  `json:"reclaims"`
				}
				if _, err := apiJSON("GET", srv.URL+"/v1/runs/"+key, apiKey, "", &run); err != nil {
					t.Fatal(err)
				}
				if run.State != "completed" || run.Version != 2 || run.Duplicates != 0 || run.Reclaims != 0 {
					t.Errorf("run %s: %+v; want completed at version 2, no duplicate", key, run)
				}
			}
		})
		if t.Failed() {
			break
		}
	}
	if errs := srv.Errors(); strings.Contains(errs, `"status":500`) {
		t.Errorf("the server logged 500s:\n%s", errs)
	}
}
