// Package app builds airlock's service graph over one store: runs, failures, the outbox,
// approvals, the ledger, the pages and the API handler, with every callback between them
// and every metric wired. `airlock serve` and the tests that serve the API in-process
// build it here, so they cannot wire it differently.
//
// It sits above every domain package, httpapi and web, and is the one place that mounts
// the API and the pages side by side (routes.go); nothing below it imports it (the
// domain packages' tests build it through internal/apptest, from external test packages).
package app

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/airlockhq/airlock/internal/alerts"
	"github.com/airlockhq/airlock/internal/apikeys"
	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/connector"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/failures"
	"github.com/airlockhq/airlock/internal/httpapi"
	"github.com/airlockhq/airlock/internal/ledger"
	"github.com/airlockhq/airlock/internal/metrics"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/slack"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/tracing"
	"github.com/airlockhq/airlock/internal/web"
)

// Options are what the graph is built from. Store and Policy are required; the rest have
// the defaults their comments give.
type Options struct {
	Store  store.Store
	Policy *policy.Policy
	// Connectors send the action types airlock performs itself; nil: built from the
	// policy (Connectors).
	Connectors map[string]connector.Connector
	Runs       runs.Config // lease bounds (AIRLOCK_LEASE_*)
	// PublicURL is where approval links and the sign-in redirect point.
	PublicURL string
	// Now is every service's clock; nil: each reads the database's (or the process's).
	Now     func() time.Time
	Log     *slog.Logger     // nil: discarded
	Metrics *metrics.Metrics // nil: a new registry
	// Alerts receives the alerts the relay raises from their committed events (at least
	// once each, with event_id); nil: logged and counted (metrics.Alerter).
	Alerts runs.Alerter
	// AIActionsEnabled is the AI_ACTIONS_ENABLED environment variable, if Set: unset or
	// "true" lets the database's kill switch decide; anything else stops every send.
	AIActionsEnabled    string
	AIActionsEnabledSet bool
	// Web configures the pages (single sign-on); the metrics observer is always added.
	Web []web.Option
	// MaxBodyBytes is AIRLOCK_MAX_BODY_BYTES; 0: 1 MiB.
	MaxBodyBytes int64
	// RequestTimeout bounds an API request's work (0: httpapi.DefaultRequestTimeout).
	RequestTimeout time.Duration
	APIKeys        *apikeys.Cache  // nil: every request's key is looked up in the store
	Tracer         *tracing.Tracer // nil: no tracing
	Instance       string          // "": httpapi.InstanceName()
	// Writers says whether this process may write (internal/fleet); nil: always.
	Writers interface{ Err() error }
	// Checkpoints is the audit checkpoint writer (AIRLOCK_AUDIT_CHECKPOINT_DIR), woken by
	// every approval decision once it committed; nil: none. The caller runs it
	// (Checkpointer.Serve).
	Checkpoints *audit.Checkpointer
}

// App is the wired graph.
type App struct {
	Runs      *runs.Service
	Failures  *failures.Service
	Effects   *effects.Service
	Approvals *approvals.Service
	Ledger    *ledger.Service
	Web       *web.Web
	Metrics   *metrics.Metrics
	// Alerts raises the alert outbox's rows through Options.Alerts: the services wake it
	// after committing an alert; whoever runs the services' loops also runs its poll
	// (Alerts.Run), which raises the alerts other processes committed.
	Alerts *alerts.Relay
	// Slack takes decisions and links from the Slack app (policy slack section).
	Slack *slack.Service
	// Deps are what Handler's API serves; a test builds a second instance from a copy
	// (Mount).
	Deps httpapi.Deps
	// Handler serves the API and the pages side by side (Mount).
	Handler http.Handler
}

