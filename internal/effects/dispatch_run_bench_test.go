package effects_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/connector"
	"github.com/airlockhq/airlock/internal/connector/httpconn"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/metrics"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// BenchmarkDispatchRun is the outbox drain as `airlock serve` runs it: one
// effects.Dispatcher in Run (its loop, its lease batches, a goroutine budget of
// dispatch.concurrency sends) with the http connector as serve builds it (its own
// transport) and the dispatch histogram app.New observes, draining b.N due effects
// queued before the timer. The provider is a no-op HTTP server in a process of its own
// (this test binary re-run as TestNoopProviderProcess), so what this process spends — CPU
// (cpu-µs/effect, user+sys) and allocations (allocs/op = per effect) — is the
// dispatcher's alone: on SQLite with the database, on PostgreSQL without it
// (scripts/bench-cpu.sh measures the cluster); effects/lease is how many effects one
// lease statement took on average. -cpuprofile profiles the drain.
//
//	scripts/with-postgres.sh go test -run '^$' -bench DispatchRun -benchtime 3000x ./internal/effects/
func BenchmarkDispatchRun(b *testing.B) {
	storetest.EachB(b, func(b *testing.B, be storetest.Backend) {
		for _, c := range []int{32, 256} {
			b.Run(fmt.Sprintf("c%d", c), func(b *testing.B) { dispatchRun(b, be, c) })
		}
	})
}

func dispatchRun(b *testing.B, be storetest.Backend, concurrency int) {
	p := startProviderProcess(b)
	e := &dispatchEnv{Env: apptest.NewEnv(b, be, true)}
	// scripts/bench-cpu.sh's policy: one action type, the instance's concurrency.
	pol, err := policy.Parse(fmt.Appendf(nil, `
actions:
  note:
    connector: http
    gate: none
    http: {url: "http://%s/send", timeout: 10s}
dispatch:
  concurrency: %d
`, p.addr, concurrency), func(string) (string, bool) { return "", false })
	if err != nil {
		b.Fatal(err)
	}
	h := pol.Action("note").Section.(*httpconn.Section)
	c, err := httpconn.New(httpconn.Config{Targets: h.Targets, Idempotent: h.Idempotent, Timeout: h.Timeout.D(),
		LookupURL: h.LookupURL, LookupAuthoritative: h.LookupAuthoritative, IDField: h.IDField})
	if err != nil {
		b.Fatal(err)
	}
	m := metrics.New()
	var done, leases atomic.Int64
	all := make(chan struct{})
	e.effects = e.newService(b, pol, c, func(outcome string, d time.Duration) {
		m.Dispatch.WithLabelValues(outcome).Observe(d.Seconds())
		if outcome != connector.Sent.String() {
			e.notSent.Add(1)
		}
		if done.Add(1) == int64(b.N) {
			close(all)
		}
	})
	e.effects.Hook = func(point string) {
		if point == "leased" {
			leases.Add(1)
		}
	}
	e.seed(b, b.N)
	d := &effects.Dispatcher{Service: e.effects, BatchSize: pol.Dispatch.BatchSize, Concurrency: pol.Dispatch.Concurrency,
		Lease: pol.Dispatch.Lease.D(), Interval: pol.Dispatch.Interval.D(), Drain: time.Minute}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	b.ReportAllocs()
	runtime.GC()
	b.ResetTimer()
	cpu0 := selfCPU(b)
	wg.Go(func() { d.Run(ctx) })
	select {
	case <-all:
	case <-time.After(dispatchTimeout):
		b.Error("the drain did not finish")
	}
	// Every send has been observed; Run's drain waits for their outcomes.
	cancel()
	wg.Wait()
	cpu := selfCPU(b) - cpu0
	b.StopTimer()
	if n := e.notSent.Load(); n > 0 {
		b.Fatalf("%d sends were not sent", n)
	}
	counts, err := e.Store.EffectCountByState(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	if counts[store.EffectCompleted] != b.N || len(counts) != 1 {
		b.Fatalf("effects by state after dispatch: %v, want %d completed", counts, b.N)
	}
	reqs, dups := p.counts(b)
	if reqs != b.N || dups != 0 {
		b.Fatalf("provider got %d requests (%d keys twice), want %d once each", reqs, dups, b.N)
	}
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/effect")
	b.ReportMetric(float64(b.N)/float64(leases.Load()), "effects/lease")
}

// providerProcess is TestNoopProviderProcess running in a child process.
type providerProcess struct {
	addr string
}

// startProviderProcess starts this test binary as a no-op provider and returns its
// address; it is stopped (stdin closed) at cleanup.
func startProviderProcess(b *testing.B) *providerProcess {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestNoopProviderProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), "AIRLOCK_NOOP_PROVIDER=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = stdin.Close(); _ = cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "listening ") {
		b.Fatalf("provider process: %q, %v", line, err)
	}
	return &providerProcess{addr: strings.TrimSpace(strings.TrimPrefix(line, "listening "))}
}

// counts asks the provider how many POSTs it took and how many repeated a key.
func (p *providerProcess) counts(b *testing.B) (requests, duplicates int) {
	b.Helper()
	resp, err := http.Get("http://" + p.addr + "/counts")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := fmt.Fscanf(resp.Body, "%d %d", &requests, &duplicates); err != nil {
		b.Fatal(err)
	}
	return requests, duplicates
}

// TestNoopProviderProcess is BenchmarkDispatchRun's provider when run with
// AIRLOCK_NOOP_PROVIDER=1 (otherwise it skips): it answers every POST with 200
// {"id":"x"}, counts them and the Idempotency-Keys seen twice (GET /counts), and exits
// when its stdin closes.
func TestNoopProviderProcess(t *testing.T) {
	if os.Getenv("AIRLOCK_NOOP_PROVIDER") != "1" {
		t.Skip("BenchmarkDispatchRun's provider process")
	}
	var mu sync.Mutex
	seen := map[string]bool{}
	requests, dups := 0, 0
	mux := http.NewServeMux()
	mux.HandleFunc("POST /", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		k := r.Header.Get("Idempotency-Key")
		mu.Lock()
		requests++
		if seen[k] {
			dups++
		}
		seen[k] = true
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x"}`)
	})
	mux.HandleFunc("GET /counts", func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(w, "%d %d\n", requests, dups)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	fmt.Printf("listening %s\n", ln.Addr())
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = srv.Close()
}
