// Command riverbench is the River baseline for airlock's outbox benchmark
// (scripts/bench-outbox.sh): the same work measured the same way on a job queue that
// many Go services use. It is its own module so airlock never depends on River.
//
// It runs River's migrations itself (rivermigrate: the River CLI does not resolve from
// the module proxy here), then:
//
//	--mode throughput  inserts --count jobs with InsertMany while no client works, starts
//	                   a client and reports jobs/s from the first job start to the last
//	                   completion (and from Start).
//	--mode latency     with the client idle, inserts --count single jobs one at a time and
//	                   reports insert return → job start p50/p99.
//
//	--mode provider    serves the no-op HTTP provider on --listen (200 with an id at once),
//	                   counting each Idempotency-Key, until SIGTERM/SIGINT; then prints
//	                   its counts (duplicates included). A process of its own, so its
//	                   CPU is not River's.
//
// Each job does nothing (or sleeps --sleep), or with --post-url makes the HTTP POST
// airlock's http connector makes for an effect (JSON body, Idempotency-Key header) and
// fails on anything but 2xx. With --cpu-pg-pid (Linux) the result also carries the CPU
// of the drain: this process's user+sys time (getrusage) and the PostgreSQL cluster's
// (that postmaster, its live children and the children it reaped, from /proc), from just
// before Start to the last completion. The last line is a "result key=value…"
// summary in the same shape as `airlock bench effects`.
package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

type benchArgs struct {
	Seq int `json:"seq"`
}

func (benchArgs) Kind() string { return "bench" }

// benchWorker does nothing (or sleeps) and tells the bench when each job started.
type benchWorker struct {
	river.WorkerDefaults[benchArgs]
	sleep   time.Duration
	postURL string
	client  *http.Client
	first   atomic.Int64 // unix nanos of the first job start
	mu      sync.Mutex
	waiters map[int]chan time.Time
}

func (w *benchWorker) Work(ctx context.Context, job *river.Job[benchArgs]) error {
	now := time.Now()
	w.first.CompareAndSwap(0, now.UnixNano())
	w.mu.Lock()
	if c, ok := w.waiters[job.Args.Seq]; ok {
		c <- now
		delete(w.waiters, job.Args.Seq)
	}
	w.mu.Unlock()
	if w.sleep > 0 {
		select {
		case <-time.After(w.sleep):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if w.postURL != "" {
		return w.post(ctx, job)
	}
	return nil
}

// post is the send of an effect: POST the job's args as JSON with its Idempotency-Key.
func (w *benchWorker) post(ctx context.Context, job *river.Job[benchArgs]) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.postURL, bytes.NewReader(job.EncodedArgs))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "river-"+strconv.Itoa(job.Args.Seq))
	resp, err := w.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("provider: %s", resp.Status)
	}
	return nil
}

func (w *benchWorker) await(seq int) <-chan time.Time {
	c := make(chan time.Time, 1)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.waiters[seq] = c
	return c
}

type options struct {
	dbURL             string
	mode, variant     string
	count             int
	sleep             time.Duration
	maxWorkers        int
	fetchCooldown     time.Duration
	fetchPollInterval time.Duration
	timeout           time.Duration
	gap               time.Duration
	postURL           string
	listen            string
	cpuPG             int
	pool              int
}

