package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
)

func benchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Load a running airlock through its HTTP API",
	}
	var url, key string
	var concurrency int
	var duration time.Duration
	var dupEvery int
	var baseline bool
	var cpuPG, cpuPid int
	claims := &cobra.Command{
		Use:   "claims",
		Short: "Claim keys as fast as possible and print throughput and p50/p99 latency",
		Long: `claims sends POST /v1/runs/claim from --concurrency workers for --duration and prints
throughput and latency percentiles. Every --duplicate-every-th request repeats a key
already claimed (a duplicate delivery). First it measures GET /healthz the same way:
that baseline is the cost of HTTP itself, so the ratio is what a claim adds
(--baseline=false skips it).

--cpu-pg-pid PID and --cpu-pid PID (Linux) measure the CPU of the claims phase: the
PostgreSQL cluster's (that postmaster, its live and reaped children, from /proc) and the
airlock serve process's user+sys time, per claim.

The API key comes from --api-key or AIRLOCK_API_KEY and needs the runs scope.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if key == "" {
				key = os.Getenv("AIRLOCK_API_KEY")
			}
			if key == "" {
				return errors.New("--api-key (or AIRLOCK_API_KEY) is required")
			}
			if concurrency < 1 || duration <= 0 {
				return errors.New("--concurrency must be ≥ 1 and --duration > 0")
			}
			b := bencher{url: strings.TrimRight(url, "/"), key: key, client: &http.Client{
				Timeout:   30 * time.Second,
				Transport: &http.Transport{MaxIdleConnsPerHost: concurrency, MaxConnsPerHost: concurrency},
			}}
			out := cmd.OutOrStdout()
			var base benchResult
			if baseline {
				base = b.run(cmd.Context(), concurrency, duration, func(int, int) (int, error) { return b.get("/healthz") })
				fmt.Fprintf(out, "baseline GET /healthz  %s\n", base)
			}
			meter := &cpuMeter{pg: cpuPG}
			if cpuPid > 0 {
				meter.pids = []int{cpuPid}
			}
			if meter.enabled() {
				if err := meter.start(); err != nil {
					return err
				}
			}
			prefix := randomHex(6)
			res := b.run(cmd.Context(), concurrency, duration, func(worker, i int) (int, error) {
				n := i
				if dupEvery > 0 && i%dupEvery == dupEvery-1 {
					n = i - 1 // the previous key again: a duplicate delivery
				}
				return b.claim(fmt.Sprintf("bench-%s-%d-%d", prefix, worker, n))
			})
			fmt.Fprintf(out, "POST /v1/runs/claim    %s\n", res)
			if meter.enabled() {
				cpu, err := meter.result(res.statuses[http.StatusCreated] + res.statuses[http.StatusOK])
				if err != nil {
					return err
				}
				fmt.Fprintf(out, "result mode=claims requests=%d rate=%.1f %s\n", res.requests, res.throughput, cpu)
			}
			if base.throughput > 0 && res.throughput > 0 {
				fmt.Fprintf(out, "claim/healthz: throughput ×%.2f, p50 ×%.2f, p99 ×%.2f\n",
					res.throughput/base.throughput, ratio(res.p50, base.p50), ratio(res.p99, base.p99))
			}
			if res.errors > 0 {
				return fmt.Errorf("%d requests failed (first: %v)", res.errors, res.firstErr)
			}
			return nil
		},
	}
	claims.Flags().StringVar(&url, "url", "http://127.0.0.1:8080", "airlock's base URL")
	claims.Flags().StringVar(&key, "api-key", "", "API key with the runs scope [AIRLOCK_API_KEY]")
	claims.Flags().IntVar(&concurrency, "concurrency", 8, "concurrent workers")
	claims.Flags().DurationVar(&duration, "duration", 10*time.Second, "how long each phase runs")
	claims.Flags().IntVar(&dupEvery, "duplicate-every", 10, "every Nth claim repeats a key (0: never)")
	claims.Flags().BoolVar(&baseline, "baseline", true, "measure GET /healthz first")
	claims.Flags().IntVar(&cpuPG, "cpu-pg-pid", 0, "the postmaster's pid: measure the cluster's CPU per claim (Linux /proc)")
	claims.Flags().IntVar(&cpuPid, "cpu-pid", 0, "with --cpu-pg-pid: the airlock serve process to measure too")
	cmd.AddCommand(claims, benchEffectsCmd())
	return cmd
}

type bencher struct {
	url, key string
	client   *http.Client
}

type benchResult struct {
	requests      int
	errors        int
	firstErr      error
	throughput    float64
	p50, p99, max time.Duration
	statuses      map[int]int
}

func (r benchResult) String() string {
	var codes []string
	for _, c := range slices.Sorted(maps.Keys(r.statuses)) {
		codes = append(codes, fmt.Sprintf("%d×%d", c, r.statuses[c]))
	}
	return fmt.Sprintf("%7d req  %8.0f req/s  p50 %-9s p99 %-9s max %-9s [%s]", r.requests, r.throughput,
		r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond), r.max.Round(time.Microsecond), strings.Join(codes, " "))
}

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// run calls op from n workers until d has passed and gathers latencies.
func (b bencher) run(ctx context.Context, n int, d time.Duration, op func(worker, i int) (int, error)) benchResult {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var mu sync.Mutex
	var lat []time.Duration
	res := benchResult{statuses: map[int]int{}}
	var wg sync.WaitGroup
	start := time.Now()
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var local []time.Duration
			codes := map[int]int{}
			var errs int
			var first error
			for i := 0; ctx.Err() == nil; i++ {
				t := time.Now()
				code, err := op(w, i)
				local = append(local, time.Since(t))
				codes[code]++
				if err != nil {
					errs++
					if first == nil {
						first = err
					}
				}
			}
			mu.Lock()
			defer mu.Unlock()
			lat = append(lat, local...)
			for c, k := range codes {
				res.statuses[c] += k
			}
			res.errors += errs
			if res.firstErr == nil {
				res.firstErr = first
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	slices.Sort(lat)
	res.requests = len(lat)
	if len(lat) > 0 {
		res.throughput = float64(len(lat)) / elapsed.Seconds()
		res.p50 = lat[len(lat)*50/100]
		res.p99 = lat[min(len(lat)*99/100, len(lat)-1)]
		res.max = lat[len(lat)-1]
	}
	return res
}

func (b bencher) get(path string) (int, error) {
	resp, err := b.client.Get(b.url + path)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return resp.StatusCode, nil
}

func (b bencher) claim(key string) (int, error) {
	body, _ := json.Marshal(map[string]any{"key": key, "payload": map[string]string{"bench": key}})
	req, err := http.NewRequest(http.MethodPost, b.url+"/v1/runs/claim", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+b.key)
	resp, err := b.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		return resp.StatusCode, fmt.Errorf("claim: %s: %s", resp.Status, bytes.TrimSpace(msg))
	}
	return resp.StatusCode, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
