// Package httpapi is airlock's JSON API: one routes table, handlers that return error,
// and one place that turns errors into status codes. Handlers hold no SQL. It does not
// know the pages: internal/app mounts the two side by side (app.Mount), inside this
// package's outer middleware (API.Wrap).
package httpapi

import (
	"bytes"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/airlockhq/airlock/internal/apikeys"
	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/connector"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/failures"
	"github.com/airlockhq/airlock/internal/fleet"
	"github.com/airlockhq/airlock/internal/ledger"
	"github.com/airlockhq/airlock/internal/metrics"
	"github.com/airlockhq/airlock/internal/runs"
	"github.com/airlockhq/airlock/internal/slack"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/tracing"
	"github.com/airlockhq/airlock/internal/version"
)

//go:embed openapi.json
var openAPI []byte

// Deps are what the API serves from.
type Deps struct {
	Store        store.Store
	Runs         *runs.Service
	Effects      *effects.Service
	Failures     *failures.Service
	Approvals    *approvals.Service
	Ledger       *ledger.Service
	Audit        *audit.Service // optional: built over Store when nil
	Metrics      *metrics.Metrics
	Log          *slog.Logger
	MaxBodyBytes int64
	// APIKeys, when set, caches authenticated API keys briefly (by hash); nil looks every
	// request's key up in the store.
	APIKeys *apikeys.Cache
	Tracer  *tracing.Tracer // nil: no tracing
	// Instance names this process in the readiness table ("" : the host name and a
	// random suffix).
	Instance string
	// RequestTimeout bounds each API request's work (0: DefaultRequestTimeout): a
	// database that cannot commit — a synchronous standby gone under strict synchronous
	// mode, a lock held — is answered 503 within it, not when the client gives up.
	RequestTimeout time.Duration
	// Writers says whether this process may write (internal/fleet's Member): while its
	// Err is not nil, every request that is not a GET, HEAD or OPTIONS is answered with
	// it (503), and readiness fails. nil: always.
	Writers interface{ Err() error }
	// Slack takes decisions and links from the Slack app (nil: its routes answer
	// slack_not_configured).
	Slack *slack.Service
}

// DefaultRequestTimeout is the bound of an API request's work: inside the server's
// 60 s write timeout, so the 503 still reaches the client.
const DefaultRequestTimeout = 30 * time.Second

type server struct {
	Deps
	promHandler http.Handler
	traced      map[string]bool // the API's route patterns ("POST /v1/runs/claim")
	inflight    sync.Map        // requests with an Idempotency-Key running here (see idempotent)
	routeMu     sync.RWMutex
	routeStats  map[routeCode]*routeMetrics // see requestMetrics
	ready       readiness
	// behindLogged: the first request refused for the writer level is logged, not each.
	behindLogged sync.Once
}

type handlerFunc func(w http.ResponseWriter, r *http.Request) error

// Route is one row of the routes table; the OpenAPI test walks it.
type Route struct {
	Method, Pattern string
	Scope           string // "" for routes that need no API key
	h               func(s *server) handlerFunc
}