func main() {
	var o options
	flag.StringVar(&o.dbURL, "database-url", os.Getenv("RIVER_DATABASE_URL"), "PostgreSQL URL of a database River may own [RIVER_DATABASE_URL]")
	flag.StringVar(&o.mode, "mode", "throughput", "throughput | latency")
	flag.StringVar(&o.variant, "variant", "default", "default (River's fetch settings, 100 workers) | tuned (the flags below)")
	flag.IntVar(&o.count, "count", 1000, "jobs")
	flag.DurationVar(&o.sleep, "sleep", 0, "how long each job works")
	flag.IntVar(&o.maxWorkers, "max-workers", 0, "workers (default 100; tuned 500)")
	flag.DurationVar(&o.fetchCooldown, "fetch-cooldown", 0, "tuned: FetchCooldown (default 10ms)")
	flag.DurationVar(&o.fetchPollInterval, "fetch-poll-interval", 0, "tuned: FetchPollInterval (default 50ms)")
	flag.DurationVar(&o.timeout, "timeout", 2*time.Minute, "give up after this long from Start")
	flag.DurationVar(&o.gap, "gap", 100*time.Millisecond, "latency: wait a random time below this between samples")
	flag.StringVar(&o.postURL, "post-url", "", "each job POSTs to this URL (the no-op provider) instead of doing nothing")
	flag.StringVar(&o.listen, "listen", "127.0.0.1:0", "provider: where to listen")
	flag.IntVar(&o.cpuPG, "cpu-pg-pid", 0, "throughput: the postmaster's pid, to measure CPU per job (Linux /proc)")
	flag.Parse()
	if o.mode == "provider" {
		if err := provide(o.listen); err != nil {
			fmt.Fprintln(os.Stderr, "riverbench:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(context.Background(), o); err != nil {
		fmt.Fprintln(os.Stderr, "riverbench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	if o.dbURL == "" {
		return errors.New("--database-url (or RIVER_DATABASE_URL) is required")
	}
	pool, err := pgxpool.New(ctx, o.dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	driver := riverpgxv5.New(pool)
	migrator, err := rivermigrate.New(driver, nil)
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	worker := &benchWorker{sleep: o.sleep, postURL: o.postURL, waiters: map[int]chan time.Time{}}
	if o.postURL != "" {
		// Like airlock's http connector: http.DefaultTransport's settings, more idle conns.
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConns, t.MaxIdleConnsPerHost = 1024, 1024
		worker.client = &http.Client{Transport: t, Timeout: 10 * time.Second}
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, worker)
	cfg := &river.Config{
		Logger:  slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Workers: workers,
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: cmp.Or(o.maxWorkers, 100)}},
	}
	switch o.variant {
	case "default":
	case "tuned":
		cfg.Queues[river.QueueDefault] = river.QueueConfig{MaxWorkers: cmp.Or(o.maxWorkers, 500)}
		cfg.FetchCooldown = cmp.Or(o.fetchCooldown, 10*time.Millisecond)
		cfg.FetchPollInterval = cmp.Or(o.fetchPollInterval, 50*time.Millisecond)
	default:
		return fmt.Errorf("--variant must be default or tuned, not %q", o.variant)
	}
	client, err := river.NewClient(driver, cfg)
	if err != nil {
		return err
	}
	q := cfg.Queues[river.QueueDefault]
	fmt.Printf("river %s: MaxWorkers %d, FetchCooldown %s, FetchPollInterval %s, job sleep %s\n", o.variant, q.MaxWorkers,
		cmp.Or(cfg.FetchCooldown, river.FetchCooldownDefault), cmp.Or(cfg.FetchPollInterval, river.FetchPollIntervalDefault), o.sleep)
	switch o.mode {
	case "throughput":
		return throughput(ctx, client, worker, o)
	case "latency":
		return latency(ctx, client, worker, o)
	}
	return fmt.Errorf("--mode must be throughput or latency, not %q", o.mode)
}

func throughput(ctx context.Context, client *river.Client[pgx.Tx], worker *benchWorker, o options) error {
	insertStart := time.Now()
	for from := 0; from < o.count; from += 1000 {
		batch := make([]river.InsertManyParams, 0, 1000)
		for i := from; i < min(from+1000, o.count); i++ {
			batch = append(batch, river.InsertManyParams{Args: benchArgs{Seq: i}})
		}
		if _, err := client.InsertMany(ctx, batch); err != nil {
			return fmt.Errorf("insert: %w", err)
		}
	}
	inserted := time.Since(insertStart)
	fmt.Printf("inserted %d jobs in %.2fs (%.0f/s)\n", o.count, inserted.Seconds(), rate(o.count, inserted))
	events, cancel := client.SubscribeConfig(&river.SubscribeConfig{Kinds: []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed}, ChanSize: o.count + 100})
	defer cancel()
	var pg0, self0 time.Duration
	if o.cpuPG > 0 {
		var err error
		if pg0, err = clusterCPU(o.cpuPG); err != nil {
			return fmt.Errorf("cpu: %w", err)
		}
		self0 = selfCPU()
	}
	start := time.Now()
	if err := client.Start(ctx); err != nil {
		return err
	}
	defer stop(client)
	deadline := time.After(o.timeout)
	done, failed := 0, 0
	end := start
wait:
	for done+failed < o.count {
		select {
		case ev := <-events:
			if ev.Kind == river.EventKindJobCompleted {
				done++
			} else {
				failed++
			}
			end = time.Now()
		case <-deadline:
			end = time.Now()
			break wait
		}
	}
	var window time.Duration // from the first job start: none without one
	if first := worker.first.Load(); first != 0 {
		window = end.Sub(time.Unix(0, first))
	}
	fromStart := end.Sub(start)
	cpu := ""
	if o.cpuPG > 0 {
		pg1, err := clusterCPU(o.cpuPG)
		if err != nil {
			return fmt.Errorf("cpu: %w", err)
		}
		dproc, dpg := selfCPU()-self0, pg1-pg0
		per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(max(done, 1)) }
		cpu = fmt.Sprintf(" cpu_process_s=%.2f cpu_pg_s=%.2f cpu_us_per_op=%.0f cpu_pg_us_per_op=%.0f cpu_process_us_per_op=%.0f",
			dproc.Seconds(), dpg.Seconds(), per(dproc+dpg), per(dpg), per(dproc))
	}
	if done == o.count {
		fmt.Printf("all %d completed %.2fs after the first job start (%.0f jobs/s); %.2fs after Start (%.0f jobs/s)\n",
			done, window.Seconds(), rate(done, window), fromStart.Seconds(), rate(done, fromStart))
	} else {
		fmt.Printf("did not finish in %s: %d of %d completed, %d failed\n", o.timeout, done, o.count, failed)
	}
	fmt.Printf("result system=river variant=%s mode=throughput count=%d completed=%d finished=%t seconds=%.3f rate=%.1f from=start from_start_seconds=%.3f from_start_rate=%.1f duplicates=0 queue_rate=%.1f%s\n",
		o.variant, o.count, done, done == o.count, window.Seconds(), rate(done, window), fromStart.Seconds(), rate(done, fromStart), rate(o.count, inserted), cpu)
	if done < o.count {
		return fmt.Errorf("did not finish in %s", o.timeout)
	}
	return nil
}

