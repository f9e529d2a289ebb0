package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
)

// benchEffectsOpts are the flags of `airlock bench effects`.
type benchEffectsOpts struct {
	url, key       string
	providerListen string
	providerSleep  time.Duration
	actionType     string
	mode           string
	count          int
	concurrency    int
	then           string
	timeout        time.Duration
	gap            time.Duration
	cpuPG          int    // postmaster pid: measure the cluster's CPU over the drain
	cpuPidFile     string // pids of the dispatching instances, written by --then
	cpuPid         int    // rate: the airlock serve process to measure
	rate           float64
	duration       time.Duration
	grace          time.Duration
	claimsOnly     bool
	maxInFlight    int
}

func benchEffectsCmd() *cobra.Command {
	var o benchEffectsOpts
	cmd := &cobra.Command{
		Use:   "effects",
		Short: "Measure the outbox: effects/s until all are completed, or idle enqueue→send latency",
		Long: `effects starts a local no-op HTTP provider on --provider-listen (it answers 200 after
--provider-sleep, and records each request's arrival time and Idempotency-Key), then drives
a running airlock through its HTTP API only: it claims runs and queues one effect of
--action-type per run. The policy of the airlock instances must point that action type's
http.url at the provider, so this measures whatever dispatcher is in their binary.

  --mode throughput   queue --count effects from --concurrency clients and wait until every
                      one is completed (the provider has seen each key, and GET /metrics
                      counts them completed). Reports effects/s from the first send to the
                      last completion, and from the first queue request (or, with --then,
                      from dispatch start). A key the provider sees twice is a duplicate:
                      any duplicate fails the command.
  --mode latency      on an idle system, queue --count single effects one at a time and
                      report enqueue response → provider arrival p50/p99.
  --mode rate         open loop: --rate arrivals per second for --duration, whatever the
                      server answers; each claims a new run and queues one effect in it
                      (--claims-only: claims only). Latencies run from each arrival's
                      scheduled time (claim) and from the queue request (enqueue →
                      provider), so falling behind shows; at most --max-in-flight arrivals
                      are outstanding (more are dropped and counted), over --concurrency
                      HTTP connections; work still open --grace after the window is
                      abandoned and counts as not held. With --cpu-pg-pid and --cpu-pid
                      (the serve process) it reports their CPU % and the machine's.
                      scripts/capacity.sh runs it at 100 … 2,000/s on both stores.

--then CMD (throughput only) queues everything first, runs CMD with sh -c (it should start
the dispatching instances and return), then measures: both airlock and a job queue then
work a pre-filled queue. Queue through an instance whose policy has dispatch: {disabled:
true} so nothing is sent before CMD runs.

--cpu-pg-pid PID (throughput with --then, Linux) measures CPU: the PostgreSQL cluster's
(that postmaster, its live children and the children it reaped, from /proc) from just
before --then to the last completion, and the user+sys time of the processes whose pids
--then wrote into --cpu-pid-file (the dispatching instances, from their start: their
startup is included). The result line then carries cpu_* fields, per effect.

A run that does not finish within --timeout reports how far it got and fails instead of
hanging. The last line of the output is a "result key=value…" summary for scripts.

The API key comes from --api-key or AIRLOCK_API_KEY and needs the runs scope.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.key == "" {
				o.key = os.Getenv("AIRLOCK_API_KEY")
			}
			if o.key == "" {
				return errors.New("--api-key (or AIRLOCK_API_KEY) is required")
			}
			if o.count < 1 || o.concurrency < 1 || o.timeout <= 0 || o.maxInFlight < 1 {
				return errors.New("--count and --concurrency must be ≥ 1, --timeout > 0")
			}
			if o.then != "" && o.mode != "throughput" {
				return errors.New("--then needs --mode throughput")
			}
			host, _, err := net.SplitHostPort(o.providerListen)
			if err != nil || !net.ParseIP(host).IsLoopback() {
				return errors.New("--provider-listen must be a loopback host:port, e.g. 127.0.0.1:18089")
			}
			ln, err := net.Listen("tcp", o.providerListen)
			if err != nil {
				return fmt.Errorf("provider: %w", err)
			}
			prov := newBenchProvider(o.providerSleep)
			srv := &http.Server{Handler: prov, ReadHeaderTimeout: 10 * time.Second}
			go func() { _ = srv.Serve(ln) }()
			defer srv.Close()
			b := bencher{url: strings.TrimRight(o.url, "/"), key: o.key, client: &http.Client{
				Timeout:   30 * time.Second,
				Transport: &http.Transport{MaxIdleConnsPerHost: o.concurrency, MaxConnsPerHost: o.concurrency},
			}}
			ctx := cmd.Context()
			switch o.mode {
			case "throughput":
				return benchThroughput(ctx, cmd.OutOrStdout(), b, prov, o)
			case "latency":
				return benchLatency(ctx, cmd.OutOrStdout(), b, prov, o)
			case "rate":
				return benchRate(ctx, cmd.OutOrStdout(), b, prov, o)
			}
			return fmt.Errorf("--mode must be throughput, latency or rate, not %q", o.mode)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.url, "url", "http://127.0.0.1:8080", "airlock's base URL (the instance effects are queued through)")
	f.StringVar(&o.key, "api-key", "", "API key with the runs scope [AIRLOCK_API_KEY]")
	f.StringVar(&o.providerListen, "provider-listen", "127.0.0.1:18089", "where the no-op provider listens (loopback only)")
	f.DurationVar(&o.providerSleep, "provider-sleep", 0, "how long the provider takes to answer each request")
	f.StringVar(&o.actionType, "action-type", "bench", "the http action type whose target is the provider")
	f.StringVar(&o.mode, "mode", "throughput", "throughput | latency | rate")
	f.IntVar(&o.count, "count", 1000, "effects to queue")
	f.IntVar(&o.concurrency, "concurrency", 16, "concurrent clients while queueing (throughput)")
	f.StringVar(&o.then, "then", "", "queue everything first, then run this command (sh -c) to start dispatching")
	f.DurationVar(&o.timeout, "timeout", 2*time.Minute, "give up (and fail) after this long, measured from dispatch start")
	f.DurationVar(&o.gap, "gap", 100*time.Millisecond, "latency: wait a random time below this between samples")
	f.IntVar(&o.cpuPG, "cpu-pg-pid", 0, "throughput with --then: the postmaster's pid, to measure CPU per effect (Linux /proc)")
	f.StringVar(&o.cpuPidFile, "cpu-pid-file", "", "with --cpu-pg-pid: a file where --then writes the dispatching instances' pids")
	f.IntVar(&o.cpuPid, "cpu-pid", 0, "rate: the airlock serve process, to report its CPU % (Linux /proc)")
	f.Float64Var(&o.rate, "rate", 100, "rate: arrivals per second, offered whatever the server answers")
	f.DurationVar(&o.duration, "duration", 10*time.Second, "rate: how long arrivals are offered")
	f.DurationVar(&o.grace, "grace", 5*time.Second, "rate: how long outstanding work may finish after the window")
	f.BoolVar(&o.claimsOnly, "claims-only", false, "rate: each arrival only claims a run (no effect)")
	f.IntVar(&o.maxInFlight, "max-in-flight", 2000, "rate: outstanding arrivals at most; more are dropped and counted")
	return cmd
}

// benchProvider is the no-op provider: it records when each Idempotency-Key arrived and
// how often, so a key seen twice (a duplicate send) is counted.
type benchProvider struct {
	sleep time.Duration

	mu      sync.Mutex
	seen    map[string]int
	first   time.Time
	last    time.Time
	total   int
	dups    int
	noKey   int
	waiters map[string]chan time.Time
}

func newBenchProvider(sleep time.Duration) *benchProvider {
	return &benchProvider{sleep: sleep, seen: map[string]int{}, waiters: map[string]chan time.Time{}}
}

func (p *benchProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	at := time.Now()
	_, _ = io.Copy(io.Discard, r.Body)
	p.record(r.Header.Get("Idempotency-Key"), at)
	if p.sleep > 0 {
		time.Sleep(p.sleep)
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":"p-%d"}`, at.UnixNano())
}

