package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Open-loop load at a fixed offered rate (`airlock bench effects --mode rate`,
// scripts/capacity.sh): arrivals are scheduled every 1/rate seconds whatever the server
// answers, and each latency is measured from the arrival's scheduled time, so a server
// that falls behind shows it in the latencies (no coordinated omission) and in the rate
// it held, instead of slowing the load down.

// rateOutcome is one arrival's result.
type rateOutcome struct {
	claimed  bool
	claimLat time.Duration // scheduled arrival → claim response
	queued   bool
	queuedAt time.Time // when the queue request was sent
	sendLat  time.Duration
	sent     bool // the provider saw the effect
	err      error
}

// rateReport is what `--mode rate` measured.
type rateReport struct {
	offered            float64
	window             time.Duration
	arrivals, dropped  int
	claims, effects    int // claims answered and effects the provider saw, within window + grace
	errors             int
	firstErr           error
	claimP50, claimP99 time.Duration
	sendP50, sendP99   time.Duration
	duplicates         int
}

// heldClaims and heldEffects are the rates held over the arrival window.
func (r rateReport) heldClaims() float64  { return rate(r.claims, r.window) }
func (r rateReport) heldEffects() float64 { return rate(r.effects, r.window) }

// benchRate drives o.rate arrivals per second for o.duration. Each arrival claims a new
// run and, unless o.claimsOnly, queues one effect in it and waits for the provider to see
// it. At most o.maxInFlight arrivals are outstanding; an arrival beyond that is dropped
// (counted: the server is saturated). After the window, outstanding work has o.grace to
// finish; whatever finishes later does not count as held.
func benchRate(ctx context.Context, out io.Writer, b bencher, prov *benchProvider, o benchEffectsOpts) error {
	if o.rate <= 0 || o.duration <= 0 {
		return fmt.Errorf("--mode rate needs --rate > 0 and --duration > 0")
	}
	var cpu0 machineCPUSample
	var pg0, serve0 time.Duration
	var err error
	if o.cpuPG > 0 {
		if pg0, err = clusterCPU(o.cpuPG); err != nil {
			return fmt.Errorf("cpu: postmaster %d: %w", o.cpuPG, err)
		}
	}
	if o.cpuPid > 0 {
		if serve0, err = processCPU(o.cpuPid); err != nil {
			return fmt.Errorf("cpu: process %d: %w", o.cpuPid, err)
		}
	}
	cpu0, _ = readMachineCPU()
	self0, _ := processCPU(os.Getpid())

	prefix := randomHex(6)
	interval := time.Duration(float64(time.Second) / o.rate)
	start := time.Now()
	end := start.Add(o.duration)
	deadline := end.Add(o.grace)
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()

	var (
		mu       sync.Mutex
		outcomes []rateOutcome
		inFlight atomic.Int64
		wg       sync.WaitGroup
		dropped  int
		arrivals int
	)
	for i := 0; ; i++ {
		at := start.Add(time.Duration(i) * interval)
		if !at.Before(end) {
			break
		}
		if d := time.Until(at); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		arrivals++
		if inFlight.Load() >= int64(o.maxInFlight) {
			dropped++
			continue
		}
		inFlight.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer inFlight.Add(-1)
			r := rateArrival(dctx, b, prov, o, fmt.Sprintf("rate-%s-%d", prefix, i), at, i)
			mu.Lock()
			outcomes = append(outcomes, r)
			mu.Unlock()
		}()
	}
	wg.Wait()

	// The rate held is over the arrival window: work finished in the grace after it counts,
	// work abandoned at the grace's end does not.
	rep := rateReport{offered: o.rate, window: o.duration, arrivals: arrivals, dropped: dropped}
	var claimLat, sendLat []time.Duration
	for _, r := range outcomes {
		if r.err != nil {
			rep.errors++
			if rep.firstErr == nil {
				rep.firstErr = r.err
			}
		}
		if r.claimed {
			rep.claims++
			claimLat = append(claimLat, r.claimLat)
		}
		if r.sent {
			rep.effects++
			sendLat = append(sendLat, r.sendLat)
		}
	}
	// An arrival that was dropped or did not finish in time counts at the window's end
	// plus the grace: a latency percentile over only the lucky arrivals would flatter.
	for range arrivals - rep.claims {
		claimLat = append(claimLat, o.duration+o.grace)
	}
	if !o.claimsOnly {
		for range arrivals - rep.effects {
			sendLat = append(sendLat, o.duration+o.grace)
		}
	}
	slices.Sort(claimLat)
	slices.Sort(sendLat)
	rep.claimP50, rep.claimP99 = percentile(claimLat, 50), percentile(claimLat, 99)
	rep.sendP50, rep.sendP99 = percentile(sendLat, 50), percentile(sendLat, 99)
	rep.duplicates = prov.stats().duplicates

	elapsed := time.Since(start)
	res := fmt.Sprintf("result mode=rate workload=%s offered=%.0f seconds=%.1f arrivals=%d dropped=%d errors=%d claims=%d claims_rate=%.1f claim_p50_ms=%.2f claim_p99_ms=%.2f",
		map[bool]string{true: "claims", false: "effects"}[o.claimsOnly], o.rate, o.duration.Seconds(), arrivals, dropped, rep.errors,
		rep.claims, rep.heldClaims(), msf(rep.claimP50), msf(rep.claimP99))
	if !o.claimsOnly {
		res += fmt.Sprintf(" effects=%d effects_rate=%.1f send_p50_ms=%.2f send_p99_ms=%.2f duplicates=%d",
			rep.effects, rep.heldEffects(), msf(rep.sendP50), msf(rep.sendP99), rep.duplicates)
	}
	if o.cpuPG > 0 {
		pg1, err := clusterCPU(o.cpuPG)
		if err != nil {
			return fmt.Errorf("cpu: postmaster %d: %w", o.cpuPG, err)
		}
		res += fmt.Sprintf(" cpu_pg_pct=%.0f", 100*(pg1-pg0).Seconds()/elapsed.Seconds())
	}
	if o.cpuPid > 0 {
		s1, err := processCPU(o.cpuPid)
		if err != nil {
			return fmt.Errorf("cpu: process %d: %w", o.cpuPid, err)
		}
		res += fmt.Sprintf(" cpu_serve_pct=%.0f", 100*(s1-serve0).Seconds()/elapsed.Seconds())
	}
	if cpu1, err := readMachineCPU(); err == nil && cpu0.total > 0 {
		res += fmt.Sprintf(" cpu_machine_pct=%.0f", cpu1.busyPercent(cpu0))
	}
	if self1, err := processCPU(os.Getpid()); err == nil {
		// The load generator's own share (it and its provider run on the same cores).
		res += fmt.Sprintf(" cpu_driver_pct=%.0f", 100*(self1-self0).Seconds()/elapsed.Seconds())
	}
	fmt.Fprintf(out, "offered %.0f/s for %s: %d arrivals, %d dropped, %d errors; held %.0f claims/s (p50 %s, p99 %s)",
		o.rate, o.duration, arrivals, dropped, rep.errors, rep.heldClaims(), ms(rep.claimP50), ms(rep.claimP99))
	if !o.claimsOnly {
		fmt.Fprintf(out, ", %.0f effects/s (enqueue → provider p50 %s, p99 %s)", rep.heldEffects(), ms(rep.sendP50), ms(rep.sendP99))
	}
	fmt.Fprintln(out)
	if rep.firstErr != nil {
		fmt.Fprintf(out, "first error: %v\n", rep.firstErr)
	}
	fmt.Fprintln(out, res)
	if rep.duplicates > 0 {
		return fmt.Errorf("DUPLICATES: the provider saw %d keys more than once", rep.duplicates)
	}
	return nil
}