// Routes is the table of every route airlock serves.
var Routes = []Route{
	{"POST", "/v1/runs/claim", apikeys.ScopeRuns, func(s *server) handlerFunc { return s.claim }},
	{"GET", "/v1/runs", apikeys.ScopeRead, func(s *server) handlerFunc { return s.listRuns }},
	{"GET", "/v1/runs/{key}", apikeys.ScopeRead, func(s *server) handlerFunc { return s.getRun }},
	{"GET", "/v1/runs/{key}/events", apikeys.ScopeRead, func(s *server) handlerFunc { return s.events }},
	{"POST", "/v1/runs/{key}/heartbeat", apikeys.ScopeRuns, func(s *server) handlerFunc { return s.heartbeat }},
	{"POST", "/v1/runs/{key}/transition", apikeys.ScopeRuns, func(s *server) handlerFunc { return s.transition }},
	{"POST", "/v1/runs/{key}/validate", apikeys.ScopeRuns, func(s *server) handlerFunc { return s.validate }},
	{"POST", "/v1/runs/{key}/failures", apikeys.ScopeRuns, func(s *server) handlerFunc { return s.failure }},
	{"POST", "/v1/runs/{key}/usage", apikeys.ScopeRuns, func(s *server) handlerFunc { return s.usage }},
	{"POST", "/v1/runs/{key}/replace", apikeys.ScopeOperator, func(s *server) handlerFunc { return s.replace }},
	{"POST", "/v1/runs/{key}/unpark", apikeys.ScopeOperator, func(s *server) handlerFunc { return s.unpark }},
	{"PUT", "/v1/runs/{key}/ledger", apikeys.ScopeRuns, func(s *server) handlerFunc { return s.putLedger }},
	{"GET", "/v1/runs/{key}/ledger", apikeys.ScopeRead, func(s *server) handlerFunc { return s.getLedger }},
	{"POST", "/v1/runs/{key}/ledger/effects/{effect_id}/plan", apikeys.ScopeRuns, func(s *server) handlerFunc { return s.plan }},
	{"POST", "/v1/runs/{key}/ledger/effects/{effect_id}/confirm", apikeys.ScopeRuns, func(s *server) handlerFunc { return s.confirm }},
	{"POST", "/v1/runs/{key}/ledger/effects/{effect_id}/reconcile", apikeys.ScopeRuns, func(s *server) handlerFunc { return s.reconcile }},
	{"POST", "/v1/runs/{key}/ledger/calls", apikeys.ScopeRuns, func(s *server) handlerFunc { return s.recordCall }},
	{"GET", "/v1/runs/{key}/resume", apikeys.ScopeRead, func(s *server) handlerFunc { return s.resume }},
	{"GET", "/v1/runs/{key}/explain", apikeys.ScopeRead, func(s *server) handlerFunc { return s.explain }},
	{"GET", "/v1/ledger.schema.json", "", func(s *server) handlerFunc { return s.ledgerSchema }},
	{"GET", "/v1/whoami", apikeys.ScopeRead, func(s *server) handlerFunc { return s.whoami }},
	{"POST", "/v1/runs/{key}/effects", apikeys.ScopeRuns, func(s *server) handlerFunc { return s.queueEffect }},
	{"POST", "/v1/runs/{key}/evidence", apikeys.ScopeEvaluator, func(s *server) handlerFunc { return s.recordEvidence }},
	// Any key authenticates; the handler admits operators and runs keys holding the lease.
	{"POST", "/v1/effects/{id}/cancel", apikeys.ScopeRead, func(s *server) handlerFunc { return s.cancelEffect }},
	{"POST", "/v1/effects/claim", apikeys.ScopeWorker, func(s *server) handlerFunc { return s.effectsClaim }},
	{"POST", "/v1/effects/{id}/complete", apikeys.ScopeWorker, func(s *server) handlerFunc { return s.workerReport(connector.Sent) }},
	{"POST", "/v1/effects/{id}/fail", apikeys.ScopeWorker, func(s *server) handlerFunc { return s.workerReport(connector.Refused) }},
	{"POST", "/v1/effects/{id}/unknown", apikeys.ScopeWorker, func(s *server) handlerFunc { return s.workerReport(connector.Ambiguous) }},
	{"POST", "/v1/effects/{id}/resolve", apikeys.ScopeOperator, func(s *server) handlerFunc { return s.resolveEffect }},
	{"GET", "/v1/approvals", apikeys.ScopeOperator, func(s *server) handlerFunc { return s.listApprovals }},
	{"POST", "/v1/approvals/{id}/reissue", apikeys.ScopeOperator, func(s *server) handlerFunc { return s.reissueApproval }},
	{"GET", "/v1/reviews", apikeys.ScopeOperator, func(s *server) handlerFunc { return s.reviews }},
	{"POST", "/v1/reviews/{id}", apikeys.ScopeOperator, func(s *server) handlerFunc { return s.review }},
	{"GET", "/v1/admin/kill-switch", apikeys.ScopeRead, func(s *server) handlerFunc { return s.getKillSwitch }},
	{"PUT", "/v1/admin/kill-switch", apikeys.ScopeAdmin, func(s *server) handlerFunc { return s.putKillSwitch }},
	{"POST", "/integrations/slack/actions", "", func(s *server) handlerFunc { return s.slackActions }},
	{"POST", "/integrations/slack/commands", "", func(s *server) handlerFunc { return s.slackCommands }},
	{"GET", "/healthz", "", func(s *server) handlerFunc { return s.healthz }},
	{"GET", "/readyz", "", func(s *server) handlerFunc { return s.readyz }},
	{"GET", "/metrics", "", func(s *server) handlerFunc { return s.metrics }},
	{"GET", "/openapi.json", "", func(s *server) handlerFunc { return s.openapi }},
}

