// Package metrics holds airlock's Prometheus collectors and its alert sink. Labels are
// small closed sets (outcomes, route patterns, alert kinds): never keys, ids or paths.
package metrics

import (
	"context"
	"log/slog"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/airlockhq/airlock/internal/version"
)

// Metrics is one registry; each server builds its own so tests do not share counters.
type Metrics struct {
	Registry     *prometheus.Registry
	Claims       *prometheus.CounterVec
	Alerts       *prometheus.CounterVec
	HTTPRequests *prometheus.CounterVec
	HTTPDuration *prometheus.HistogramVec
	Dispatch     *prometheus.HistogramVec
	Approvals    *prometheus.CounterVec
	GateWait     *prometheus.HistogramVec
	Validations  *prometheus.CounterVec
	RetryCaps    prometheus.Counter
	SignIns      *prometheus.CounterVec
}

func New() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		Claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "airlock_claims_total", Help: "Claims by outcome: claimed, reclaimed, duplicate, payload_mismatch.",
		}, []string{"outcome"}),
		Alerts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "airlock_alerts_total", Help: "Alerts raised, by kind.",
		}, []string{"kind"}),
		HTTPRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "airlock_http_requests_total", Help: "HTTP requests by route pattern and status code.",
		}, []string{"route", "code"}),
		HTTPDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "airlock_http_request_duration_seconds", Help: "HTTP request latency by route pattern.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"route"}),
		Dispatch: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "airlock_dispatch_seconds", Help: "Time a connector took to send an effect, by outcome (sent, retryable, refused, ambiguous).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, []string{"outcome"}),
		Approvals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "airlock_approvals_total", Help: "Approval decisions by gate mode and decision (approve, reject, cancel, auto, expired).",
		}, []string{"mode", "decision"}),
		GateWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "airlock_gate_wait_seconds", Help: "Time from an approval's request to its decision, by gate mode.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 18), // 1s … ~36h
		}, []string{"mode"}),
		Validations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "airlock_validations_total", Help: "Validation results: valid, repaired, invalid.",
		}, []string{"result"}),
		RetryCaps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "airlock_retry_cap_hits_total", Help: "Failures that reached their class's max_attempts.",
		}),
		SignIns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "airlock_signin_attempts_total", Help: "Local sign-in attempts by result: ok, refused (wrong password or unknown account), throttled (429).",
		}, []string{"result"}),
	}
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "airlock_build_info", Help: "Always 1; labels: the version stamped at build time and the Go version.",
	}, []string{"version", "goversion"})
	build.WithLabelValues(version.String(), runtime.Version()).Set(1)
	m.Registry.MustRegister(build)
	m.Registry.MustRegister(m.Approvals, m.SignIns, m.GateWait, m.Validations, m.RetryCaps)
	m.Registry.MustRegister(m.Claims, m.Alerts, m.HTTPRequests, m.HTTPDuration, m.Dispatch,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, r := range []string{"ok", "refused", "throttled"} {
		m.SignIns.WithLabelValues(r)
	}
	for _, o := range []string{"claimed", "reclaimed", "duplicate", "payload_mismatch"} {
		m.Claims.WithLabelValues(o)
	}
	// Every kind at zero from the start: a fresh server exports airlock_alerts_total, and
	// rate() or increase() over it sees the first alert.
	for _, k := range AlertKinds {
		m.Alerts.WithLabelValues(k)
	}
	return m
}

// AlertKinds are the kinds of airlock_alerts_total, each exported at zero by New. A kind
// raised but missing here still counts, from its first alert on.
var AlertKinds = []string{
	"lease_reclaims", "budget_exhausted", "validation_failed", "retry_cap", "deadline", "unknown_commit",
	"effect_unknown", "effect_failed", "reconcile_several", "approval_expired", "auto_approval_flagged",
	"input_mismatch", "agent_effect_unknown", "approval_undecidable", "approval_expiry_warning", "performed_twice",
	"failure_not_retried", "workflow_gave_up", "payload_mismatch", "run_stalled",
}

// Alerter raises an alert, which means one thing everywhere: a warn-level structured log
// line, an event on the key and airlock_alerts_total{kind}. This is the log line and
// the counter. The domain writes the event on the key in the same
// transaction as the change that raised it, and calls Alert after the commit.
type Alerter struct {
	Log     *slog.Logger
	Metrics *Metrics
}

