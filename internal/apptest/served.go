package apptest

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/airlockhq/airlock/internal/apikeys"
	"github.com/airlockhq/airlock/internal/app"
	"github.com/airlockhq/airlock/internal/httpapi"
	"github.com/airlockhq/airlock/internal/metrics"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/store/storetest"
	"github.com/airlockhq/airlock/internal/web"
)

// Served is airlock's whole graph, built once by app.New over a fresh EffectsEnv and
// served over real HTTP as `airlock serve` serves it: the API and the pages side by side
// (app.Mount), logging into Logs, with one API key per scope. The tests of
// internal/httpapi and internal/web build their harnesses on it.
type Served struct {
	Env     *EffectsEnv // its services are the graph's: a test drives them as a second caller would
	URL     string
	Logs    *SyncBuffer  // the graph's log: JSON, debug and up
	Log     *slog.Logger // writes to Logs
	Metrics *metrics.Metrics
	// API keys: RunsKey (n8n, runs), ReadKey (dashboard, read), AdminKey (ops, admin),
	// WorkerKey (worker), OperatorKey (oncall, operator), RevokedKey (old, runs; revoked).
	RunsKey, ReadKey, AdminKey, WorkerKey, OperatorKey, RevokedKey string
}

// Serve builds and serves the graph; setup, when not nil, may change the options it is
// built from (another policy, other connectors, other lease bounds); pageOpts, given the
// server's URL, configure the pages (single sign-on).
func Serve(t testing.TB, b storetest.Backend, setup func(env *EffectsEnv, o *app.Options), pageOpts ...func(publicURL string) web.Option) *Served {
	t.Helper()
	s := &Served{Logs: &SyncBuffer{}, Metrics: metrics.New()}
	s.Log = slog.New(slog.NewJSONHandler(s.Logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv := httptest.NewUnstartedServer(nil)
	t.Cleanup(srv.Close)
	url := "http://" + srv.Listener.Addr().String()
	var webOpts []web.Option
	for _, o := range pageOpts {
		webOpts = append(webOpts, o(url))
	}
	s.Env = NewEffectsEnvWith(t, b, "", func(env *EffectsEnv, o *app.Options) {
		env.Alerts.Next = metrics.Alerter{Log: s.Log, Metrics: s.Metrics}
		o.PublicURL, o.Log, o.Metrics, o.Web, o.MaxBodyBytes = url, s.Log, s.Metrics, webOpts, 4096
		if setup != nil {
			setup(env, o)
		}
	})
	srv.Config.Handler = s.Env.App.Handler
	srv.Start()
	s.URL = srv.URL
	mk := func(name string, scopes ...string) string {
		_, raw, err := apikeys.Create(ctx, s.Env.Store, name, scopes, s.Env.Clock.Now())
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	s.RunsKey, s.ReadKey, s.AdminKey = mk("n8n", "runs"), mk("dashboard", "read"), mk("ops", "admin")
	s.WorkerKey, s.OperatorKey = mk("worker", "worker"), mk("oncall", "operator")
	s.RevokedKey = mk("old", "runs")
	keys, _ := s.Env.Store.APIKeyList(ctx)
	for _, k := range keys {
		if k.Name == "old" {
			if err := s.Env.Store.APIKeyRevoke(ctx, k.ID, s.Env.Clock.Now()); err != nil {
				t.Fatal(err)
			}
		}
	}
	return s
}

// Handler is a second instance over the same database, unserved: its own pages and
// metrics, and whatever mod changes; it shares nothing in memory with the first.
func (s *Served) Handler(mod func(d *httpapi.Deps)) http.Handler {
	d := s.Env.App.Deps
	d.Metrics = metrics.New()
	pages := web.New(s.Env.Store, s.Env.Approvals, s.Log, s.URL, s.Env.Clock.Now, web.WithObserver(d.Metrics))
	if mod != nil {
		mod(&d)
	}
	return app.Mount(d, pages)
}

// Another serves Handler(mod) and returns its URL.
func (s *Served) Another(t testing.TB, mod func(d *httpapi.Deps)) string {
	srv := httptest.NewServer(s.Handler(mod))
	t.Cleanup(srv.Close)
	return srv.URL
}

// SyncBuffer collects log output from concurrent handlers.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// SMTPActions is a Serve setup that adds mail actions sending through a real SMTP server,
// started into *ms: mail_now (no gate), mail (approved by support-lead) and mail_fixed
// (one named target, alice).
func SMTPActions(t testing.TB, ms **MailServer) func(env *EffectsEnv, o *app.Options) {
	return func(env *EffectsEnv, o *app.Options) {
		*ms = NewMailServer(t)
		smtp := fmt.Sprintf(`{host: 127.0.0.1, port: %d, from: support@example.com, tls: none, timeout: 5s}`, (*ms).Port)
		yaml := strings.Replace(PolicyYAML(env.Provider.URL), "actions:\n", "actions:\n"+
			"  mail_now: {connector: smtp, gate: none, smtp: "+smtp+"}\n"+
			"  mail: {connector: smtp, smtp: "+smtp+", approvers: {roles: [support-lead]}}\n"+
			"  mail_fixed:\n    connector: smtp\n    approvers: {roles: [support-lead]}\n    smtp: {host: 127.0.0.1, port: "+fmt.Sprint((*ms).Port)+
			", from: support@example.com, tls: none, timeout: 5s, targets: {alice: \"Alice <alice@example.com>\"}}\n", 1)
		pol, err := policy.Parse([]byte(yaml), func(string) (string, bool) { return "", false })
		if err != nil {
			t.Fatal(err)
		}
		conns, err := app.Connectors(pol)
		if err != nil {
			t.Fatal(err)
		}
		o.Policy, o.Connectors = pol, conns
	}
}