func (p *benchProvider) record(key string, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if key == "" {
		p.noKey++
		return
	}
	if p.total == 0 {
		p.first = at
	}
	p.total++
	p.last = at
	p.seen[key]++
	if p.seen[key] > 1 {
		p.dups++
		return
	}
	if c, ok := p.waiters[key]; ok {
		c <- at
		delete(p.waiters, key)
	}
}

// await returns a channel that receives the arrival time of key's first request.
func (p *benchProvider) await(key string) <-chan time.Time {
	c := make(chan time.Time, 1)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.waiters[key] = c
	return c
}

type providerStats struct {
	unique, total, duplicates, noKey int
	first, last                      time.Time
}

func (p *benchProvider) stats() providerStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return providerStats{unique: len(p.seen), total: p.total, duplicates: p.dups, noKey: p.noKey, first: p.first, last: p.last}
}

// percentile is the nearest-rank percentile of sorted durations (0 for none).
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

// rate is n per second of d (0 when d is not positive).
func rate(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

func benchThroughput(ctx context.Context, out io.Writer, b bencher, prov *benchProvider, o benchEffectsOpts) error {
	base, err := b.effectStates(ctx)
	if err != nil {
		return err
	}
	prefix := randomHex(6)
	queueStart := time.Now()
	qctx, cancel := context.WithTimeout(ctx, o.timeout)
	err = b.queueMany(qctx, prefix, o)
	cancel()
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("queueing %d effects did not finish in %s", o.count, o.timeout)
	} else if err != nil {
		return err
	}
	queued := time.Since(queueStart)
	fmt.Fprintf(out, "queued %d effects in %.2fs (%.0f/s) through %s\n", o.count, queued.Seconds(), rate(o.count, queued), b.url)
	start, startLabel := queueStart, "first queue request"
	meter := &cpuMeter{pg: o.cpuPG}
	if meter.enabled() {
		if o.then == "" || o.cpuPidFile == "" {
			return errors.New("--cpu-pg-pid needs --then and --cpu-pid-file")
		}
		if err := meter.start(); err != nil {
			return err
		}
	}
	if o.then != "" {
		if st := prov.stats(); st.total > 0 {
			return fmt.Errorf("the provider got %d requests before --then ran: queue through an instance with dispatch: {disabled: true}", st.total)
		}
		start, startLabel = time.Now(), "dispatch start"
		tctx, cancel := context.WithTimeout(ctx, o.timeout)
		sh := exec.CommandContext(tctx, "sh", "-c", o.then)
		sh.Stdout, sh.Stderr = os.Stderr, os.Stderr
		err := sh.Run()
		cancel()
		if err != nil {
			return fmt.Errorf("--then: %w", err)
		}
		if meter.enabled() {
			if meter.pids, err = readPids(o.cpuPidFile); err != nil {
				return err
			}
		}
	}
	done, end, states, err := b.waitCompleted(ctx, prov, o.count, base, start.Add(o.timeout))
	if err != nil {
		return err
	}
	st := prov.stats()
	fromStart := end.Sub(start)
	var window time.Duration // from the first send: none without one
	if st.total > 0 {
		window = end.Sub(st.first)
	}
	res := fmt.Sprintf("result mode=throughput count=%d completed=%d finished=%t seconds=%.3f rate=%.1f from=%s from_start_seconds=%.3f from_start_rate=%.1f duplicates=%d queue_rate=%.1f",
		o.count, done, done == o.count, window.Seconds(), rate(done, window), strings.ReplaceAll(startLabel, " ", "_"),
		fromStart.Seconds(), rate(done, fromStart), st.duplicates, rate(o.count, queued))
	if meter.enabled() {
		cpu, err := meter.result(done)
		if err != nil {
			return err
		}
		res += " " + cpu
	}
	if done == o.count {
		fmt.Fprintf(out, "all %d completed %.2fs after the first send (%.0f effects/s); %.2fs after the %s (%.0f effects/s)\n",
			done, window.Seconds(), rate(done, window), fromStart.Seconds(), startLabel, rate(done, fromStart))
	} else {
		fmt.Fprintf(out, "did not finish in %s: %d of %d completed, provider saw %d (%.0f effects/s so far); states %v\n",
			o.timeout, done, o.count, st.unique, rate(done, fromStart), states)
	}
	fmt.Fprintf(out, "provider: %d requests, %d keys, %d duplicates, %d without Idempotency-Key\n", st.total, st.unique, st.duplicates, st.noKey)
	fmt.Fprintln(out, res)
	switch {
	case st.duplicates > 0:
		return fmt.Errorf("DUPLICATES: the provider saw %d keys more than once", st.duplicates)
	case st.noKey > 0:
		return fmt.Errorf("%d requests reached the provider without an Idempotency-Key", st.noKey)
	case done < o.count:
		return fmt.Errorf("did not finish in %s", o.timeout)
	}
	return nil
}