// rateArrival is one arrival: claim a new run and, for the effects workload, queue one
// effect and wait for the provider to see it (until ctx ends).
func rateArrival(ctx context.Context, b bencher, prov *benchProvider, o benchEffectsOpts, key string, at time.Time, i int) rateOutcome {
	var r rateOutcome
	if o.claimsOnly {
		if _, err := b.claimCtx(ctx, key); err != nil {
			r.err = err
			return r
		}
		r.claimed, r.claimLat = true, time.Since(at)
		return r
	}
	arrived := prov.await(key + "/e")
	var claim struct {
		LeaseOwner string `json:"lease_owner"`
		Version    int    `json:"version"`
	}
	if err := b.postJSON(ctx, "/v1/runs/claim", map[string]any{"key": key, "payload": map[string]int{"i": i}}, 201, &claim); err != nil {
		r.err = err
		return r
	}
	r.claimed, r.claimLat = true, time.Since(at)
	r.queuedAt = time.Now()
	if err := b.postJSON(ctx, "/v1/runs/"+key+"/effects", map[string]any{"lease_owner": claim.LeaseOwner, "version": claim.Version,
		"action_type": o.actionType, "target": "default", "effect_id": "e", "payload": map[string]int{"i": i}}, 201, nil); err != nil {
		r.err = err
		return r
	}
	r.queued = true
	select {
	case got := <-arrived:
		r.sent, r.sendLat = true, got.Sub(r.queuedAt)
	case <-ctx.Done():
	}
	return r
}

// claimCtx is bencher.claim under a context (an arrival past the grace is abandoned).
func (b bencher) claimCtx(ctx context.Context, key string) (int, error) {
	err := b.postJSON(ctx, "/v1/runs/claim", map[string]any{"key": key, "payload": map[string]string{"bench": key}}, 201, nil)
	if err != nil {
		return 0, err
	}
	return 201, nil
}

// machineCPUSample is the first line of /proc/stat: busy and total jiffies of all CPUs.
type machineCPUSample struct{ busy, total uint64 }

func readMachineCPU() (machineCPUSample, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return machineCPUSample{}, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return machineCPUSample{}, fmt.Errorf("/proc/stat: empty")
	}
	return parseMachineCPU(sc.Text())
}

// parseMachineCPU reads "cpu user nice system idle iowait irq softirq steal …": idle and
// iowait are not busy.
func parseMachineCPU(line string) (machineCPUSample, error) {
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return machineCPUSample{}, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var s machineCPUSample
	for i, v := range f[1:] {
		if i >= 8 { // guest times are already in user and nice
			break
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return machineCPUSample{}, fmt.Errorf("/proc/stat: %w", err)
		}
		s.total += n
		if i != 3 && i != 4 {
			s.busy += n
		}
	}
	return s, nil
}

// busyPercent is the machine's busy share (all CPUs) since before, in per cent.
func (s machineCPUSample) busyPercent(before machineCPUSample) float64 {
	if s.total <= before.total {
		return 0
	}
	return 100 * float64(s.busy-before.busy) / float64(s.total-before.total)
}
