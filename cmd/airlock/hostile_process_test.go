package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/airlockhq/airlock/internal/airlocktest"
	"github.com/airlockhq/airlock/internal/httpapi"
)

// hostileRSSBound is what a running serve may reach while it is sent the hostile
// corpus (docs/testing.md): the peak resident set, VmHWM, of the whole process. Before the
// decoder capped nesting, one 60 KB body took it past the machine's memory.
const hostileRSSBound = 256 << 20

// A running `airlock serve` is sent the nastiest bodies
// (airlocktest.HostileBodies: 60 KB, 100 KB and 1 MB of nesting, NUL, invalid UTF-8,
// huge numbers, duplicate keys, a 1 MB string) on every route that decodes a body, four
// at a time, on each store. Every answer is a 4xx, the process stays up and answers
// /healthz, and its peak RSS stays under hostileRSSBound.
func TestHostileBodiesKeepServeUp(t *testing.T) {
	for name, env := range databases(t) {
		t.Run(name, func(t *testing.T) {
			setupDB(t, env)
			admin, stderr, err := airlock(t, env, "apikey", "create", "--name", "hostile", "--scope", "admin")
			if err != nil {
				t.Fatalf("apikey create: %v\n%s", err, stderr)
			}
			admin = strings.TrimSpace(admin)
			// AIRLOCK_TEST_SERVE_BINARY runs the corpus against another build (e.g. one from
			// before the fix, wrapped in a ulimit, to watch it die).
			bin := binary
			if b := os.Getenv("AIRLOCK_TEST_SERVE_BINARY"); b != "" {
				bin = b
			}
			s := startServeBinary(t, bin, append(env, writePolicy(t, `{url: "http://127.0.0.1:1/"}`)))
			pid := s.cmd.Process.Pid

			type job struct {
				route, name string
				body        []byte
			}
			jobs := make(chan job)
			var mu sync.Mutex
			var failures []string
			sent := 0
			var wg sync.WaitGroup
			for range 4 {
				wg.Go(func() {
					for j := range jobs {
						path := wildcards.Replace(j.route)
						method, path, _ := strings.Cut(path, " ")
						req, _ := http.NewRequest(method, s.URL+path, bytes.NewReader(j.body))
						req.Header.Set("Content-Type", "application/json")
						req.Header.Set("Authorization", "Bearer "+admin)
						resp, err := client.Do(req)
						mu.Lock()
						sent++
						switch {
						case err != nil:
							failures = append(failures, fmt.Sprintf("%s with %s: %v", j.route, j.name, err))
						case resp.StatusCode < 400 || resp.StatusCode >= 500:
							b, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
							failures = append(failures, fmt.Sprintf("%s with %s: %d %s", j.route, j.name, resp.StatusCode, b))
						}
						mu.Unlock()
						if resp != nil {
							_, _ = io.Copy(io.Discard, resp.Body)
							resp.Body.Close()
						}
					}
				})
			}
			for _, hb := range airlocktest.HostileBodies() {
				for _, rt := range httpapi.Routes {
					if rt.Method != "GET" {
						jobs <- job{rt.Method + " " + rt.Pattern, hb.Name, hb.Body}
					}
				}
			}
			close(jobs)
			wg.Wait()
			for _, f := range failures {
				t.Error(f)
			}
			select {
			case <-s.done:
				logs := s.Logs()
				if i := strings.Index(logs, "fatal error:"); i >= 0 {
					logs = logs[i:min(len(logs), i+600)]
				}
				t.Fatalf("airlock serve exited: %v\n%s", s.err, tail(logs, 2000))
			default:
			}
			resp, err := client.Get(s.URL + "/healthz")
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("/healthz after the corpus: %v %v", resp, err)
			}
			resp.Body.Close()
			hwm := vmHWM(t, pid)
			t.Logf("%d hostile requests; peak RSS (VmHWM) %d MB, bound %d MB", sent, hwm>>20, hostileRSSBound>>20)
			if hwm > hostileRSSBound {
				t.Fatalf("peak RSS %d MB is over the bound of %d MB", hwm>>20, hostileRSSBound>>20)
			}
			if e := s.Errors(); e != "" {
				t.Errorf("the server logged errors:\n%s", tail(e, 2000))
			}
		})
	}
}

// wildcards fills a route's path values with ones that exist nowhere.
var wildcards = strings.NewReplacer("{key}", "hostile-1", "{id}", "00000000-0000-0000-0000-000000000000", "{effect_id}", "e-1")

// vmHWM reads a process's peak resident set size from /proc.
func vmHWM(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc/PID/status")
	return 0
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