// API is the JSON API: its routes (Register) and the middleware every request to the
// server passes, the pages' included (Wrap). internal/app mounts it and the pages side by
// side on one mux.
type API struct{ s *server }

// New returns the API over d.
func New(d Deps) *API {
	// A missing part would surface as a 500 on its first request; fail at start instead.
	if d.Store == nil || d.Runs == nil || d.Effects == nil || d.Failures == nil || d.Approvals == nil || d.Ledger == nil || d.Metrics == nil || d.Log == nil || d.MaxBodyBytes <= 0 {
		panic("httpapi.New: every dependency is required")
	}
	if d.Instance == "" {
		d.Instance = InstanceName()
	}
	if d.RequestTimeout <= 0 {
		d.RequestTimeout = DefaultRequestTimeout
	}
	s := &server{Deps: d, promHandler: promhttp.HandlerFor(d.Metrics.Registry, promhttp.HandlerOpts{}), traced: map[string]bool{}}
	for _, rt := range Routes {
		s.traced[rt.Method+" "+rt.Pattern] = true
	}
	return &API{s: s}
}

// Register adds the routes table to mux, each route behind its own checks: text rules,
// the API key and its scope, Idempotency-Key replay, the body limit and the request
// timeout.
func (a *API) Register(mux *http.ServeMux) {
	s := a.s
	for _, rt := range Routes {
		h := rt.h(s)
		if rt.Scope != "" && rt.Method != http.MethodGet && strings.HasPrefix(rt.Pattern, "/v1/") {
			h = s.idempotent(rt.Method+" "+rt.Pattern, h)
		}
		if rt.Scope != "" {
			h = s.authenticated(rt.Scope, h)
		}
		h = textChecked(rt.Pattern, h)
		mux.Handle(rt.Method+" "+rt.Pattern, s.handle(h))
	}
}

// Wrap serves mux — the API's routes and whatever is mounted beside them — inside the
// middleware every request passes: a request id and nosniff on every answer, tracing of
// the API's own routes (decided by the pattern mux picks), the access log and metrics by
// route pattern, panic recovery, the writer gate (Deps.Writers), and the API's JSON 404
// and 405 for paths and methods mux does not serve.
func (a *API) Wrap(mux *http.ServeMux) http.Handler {
	s := a.s
	return s.observe(mux, s.writerGate(s.jsonFallback(mux)))
}

// Handler is the API alone on a mux of its own, wrapped (Register, then Wrap).
func (a *API) Handler() http.Handler {
	mux := http.NewServeMux()
	a.Register(mux)
	return a.Wrap(mux)
}

// writerGate refuses requests that may write while the process may not (Deps.Writers):
// a binary whose writer level is below the database's answers 503 writer_level_behind;
// reads go on.
func (s *server) writerGate(next http.Handler) http.Handler {
	if s.Writers == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions:
		default:
			if err := s.Writers.Err(); err != nil {
				if errors.Is(err, fleet.ErrLevelBehind) {
					s.behindLogged.Do(func() {
						s.Log.Error("refusing writes: this binary's writer level is below the database's", "err", err)
					})
				}
				s.render(w, r, err)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// requestInfo is what the middleware learns of a request, in one context value: observe
// puts it there with the request id, and authenticated fills in the API key, so a
// request makes one context and one shallow copy of itself instead of one per value.
type requestInfo struct {
	id string
	// Set by authenticated before the handler runs, and not changed after.
	key    store.APIKey
	rawKey string // seals the key's replayable answers (see idempotent); never logged
}

type requestInfoKey struct{}

func infoOf(ctx context.Context) *requestInfo {
	info, _ := ctx.Value(requestInfoKey{}).(*requestInfo)
	return info
}

// principal is the API key that made the request.
func principal(ctx context.Context) store.APIKey {
	if info := infoOf(ctx); info != nil {
		return info.key
	}
	return store.APIKey{}
}

func actor(r *http.Request) string { return "apikey:" + principal(r.Context()).Name }

func (s *server) authenticated(scope string, next handlerFunc) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		raw, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || raw == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="airlock"`)
			return apiError(http.StatusUnauthorized, "unauthenticated", "send an API key as Authorization: Bearer <key>")
		}
		key, err := s.APIKeys.Authenticate(r.Context(), s.Store, strings.TrimSpace(raw))
		if errors.Is(err, apikeys.ErrInvalid) || errors.Is(err, apikeys.ErrRevoked) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="airlock", error="invalid_token"`)
			return apiError(http.StatusUnauthorized, "unauthenticated", "the API key is unknown or revoked")
		}
		if err != nil {
			return err
		}
		if !apikeys.Allows(key.Scopes, scope) {
			return apiError(http.StatusForbidden, "forbidden", "this API key lacks the "+scope+" scope")
		}
		info := infoOf(r.Context())
		if info == nil { // not through observe (every server is): a context of its own
			info = &requestInfo{}
			r = r.WithContext(context.WithValue(r.Context(), requestInfoKey{}, info))
		}
		info.key, info.rawKey = key, strings.TrimSpace(raw)
		return next(w, r)
	}
}