// queueMany claims count runs and queues one effect in each, from o.concurrency clients.
func (b bencher) queueMany(ctx context.Context, prefix string, o benchEffectsOpts) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, o.concurrency)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range o.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= o.count {
					return
				}
				if _, _, err := b.queueOne(ctx, fmt.Sprintf("bench-%s-%d", prefix, i), o.actionType, i); err != nil {
					errc <- err
					cancel()
					return
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
		return ctx.Err()
	}
}

// queueOne claims key and queues effect "e" in it (provider key "<key>/e"); it returns
// when the queue request was sent and when its response arrived.
func (b bencher) queueOne(ctx context.Context, key, actionType string, i int) (sent, answered time.Time, err error) {
	var claim struct {
		Claimed    bool   `json:"claimed"`
		LeaseOwner string `json:"lease_owner"`
		Version    int    `json:"version"`
	}
	if err := b.postJSON(ctx, "/v1/runs/claim", map[string]any{"key": key, "payload": map[string]int{"i": i}}, http.StatusCreated, &claim); err != nil {
		return sent, answered, err
	}
	sent = time.Now()
	err = b.postJSON(ctx, "/v1/runs/"+key+"/effects", map[string]any{"lease_owner": claim.LeaseOwner, "version": claim.Version,
		"action_type": actionType, "target": "default", "effect_id": "e", "payload": map[string]int{"i": i}}, http.StatusCreated, nil)
	return sent, time.Now(), err
}