// New builds the graph: an approval settles and wakes the outbox, budgets come from the
// failure policy, and claims, sends, decisions, failures and the outbox's gauges are
// counted in Metrics.
func New(o Options) (*App, error) {
	if o.Store == nil || o.Policy == nil {
		return nil, fmt.Errorf("app: Store and Policy are required")
	}
	if o.Connectors == nil {
		conns, err := Connectors(o.Policy)
		if err != nil {
			return nil, err
		}
		o.Connectors = conns
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Metrics == nil {
		o.Metrics = metrics.New()
	}
	if o.Alerts == nil {
		o.Alerts = metrics.Alerter{Log: o.Log, Metrics: o.Metrics}
	}
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = 1 << 20
	}
	a, err := services(o)
	if err != nil {
		return nil, err
	}
	st, m := o.Store, o.Metrics
	m.Registry.MustRegister(gauges(st, a.Effects, runs.Clock{Now: o.Now}))
	a.Web = web.New(st, a.Approvals, o.Log, o.PublicURL, o.Now, append(o.Web, web.WithObserver(m))...)
	a.Deps = httpapi.Deps{Slack: a.Slack, Store: st, Runs: a.Runs, Effects: a.Effects, Failures: a.Failures, Approvals: a.Approvals,
		Ledger: a.Ledger, Metrics: m, Log: o.Log, MaxBodyBytes: o.MaxBodyBytes,
		APIKeys: o.APIKeys, Tracer: o.Tracer, Instance: o.Instance, RequestTimeout: o.RequestTimeout, Writers: o.Writers}
	a.Handler = Mount(a.Deps, a.Web)
	return a, nil
}

// services builds the domain services, each once, over one runs.Base (store, policy,
// clock, alert relay, log, metrics), in dependency order: the outbox's funnel before
// approvals (a decision queues through it), approvals before the outbox service and the
// ledger (the gates ask a person through it). Nothing is set on a service after.
func services(o Options) (*App, error) {
	relay, err := alerts.New(runs.Base{Store: o.Store, Log: o.Log}, alerts.Config{Alerter: o.Alerts})
	if err != nil {
		return nil, err
	}
	base := runs.Base{Store: o.Store, Policy: o.Policy, Clock: runs.Clock{Now: o.Now}, Alerts: relay, Log: o.Log, Observer: o.Metrics}
	a := &App{Metrics: o.Metrics, Alerts: relay}
	if a.Runs, err = runs.New(base, o.Runs); err != nil {
		return nil, err
	}
	if a.Failures, err = failures.New(base); err != nil {
		return nil, err
	}
	outbox, err := effects.NewOutbox(base)
	if err != nil {
		return nil, err
	}
	var decided func()
	if o.Checkpoints != nil {
		decided = o.Checkpoints.Wake
	}
	a.Approvals, err = approvals.New(base, approvals.Config{Outbox: outbox, PublicURL: o.PublicURL, Decided: decided})
	if err != nil {
		return nil, err
	}
	a.Effects, err = effects.New(base, effects.Config{Outbox: outbox, Approvals: a.Approvals, Connectors: o.Connectors,
		AIActionsEnabled: o.AIActionsEnabled, AIActionsEnabledSet: o.AIActionsEnabledSet})
	if err != nil {
		return nil, err
	}
	if a.Ledger, err = ledger.New(base, ledger.Config{Effects: a.Effects, Approvals: a.Approvals}); err != nil {
		return nil, err
	}
	if a.Slack, err = slack.New(base, slack.Config{Approvals: a.Approvals}); err != nil {
		return nil, err
	}
	return a, nil
}

// gauges reads the outbox's state counts, the kill switch and the approvals nobody can
// decide (on airlock's clock: the database's, or a test's) when metrics are scraped, and
// the LISTEN connection's state where the store has one.
func gauges(st store.Store, eff *effects.Service, clock runs.Clock) metrics.Gauges {
	g := metrics.Gauges{
		Effects: func(ctx context.Context) (map[string]int, error) {
			counts, err := st.EffectCountByState(ctx)
			out := map[string]int{}
			for s, n := range counts {
				out[string(s)] = n
			}
			return out, err
		},
		Enabled:     func(ctx context.Context) bool { ok, _ := eff.Enabled(ctx, ""); return ok },
		Undecidable: func(ctx context.Context) (int, error) { return st.ApprovalsUndecidableCount(ctx, clock.At()) },
	}
	if l, ok := st.(store.ListenReporter); ok {
		g.Listen = l.ListenState
	}
	return g
}

// Connectors builds one connector per action type that airlock sends itself, each from
// its connector kind's section (worker types are performed outside airlock and get none).
func Connectors(p *policy.Policy) (map[string]connector.Connector, error) {
	out := map[string]connector.Connector{}
	for _, name := range p.ActionNames() {
		c, err := p.Action(name).NewConnector()
		if err != nil {
			return nil, fmt.Errorf("policy: actions.%s: %w", name, err)
		}
		if c != nil {
			out[name] = c
		}
	}
	return out, nil
}