// handle renders a handler's error: one place for every route.
func (s *server) handle(h handlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil {
			r.Body = http.MaxBytesReader(w, r.Body, s.MaxBodyBytes)
		}
		ctx, cancel := context.WithTimeout(r.Context(), s.RequestTimeout)
		defer cancel()
		if err := h(w, r.WithContext(ctx)); err != nil {
			s.render(w, r, err)
		}
	})
}

// render answers a handler's error.
func (s *server) render(w http.ResponseWriter, r *http.Request, err error) {
	ae, known := toAPIError(err)
	switch {
	case !known:
		s.Log.ErrorContext(r.Context(), "request failed", "route", r.Pattern, "request_id", requestID(r.Context()), "err", err)
	case errors.Is(err, store.ErrUnavailable):
		s.Log.WarnContext(r.Context(), "request failed: the database is unavailable", "route", r.Pattern, "request_id", requestID(r.Context()), "err", err)
	}
	if ae.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(ae.RetryAfter))
	}
	writeJSON(w, ae.Status, ae)
}

func requestID(ctx context.Context) string {
	if info := infoOf(ctx); info != nil {
		return info.id
	}
	return ""
}

// statusWriter remembers the status for the access log and metrics.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// observe logs and counts each request by its route pattern — never its path, which can
// hold a key or, on approval pages, a token.
func (s *server) observe(mux *http.ServeMux, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		var b [8]byte
		_, _ = rand.Read(b[:])
		var x [16]byte
		hex.Encode(x[:], b[:])
		info := &requestInfo{id: string(x[:])}
		id := info.id
		h := w.Header()
		h["X-Request-Id"] = []string{id}
		// Every answer is JSON, text or a page with its declared type: never sniffed.
		h["X-Content-Type-Options"] = headerNosniff
		r = r.WithContext(context.WithValue(r.Context(), requestInfoKey{}, info))
		sw := &statusWriter{ResponseWriter: w}
		// Traced or not is decided by the route the mux picks for this request — only
		// the API's own patterns — never by the raw path; a page, a redirect to a cleaned
		// path and an unmatched path are not traced.
		end := func(int) {}
		if s.Tracer != nil {
			if _, pattern := mux.Handler(r); s.traced[pattern] {
				var ctx context.Context
				ctx, end = s.Tracer.Start(r, pattern)
				r = r.WithContext(ctx)
			}
		}
		defer func() {
			if p := recover(); p != nil {
				s.Log.Error("panic serving request", "route", r.Pattern, "request_id", id, "panic", p)
				if sw.status == 0 {
					writeJSON(sw, http.StatusInternalServerError, apiError(500, "internal", "internal error"))
				}
			}
			route := r.Pattern
			if route == "" {
				route = "unmatched"
			}
			code := sw.status
			if code == 0 {
				code = http.StatusOK
			}
			end(code)
			s.requestMetrics(route, code).observe(time.Since(start))
			// The access log is at info: below that level (AIRLOCK_LOG_LEVEL=warn, as the
			// benchmarks run) its attributes are not built at all.
			if !s.Log.Enabled(r.Context(), slog.LevelInfo) {
				return
			}
			attrs := []any{"method", r.Method, "route", route, "status", code,
				"duration_ms", float64(time.Since(start).Microseconds()) / 1000, "request_id", id}
			if k := r.PathValue("key"); k != "" {
				attrs = append(attrs, "key", k) // keys are not secrets; tokens never sit in a {key}
			}
			s.Log.Info("http", attrs...)
		}()
		next.ServeHTTP(sw, r)
	})
}