func (b bencher) postJSON(ctx context.Context, path string, body any, want int, into any) error {
	raw, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.url+path, bytes.NewReader(raw))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+b.key)
	resp, err := b.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != want {
		return fmt.Errorf("POST %s: %s: %s", path, resp.Status, bytes.TrimSpace(msg))
	}
	if into != nil {
		return json.Unmarshal(msg, into)
	}
	return nil
}

// effectStates reads airlock_effects{state} from GET /metrics: the database's counts.
func (b bencher) effectStates(ctx context.Context) (map[string]int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.url+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := b.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	return parseEffectStates(resp.Body)
}

// parseEffectStates picks the airlock_effects{state="…"} samples out of a Prometheus
// text exposition.
func parseEffectStates(r io.Reader) (map[string]int, error) {
	states := map[string]int{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), `airlock_effects{state="`)
		if !ok {
			continue
		}
		state, value, ok := strings.Cut(rest, `"} `)
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return nil, fmt.Errorf("metrics: airlock_effects{state=%q}: %w", state, err)
		}
		states[state] = int(v)
	}
	return states, sc.Err()
}

// waitCompleted waits until n effects beyond base are completed, or until deadline. It
// watches the provider (in process, cheap) first and asks /metrics once every key has
// arrived, or every second before that for progress. It returns how many completed and when
// that was seen.
func (b bencher) waitCompleted(ctx context.Context, prov *benchProvider, n int, base map[string]int, deadline time.Time) (int, time.Time, map[string]int, error) {
	var states map[string]int
	lastPoll := time.Time{}
	done := 0
	for {
		now := time.Now()
		arrived := prov.stats().unique >= n
		if arrived || now.Sub(lastPoll) >= time.Second || !now.Before(deadline) {
			var err error
			if states, err = b.effectStates(ctx); err != nil {
				return 0, now, nil, err
			}
			lastPoll = now
			done = states["completed"] - base["completed"]
			if done >= n {
				return n, time.Now(), states, nil
			}
		}
		if !now.Before(deadline) {
			return done, now, states, nil
		}
		wait := 100 * time.Millisecond
		if arrived {
			wait = 10 * time.Millisecond
		}
		select {
		case <-ctx.Done():
			return done, now, states, ctx.Err()
		case <-time.After(wait):
		}
	}
}

func benchLatency(ctx context.Context, out io.Writer, b bencher, prov *benchProvider, o benchEffectsOpts) error {
	prefix := randomHex(6)
	var fromResp, fromReq []time.Duration
	for i := range o.count {
		key := fmt.Sprintf("lat-%s-%d", prefix, i)
		arrived := prov.await(key + "/e")
		sent, answered, err := b.queueOne(ctx, key, o.actionType, i)
		if err != nil {
			return err
		}
		select {
		case at := <-arrived:
			fromResp = append(fromResp, at.Sub(answered))
			fromReq = append(fromReq, at.Sub(sent))
		case <-time.After(o.timeout):
			return fmt.Errorf("sample %d: the provider did not see the effect within %s", i, o.timeout)
		case <-ctx.Done():
			return ctx.Err()
		}
		if o.gap > 0 {
			time.Sleep(rand.N(o.gap))
		}
	}
	slices.Sort(fromResp)
	slices.Sort(fromReq)
	st := prov.stats()
	fmt.Fprintf(out, "enqueue response → provider arrival: p50 %s  p99 %s  max %s  (%d samples)\n",
		ms(percentile(fromResp, 50)), ms(percentile(fromResp, 99)), ms(fromResp[len(fromResp)-1]), len(fromResp))
	fmt.Fprintf(out, "enqueue request → provider arrival:  p50 %s  p99 %s\n", ms(percentile(fromReq, 50)), ms(percentile(fromReq, 99)))
	fmt.Fprintf(out, "result mode=latency count=%d p50_ms=%.2f p99_ms=%.2f max_ms=%.2f duplicates=%d\n", len(fromResp),
		msf(percentile(fromResp, 50)), msf(percentile(fromResp, 99)), msf(fromResp[len(fromResp)-1]), st.duplicates)
	if st.duplicates > 0 {
		return fmt.Errorf("DUPLICATES: the provider saw %d keys more than once", st.duplicates)
	}
	return nil
}

func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
func ms(d time.Duration) string   { return fmt.Sprintf("%.1fms", msf(d)) }
