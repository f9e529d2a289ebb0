// Package airlocktest serves a complete airlock API in-process, over a store the caller
// opened, for the examples and tests that live outside internal/ (the client package's
// runnable examples, the example agent's restart test). It wires the services as
// `airlock serve` does (internal/app), with real clocks — leases expire in wall time —
// and no dispatcher: it is meant for agent-executed (worker) action types.
package airlocktest

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"time"

	"github.com/airlockhq/airlock/internal/apikeys"
	"github.com/airlockhq/airlock/internal/app"
	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/sqlite"
	"github.com/airlockhq/airlock/internal/tracing"
)

// AgentPolicy is the policy of the weekly-report agent (examples/agent): its three
// external effects (draft, check note, share), performed by the agent itself, with no gate.
const AgentPolicy = `
actions:
  create_internal_draft:
    connector: worker
    gate: none
  annotate_draft:
    connector: worker
    gate: none
  share_internal:
    connector: worker
    gate: none
`

// Server is a running in-process airlock.
type Server struct {
	URL    string
	APIKey string // a key with the runs scope
	Store  store.Store
	// Approvals decides approvals as a signed-in person would (Decide with the hash of the
	// approve link's token).
	Approvals *approvals.Service
	http      *httptest.Server
}

// Close stops the server; the store stays open (its opener closes it).
func (s *Server) Close() { s.http.Close() }

// OpenSQLite opens and migrates a new SQLite file in dir.
func OpenSQLite(ctx context.Context, dir string) (store.Store, error) {
	st, err := sqlite.Open(ctx, filepath.Join(dir, "airlock.db"), sqlite.Options{})
	if err != nil {
		return nil, err
	}
	if err := st.Migrate(ctx); err != nil {
		st.Close()
		return nil, err
	}
	return st, nil
}

// Start serves the API over st (migrated) with the policy given as YAML, and creates an
// API key with the runs scope. log may be nil (discarded).
func Start(ctx context.Context, st store.Store, policyYAML string, log *slog.Logger) (*Server, error) {
	return StartWith(ctx, st, policyYAML, Options{Log: log})
}

// Options tune StartWith.
type Options struct {
	Log *slog.Logger // nil: discarded
	// MaxBodyBytes is AIRLOCK_MAX_BODY_BYTES (default 1 MiB).
	MaxBodyBytes int64
	// Tracer traces the API's requests (nil: none).
	Tracer *tracing.Tracer
}

// StartWith is Start with options.
func StartWith(ctx context.Context, st store.Store, policyYAML string, o Options) (*Server, error) {
	pol, err := policy.Parse([]byte(policyYAML), func(string) (string, bool) { return "", false })
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	srv := httptest.NewUnstartedServer(nil)
	url := "http://" + srv.Listener.Addr().String()
	a, err := app.New(app.Options{Store: st, Policy: pol, PublicURL: url, Log: o.Log, MaxBodyBytes: o.MaxBodyBytes, Tracer: o.Tracer,
		Runs: runs.Config{DefaultLease: 5 * time.Minute, MaxLease: time.Hour, MaxLeaseLifetime: 24 * time.Hour, ReclaimAlertAfter: 3}})
	if err != nil {
		srv.Close()
		return nil, err
	}
	srv.Config.Handler = a.Handler
	srv.Start()
	_, key, err := apikeys.Create(ctx, st, "agent", []string{apikeys.ScopeRuns}, time.Now())
	if err != nil {
		srv.Close()
		return nil, fmt.Errorf("create API key: %w", err)
	}
	return &Server{URL: srv.URL, APIKey: key, Store: st, Approvals: a.Approvals, http: srv}, nil
}