func latency(ctx context.Context, client *river.Client[pgx.Tx], worker *benchWorker, o options) error {
	if err := client.Start(ctx); err != nil {
		return err
	}
	defer stop(client)
	time.Sleep(time.Second) // let the client settle (leader election, first fetch) before sampling
	var lat []time.Duration
	for i := range o.count {
		started := worker.await(i)
		if _, err := client.Insert(ctx, benchArgs{Seq: i}, nil); err != nil {
			return fmt.Errorf("insert: %w", err)
		}
		inserted := time.Now()
		select {
		case at := <-started:
			lat = append(lat, at.Sub(inserted))
		case <-time.After(o.timeout):
			return fmt.Errorf("sample %d: the job did not start within %s", i, o.timeout)
		}
		if o.gap > 0 {
			time.Sleep(rand.N(o.gap))
		}
	}
	slices.Sort(lat)
	fmt.Printf("insert return → job start: p50 %.1fms  p99 %.1fms  max %.1fms  (%d samples)\n",
		msf(percentile(lat, 50)), msf(percentile(lat, 99)), msf(lat[len(lat)-1]), len(lat))
	fmt.Printf("result system=river variant=%s mode=latency count=%d p50_ms=%.2f p99_ms=%.2f max_ms=%.2f duplicates=0\n",
		o.variant, len(lat), msf(percentile(lat, 50)), msf(percentile(lat, 99)), msf(lat[len(lat)-1]))
	return nil
}

func stop(client *river.Client[pgx.Tx]) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := client.Stop(ctx); err != nil {
		_ = client.StopAndCancel(context.Background())
	}
}

// percentile is the nearest-rank percentile of sorted durations.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

func rate(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// selfCPU is this process's user+sys time.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// clusterCPU is a process tree's CPU (a PostgreSQL cluster by its postmaster): the root's
// user+sys, its reaped children's, and its live descendants' (from /proc, USER_HZ 100).
// A backend exiting between two samples moves from live to reaped whole.
func clusterCPU(pid int) (time.Duration, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	f := strings.Fields(string(raw[i+1:]))
	if len(f) < 15 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	var ticks int64
	for _, s := range f[11:15] { // utime stime cutime cstime
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, err
		}
		ticks += n
	}
	total := time.Duration(ticks) * (time.Second / 100)
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, t := range tasks {
		kids, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, t.Name()))
		for _, k := range strings.Fields(string(kids)) {
			if c, err := strconv.Atoi(k); err == nil {
				if d, err := clusterCPU(c); err == nil {
					total += d
				}
			}
		}
	}
	return total, nil
}

// provide serves the no-op provider until SIGTERM or SIGINT, then prints its counts.
func provide(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	var mu sync.Mutex
	seen := map[string]int{}
	total, dups := 0, 0
	var n atomic.Int64
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		k := r.Header.Get("Idempotency-Key")
		mu.Lock()
		total++
		seen[k]++
		if seen[k] > 1 {
			dups++
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"p-%d"}`, n.Add(1))
	})}
	fmt.Printf("listening %s\n", ln.Addr())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() { <-sig; _ = srv.Close() }()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	fmt.Printf("provider requests=%d keys=%d duplicates=%d\n", total, len(seen), dups)
	return nil
}