func (a Alerter) Alert(ctx context.Context, kind, key string, attrs ...slog.Attr) {
	a.Metrics.Alerts.WithLabelValues(kind).Inc()
	args := append([]slog.Attr{slog.String("alert", kind), slog.String("key", key)}, attrs...)
	a.Log.LogAttrs(ctx, slog.LevelWarn, "alert", args...)
}

// Gauges reads state from the database at scrape time, so every instance reports the
// shared truth rather than its own share of it.
type Gauges struct {
	Effects func(ctx context.Context) (map[string]int, error)
	Enabled func(ctx context.Context) bool
	// Undecidable counts the pending approvals nobody known can decide.
	Undecidable func(ctx context.Context) (int, error)
	// Listen is this instance's LISTEN connection (nil: the store has none, as on SQLite):
	// whether it is up now and how many notifications it has received.
	Listen func() (listening bool, notifications uint64)
}

var (
	effectsDesc = prometheus.NewDesc("airlock_effects", "Effects by state, from the database.", []string{"state"}, nil)
	killDesc    = prometheus.NewDesc("airlock_kill_switch_enabled", "1 when sends are allowed globally (database and AI_ACTIONS_ENABLED), else 0.", nil, nil)
	stuckDesc   = prometheus.NewDesc("airlock_approvals_undecidable", "Pending approvals that no enabled account or recent single sign-on may decide, from the database.", nil, nil)
	listenDesc  = prometheus.NewDesc("airlock_effects_listening", "1 while this instance holds its LISTEN connection for effect wake-ups (PostgreSQL), else 0.", nil, nil)
	notifyDesc  = prometheus.NewDesc("airlock_effects_notifications_total", "NOTIFY wake-ups this instance's LISTEN connection received (PostgreSQL).", nil, nil)
)

func (g Gauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- effectsDesc
	ch <- killDesc
	ch <- stuckDesc
	ch <- listenDesc
	ch <- notifyDesc
}

func (g Gauges) Collect(ch chan<- prometheus.Metric) {
	// The LISTEN state first, as of the scrape's start: the database reads below may wait
	// (up to 2 s) while the database is away.
	if g.Listen != nil {
		up, n := g.Listen()
		l := 0.0
		if up {
			l = 1
		}
		ch <- prometheus.MustNewConstMetric(listenDesc, prometheus.GaugeValue, l)
		ch <- prometheus.MustNewConstMetric(notifyDesc, prometheus.CounterValue, float64(n))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if counts, err := g.Effects(ctx); err == nil {
		for _, s := range []string{"pending", "sending", "planned", "completed", "unknown", "failed", "cancelled"} {
			ch <- prometheus.MustNewConstMetric(effectsDesc, prometheus.GaugeValue, float64(counts[s]), s)
		}
	}
	v := 0.0
	if g.Enabled(ctx) {
		v = 1
	}
	ch <- prometheus.MustNewConstMetric(killDesc, prometheus.GaugeValue, v)
	if g.Undecidable != nil {
		if n, err := g.Undecidable(ctx); err == nil {
			ch <- prometheus.MustNewConstMetric(stuckDesc, prometheus.GaugeValue, float64(n))
		}
	}
}

// Claim, Attempt, Decision, Validation and RetryCap make Metrics the services' observer
// (runs.Observer, app.New's Base): they count the domain's countable moments after they
// commit.

// Claim counts a claim's outcome.
func (m *Metrics) Claim(outcome string) { m.Claims.WithLabelValues(outcome).Inc() }

// Attempt times one send attempt by its outcome.
func (m *Metrics) Attempt(outcome string, d time.Duration) {
	m.Dispatch.WithLabelValues(outcome).Observe(d.Seconds())
}

func (m *Metrics) Decision(mode, decision string, wait time.Duration) {
	m.Approvals.WithLabelValues(mode, decision).Inc()
	if wait > 0 {
		m.GateWait.WithLabelValues(mode).Observe(wait.Seconds())
	}
}

func (m *Metrics) Validation(result string) { m.Validations.WithLabelValues(result).Inc() }

func (m *Metrics) RetryCap() { m.RetryCaps.Inc() }

// SignIn counts a local sign-in attempt (web.Observer).
func (m *Metrics) SignIn(result string) { m.SignIns.WithLabelValues(result).Inc() }
