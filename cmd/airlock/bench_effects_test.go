package main

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestBenchProviderCountsDuplicates(t *testing.T) {
	prov := newBenchProvider(0)
	srv := httptest.NewServer(prov)
	defer srv.Close()
	arrived := prov.await("run-b/e")
	send := func(key string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{}`))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("provider answered %s", resp.Status)
		}
	}
	before := time.Now()
	for _, k := range []string{"run-a/e", "run-b/e", "run-a/e", "", "run-a/e", "run-c/e"} {
		send(k)
	}
	st := prov.stats()
	if st.unique != 3 || st.total != 5 || st.duplicates != 2 || st.noKey != 1 {
		t.Fatalf("stats = %+v, want 3 keys, 5 keyed requests, 2 duplicates, 1 without a key", st)
	}
	if st.first.Before(before) || st.last.Before(st.first) {
		t.Fatalf("arrival times out of order: first %v last %v (sent after %v)", st.first, st.last, before)
	}
	select {
	case at := <-arrived:
		if at.Before(st.first) || at.After(st.last) {
			t.Fatalf("run-b/e arrived at %v, outside [%v, %v]", at, st.first, st.last)
		}
	default:
		t.Fatal("await did not report run-b/e's arrival")
	}
}

func TestPercentile(t *testing.T) {
	seq := func(n int) []time.Duration {
		d := make([]time.Duration, n)
		for i := range d {
			d[i] = time.Duration(i + 1)
		}
		return d
	}
	for _, c := range []struct {
		in   []time.Duration
		p    float64
		want time.Duration
	}{
		{nil, 50, 0},
		{seq(1), 50, 1},
		{seq(1), 99, 1},
		{seq(2), 50, 1},
		{seq(10), 50, 5},
		{seq(10), 99, 10},
		{seq(100), 50, 50},
		{seq(100), 99, 99},
		{seq(100), 100, 100},
		{seq(200), 99, 198},
		{seq(200), 0, 1},
	} {
		if got := percentile(c.in, c.p); got != c.want {
			t.Errorf("p%v of %d values = %d, want %d", c.p, len(c.in), got, c.want)
		}
	}
}

func TestParseEffectStates(t *testing.T) {
	text := `# HELP airlock_effects Effects by state, from the database.
# TYPE airlock_effects gauge
airlock_effects{state="completed"} 4999
airlock_effects{state="pending"} 1
airlock_effects_total{state="completed"} 7
airlock_kill_switch_enabled 1
`
	got, err := parseEffectStates(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["completed"] != 4999 || got["pending"] != 1 {
		t.Fatalf("states = %v", got)
	}
	if _, err := parseEffectStates(strings.NewReader(`airlock_effects{state="completed"} many` + "\n")); err == nil {
		t.Fatal("a value that is not a number was accepted")
	}
}

// freePort returns a loopback port that was free a moment ago (the policy must name the
// provider's address before the provider starts).
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// benchPolicy writes a policy whose action type `bench` posts to the provider on port.
func benchPolicy(t *testing.T, port int, dispatch string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "bench.yaml")
	doc := fmt.Sprintf("actions:\n  bench:\n    connector: http\n    gate: none\n    http: {url: \"http://127.0.0.1:%d/send\"}\ndispatch: %s\n", port, dispatch)
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// The command against real `airlock serve` processes on SQLite: a live run, the
// pre-filled run whose --then starts the dispatcher, idle latency, and a run that cannot
// finish and must say so within its timeout instead of hanging.
func TestBenchEffects(t *testing.T) {
	db := "AIRLOCK_DATABASE_URL=" + filepath.Join(t.TempDir(), "airlock.db")
	key := setupDB(t, []string{db})
	port := freePort(t)
	provider := "127.0.0.1:" + strconv.Itoa(port)
	live := benchPolicy(t, port, "{interval: 20ms, batch_size: 50}")
	held := benchPolicy(t, port, "{disabled: true}")
	bench := func(url string, args ...string) (string, error) {
		out, stderr, err := airlock(t, nil, append([]string{"bench", "effects", "--url", url, "--api-key", key,
			"--provider-listen", provider}, args...)...)
		return out + stderr, err
	}

	t.Run("throughput while queueing", func(t *testing.T) {
		srv := startServe(t, []string{db, "AIRLOCK_CONFIG=" + live})
		out, err := bench(srv.URL, "--count", "40", "--concurrency", "4", "--timeout", "30s")
		if err != nil || !strings.Contains(out, "all 40 completed") || !strings.Contains(out, "finished=true") ||
			!strings.Contains(out, "duplicates=0") || !strings.Contains(out, "from=first_queue_request") {
			t.Fatalf("bench effects: %v\n%s", err, out)
		}
	})

	t.Run("pre-filled queue, dispatcher started by --then", func(t *testing.T) {
		queue := startServe(t, []string{db, "AIRLOCK_CONFIG=" + held})
		pidFile := filepath.Join(t.TempDir(), "pid")
		then := fmt.Sprintf("AIRLOCK_LISTEN=127.0.0.1:0 AIRLOCK_CONFIG=%s %s %s serve >/dev/null 2>&1 & echo $! >%s",
			live, db, binary, pidFile)
		t.Cleanup(func() {
			if b, err := os.ReadFile(pidFile); err == nil {
				if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
					_ = syscall.Kill(pid, syscall.SIGTERM)
				}
			}
		})
		out, err := bench(queue.URL, "--count", "30", "--timeout", "30s", "--then", then)
		if err != nil || !strings.Contains(out, "all 30 completed") || !strings.Contains(out, "from=dispatch_start") ||
			!strings.Contains(out, "duplicates=0") {
			t.Fatalf("bench effects --then: %v\n%s", err, out)
		}
	})

	t.Run("latency", func(t *testing.T) {
		srv := startServe(t, []string{db, "AIRLOCK_CONFIG=" + live})
		out, err := bench(srv.URL, "--mode", "latency", "--count", "5", "--gap", "10ms", "--timeout", "10s")
		if err != nil || !strings.Contains(out, "result mode=latency count=5 p50_ms=") {
			t.Fatalf("bench effects --mode latency: %v\n%s", err, out)
		}
	})

	// Open loop: 20 arrivals per second for 1 s. A live server holds them (every claim
	// answered, every effect at the provider); with dispatch disabled the claims are still
	// held but no effect is, and each missing one counts at window + grace in the p99.
	t.Run("rate", func(t *testing.T) {
		srv := startServe(t, []string{db, "AIRLOCK_CONFIG=" + live})
		out, err := bench(srv.URL, "--mode", "rate", "--rate", "20", "--duration", "1s", "--grace", "5s")
		if err != nil || !strings.Contains(out, "result mode=rate workload=effects offered=20 seconds=1.0 arrivals=20 dropped=0 errors=0 claims=20 claims_rate=20.0") ||
			!strings.Contains(out, " effects=20 effects_rate=20.0 ") || !strings.Contains(out, "duplicates=0") || !strings.Contains(out, "cpu_machine_pct=") || !strings.Contains(out, "cpu_driver_pct=") {
			t.Fatalf("bench effects --mode rate: %v\n%s", err, out)
		}
		out, err = bench(srv.URL, "--mode", "rate", "--claims-only", "--rate", "20", "--duration", "1s")
		if err != nil || !strings.Contains(out, "workload=claims offered=20 seconds=1.0 arrivals=20 dropped=0 errors=0 claims=20 claims_rate=20.0") ||
			strings.Contains(out, "effects=") {
			t.Fatalf("bench effects --mode rate --claims-only: %v\n%s", err, out)
		}
	})
	t.Run("rate, nothing dispatching", func(t *testing.T) {
		held := startServe(t, []string{db, "AIRLOCK_CONFIG=" + held})
		out, err := bench(held.URL, "--mode", "rate", "--rate", "10", "--duration", "1s", "--grace", "500ms")
		if err != nil || !strings.Contains(out, "claims=10 claims_rate=10.0") || !strings.Contains(out, " effects=0 effects_rate=0.0 ") ||
			!strings.Contains(out, "send_p99_ms=1500.00") {
			t.Fatalf("bench effects --mode rate, nothing dispatching: %v\n%s", err, out)
		}
	})

	t.Run("no dispatcher: reports and fails within the timeout", func(t *testing.T) {
		srv := startServe(t, []string{db, "AIRLOCK_CONFIG=" + held})
		start := time.Now()
		out, err := bench(srv.URL, "--count", "5", "--timeout", "1s")
		if err == nil || !strings.Contains(out, "did not finish in 1s: 0 of 5 completed") || !strings.Contains(out, "finished=false") {
			t.Fatalf("bench effects without a dispatcher: %v\n%s", err, out)
		}
		if took := time.Since(start); took > 15*time.Second {
			t.Fatalf("took %s to give up after a 1s timeout", took)
		}
	})
}