// routeMetrics are the HTTP metrics' children of one route and status.
type routeMetrics struct {
	requests prometheus.Counter
	duration prometheus.Observer
}

type routeCode struct {
	route string
	code  int
}

// requestMetrics looks a route's and status's metric children up once: the vectors'
// WithLabelValues hashes its labels under a lock on every call, and the status was
// formatted for it. Routes are the mux's patterns and "unmatched", so the map is bounded.
func (s *server) requestMetrics(route string, code int) *routeMetrics {
	k := routeCode{route, code}
	s.routeMu.RLock()
	m := s.routeStats[k]
	s.routeMu.RUnlock()
	if m != nil {
		return m
	}
	s.routeMu.Lock()
	defer s.routeMu.Unlock()
	if m = s.routeStats[k]; m == nil {
		if s.routeStats == nil {
			s.routeStats = map[routeCode]*routeMetrics{}
		}
		m = &routeMetrics{requests: s.Metrics.HTTPRequests.WithLabelValues(route, strconv.Itoa(code)),
			duration: s.Metrics.HTTPDuration.WithLabelValues(route)}
		s.routeStats[k] = m
	}
	return m
}

func (m *routeMetrics) observe(d time.Duration) {
	m.requests.Inc()
	m.duration.Observe(d.Seconds())
}

// jsonFallback answers unmatched paths and methods in the API's JSON error format; the
// mux's own replies are plain text.
func (s *server) jsonFallback(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pattern := mux.Handler(r); pattern != "" {
			mux.ServeHTTP(w, r)
			return
		}
		probe := &probeWriter{header: http.Header{}}
		mux.ServeHTTP(probe, r)
		if probe.status == http.StatusMethodNotAllowed {
			w.Header().Set("Allow", probe.header.Get("Allow"))
			writeJSON(w, http.StatusMethodNotAllowed, apiError(http.StatusMethodNotAllowed, "method_not_allowed", r.Method+" is not allowed here"))
			return
		}
		writeJSON(w, http.StatusNotFound, apiError(http.StatusNotFound, "not_found", "no such route"))
	})
}

// probeWriter captures what the mux would answer without sending it.
type probeWriter struct {
	header http.Header
	status int
}

func (p *probeWriter) Header() http.Header         { return p.header }
func (p *probeWriter) Write(b []byte) (int, error) { return len(b), nil }
func (p *probeWriter) WriteHeader(code int)        { p.status = code }

func (s *server) healthz(w http.ResponseWriter, r *http.Request) error {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	return nil
}

// readyz answers readiness (readiness.go); healthz, liveness, never asks the store: a
// database outage must not make an orchestrator restart every instance.
func (s *server) readyz(w http.ResponseWriter, r *http.Request) error {
	if nr := s.ready.get(r.Context(), s.checkReady, s.Log); nr != nil {
		w.Header().Set("Retry-After", strconv.Itoa(storeRetryAfter))
		writeJSON(w, http.StatusServiceUnavailable, nr)
		return nil
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready", "backend": s.Store.Backend()})
	return nil
}

func (s *server) metrics(w http.ResponseWriter, r *http.Request) error {
	s.promHandler.ServeHTTP(w, r)
	return nil
}

func (s *server) openapi(w http.ResponseWriter, r *http.Request) error {
	w.Header().Set("Content-Type", "application/json")
	_, err := w.Write(servedOpenAPI())
	return err
}

// servedOpenAPI is openapi.json with info.version set to this build's version.
var servedOpenAPI = sync.OnceValue(func() []byte {
	v, _ := json.Marshal(version.String())
	return bytes.Replace(openAPI, []byte(`"version": "0.1.0"`), append([]byte(`"version": `), v...), 1)
})
