package httpapi_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/app"
	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/httpapi"
	"github.com/airlockhq/airlock/internal/metrics"
	"github.com/airlockhq/airlock/internal/store/storetest"
	"github.com/airlockhq/airlock/internal/web"
	dto "github.com/prometheus/client_model/go"
)

// syncBuffer collects log output from concurrent handlers.
type syncBuffer = apptest.SyncBuffer

type harness struct {
	t                   testing.TB
	env                 *apptest.EffectsEnv
	url                 string
	runsKey, readKey    string
	revokedKey, adminKy string
	workerKey           string
	operatorKey         string
	logs                *syncBuffer
	log                 *slog.Logger // the serving graph's logger (writes to logs)
	metrics             *metrics.Metrics
	another             func(mod func(d *httpapi.Deps)) string
	handler             func(mod func(d *httpapi.Deps)) http.Handler // another instance, unserved
	deps                httpapi.Deps
}

// newHarness serves the API and the pages as `airlock serve` does (apptest.Serve: one
// app.New); the pages' own tests are internal/web's.
func newHarness(t testing.TB, b storetest.Backend) *harness {
	t.Helper()
	return newHarnessWith(t, b, nil)
}

// newHarnessWith is newHarness with setup applied first: it may change the options the
// graph is built from (another policy, other connectors, other lease bounds).
func newHarnessWith(t testing.TB, b storetest.Backend, setup func(env *apptest.EffectsEnv, o *app.Options)) *harness {
	t.Helper()
	s := apptest.Serve(t, b, setup)
	return &harness{t: t, env: s.Env, url: s.URL, logs: s.Logs, log: s.Log, metrics: s.Metrics, deps: s.Env.App.Deps,
		runsKey: s.RunsKey, readKey: s.ReadKey, adminKy: s.AdminKey, workerKey: s.WorkerKey, operatorKey: s.OperatorKey,
		revokedKey: s.RevokedKey, handler: s.Handler, another: func(mod func(d *httpapi.Deps)) string { return s.Another(t, mod) }}
}

type response struct {
	status int
	body   map[string]any
	raw    string
	header http.Header
}

func (h *harness) do(method, path, key, contentType, body string) response {
	h.t.Helper()
	return h.doAt(h.url, method, path, key, contentType, body)
}

// doAt is do against another server (one that h.another started).
func (h *harness) doAt(base, method, path, key, contentType, body string) response {
	h.t.Helper()
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	// AIRLOCK_TEST_IDEMPOTENCY_KEYS=1 runs every test with an Idempotency-Key on each
	// mutating request: each route then runs inside store.Within.
	if os.Getenv("AIRLOCK_TEST_IDEMPOTENCY_KEYS") != "" && method != "GET" && key != "" {
		req.Header.Set("Idempotency-Key", fmt.Sprintf("every-%d", time.Now().UnixNano()))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	checkLive(h.t, req, resp, raw)
	r := response{status: resp.StatusCode, raw: string(raw), header: resp.Header}
	_ = json.Unmarshal(raw, &r.body)
	return r
}

func (h *harness) post(path, body string) response {
	h.t.Helper()
	return h.do("POST", path, h.runsKey, "application/json", body)
}

func (h *harness) get(path string) response {
	h.t.Helper()
	return h.do("GET", path, h.runsKey, "", "")
}

func (h *harness) claim(key string) (owner string, version int64) {
	h.t.Helper()
	r := h.post("/v1/runs/claim", `{"key":"`+key+`","payload":{"ticket":42}}`)
	if r.status != 201 {
		h.t.Fatalf("claim %s: %d %s", key, r.status, r.raw)
	}
	return r.body["lease_owner"].(string), int64(r.body["version"].(float64))
}

func expect(t testing.TB, r response, status int, code string) {
	t.Helper()
	if r.status != status || (code != "" && r.body["error"] != code) {
		t.Fatalf("got %d %s; want %d %s", r.status, strings.TrimSpace(r.raw), status, code)
	}
	if code != "" {
		if msg, _ := r.body["message"].(string); msg == "" {
			t.Fatalf("error %s has no message", code)
		}
	}
}

func forEachBackend(t *testing.T, fn func(t *testing.T, h *harness)) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			fn(t, newHarness(t, b))
		})
	}
}

func TestClaimFlow(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		// Key order and whitespace do not change the hash (RFC 8785).
		r := h.post("/v1/runs/claim", `{"key":"ticket-42","payload":{"b":[1,2],"a":"x"},"trigger_source":"helpdesk","meta":{"workflow_version":"wf-7"}}`)
		expect(t, r, 201, "")
		owner, v := r.body["lease_owner"].(string), int64(r.body["version"].(float64))
		if r.body["claimed"] != true || r.body["state"] != "processing" || v != 1 || owner == "" || r.body["lease_expires_at"] == nil {
			t.Fatalf("claim: %s", r.raw)
		}
		dup := h.post("/v1/runs/claim", `{"key":"ticket-42","payload":{ "a":"x", "b":[1,2] }}`)
		expect(t, dup, 200, "")
		if dup.body["claimed"] != false || dup.body["lease_owner"] != nil || dup.body["payload_hash"] != r.body["payload_hash"] {
			t.Fatalf("duplicate: %s", dup.raw)
		}
		// A client-supplied hash is used as is.
		expect(t, h.post("/v1/runs/claim", `{"key":"ticket-42","payload_hash":"`+r.body["payload_hash"].(string)+`"}`), 200, "")
		expect(t, h.post("/v1/runs/claim", `{"key":"ticket-42","payload":{"a":"y"}}`), 409, "payload_mismatch")

		hb := h.post("/v1/runs/ticket-42/heartbeat", `{"lease_owner":"`+owner+`","version":1,"lease_seconds":600}`)
		expect(t, hb, 200, "")
		if hb.body["version"].(float64) != 1 {
			t.Fatalf("heartbeat moved the version: %s", hb.raw)
		}
		tr := h.post("/v1/runs/ticket-42/transition", `{"lease_owner":"`+owner+`","version":1,"to":"completed","result":{"reply_id":"r-1"},"meta":{"model":{"provider":"local","name":"qwen2.5","revision":"q4"}}}`)
		expect(t, tr, 200, "")
		if tr.body["state"] != "completed" || tr.body["version"].(float64) != 2 {
			t.Fatalf("transition: %s", tr.raw)
		}
		again := h.post("/v1/runs/claim", `{"key":"ticket-42","payload":{"a":"x","b":[1,2]}}`)
		expect(t, again, 200, "")
		if again.body["state"] != "completed" || again.body["result"].(map[string]any)["reply_id"] != "r-1" {
			t.Fatalf("claim of a completed key: %s", again.raw)
		}

		run := h.do("GET", "/v1/runs/ticket-42", h.readKey, "", "")
		expect(t, run, 200, "")
		if run.body["duplicates"].(float64) != 3 || run.body["trigger_source"] != "helpdesk" || run.body["lease_owner"] != nil {
			t.Fatalf("run: %s", run.raw)
		}
		if strings.Contains(run.raw, owner) {
			t.Fatal("GET shows the lease owner, the capability to move the run")
		}
		evs := h.get("/v1/runs/ticket-42/events")
		expect(t, evs, 200, "")
		var got []string
		for _, e := range evs.body["events"].([]any) {
			got = append(got, e.(map[string]any)["kind"].(string))
		}
		want := []string{"claimed", "duplicate", "duplicate", "payload_mismatch", "alert", "heartbeat", "transition", "duplicate"}
		if !slices.Equal(got, want) {
			t.Fatalf("events = %v, want %v", got, want)
		}
		page := h.get("/v1/runs/ticket-42/events?limit=2")
		if len(page.body["events"].([]any)) != 2 || page.body["next_after"] == nil {
			t.Fatalf("paged events: %s", page.raw)
		}
	})
}

// TestErrors walks every error code and checks that a refused request wrote nothing.
func TestErrors(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		owner, _ := h.claim("k1")
		big := `{"key":"k2","payload":"` + strings.Repeat("x", 5000) + `"}`
		cases := []struct {
			name, method, path, key, ctype, body string
			status                               int
			code                                 string
		}{
			{"malformed json", "POST", "/v1/runs/claim", h.runsKey, "application/json", `{"key":`, 400, "malformed_json"},
			{"empty body", "POST", "/v1/runs/claim", h.runsKey, "application/json", ``, 400, "malformed_json"},
			{"trailing data", "POST", "/v1/runs/claim", h.runsKey, "application/json", `{"key":"k2","payload":1} {}`, 400, "malformed_json"},
			{"not an object", "POST", "/v1/runs/claim", h.runsKey, "application/json", `[1]`, 400, "wrong_type"},
			{"wrong type", "POST", "/v1/runs/claim", h.runsKey, "application/json", `{"key":42,"payload":1}`, 400, "wrong_type"},
			{"wrong nested type", "POST", "/v1/runs/claim", h.runsKey, "application/json", `{"key":"k2","payload":1,"meta":{"model":{"name":7}}}`, 400, "wrong_type"},
			{"unknown field", "POST", "/v1/runs/claim", h.runsKey, "application/json", `{"key":"k2","payload":1,"lease_ownr":"x"}`, 400, "unknown_field"},
			{"unknown meta field", "POST", "/v1/runs/claim", h.runsKey, "application/json", `{"key":"k2","payload":1,"meta":{"secret":"x"}}`, 400, "unknown_field"},
			{"missing key", "POST", "/v1/runs/claim", h.runsKey, "application/json", `{"payload":1}`, 400, "missing_field"},
			{"missing payload", "POST", "/v1/runs/claim", h.runsKey, "application/json", `{"key":"k2"}`, 400, "missing_field"},
			{"null payload", "POST", "/v1/runs/claim", h.runsKey, "application/json", `{"key":"k2","payload":null}`, 400, "missing_field"},
			{"both payloads", "POST", "/v1/runs/claim", h.runsKey, "application/json", `{"key":"k2","payload":1,"payload_hash":"abc"}`, 400, "invalid_field"},
			{"bad key charset", "POST", "/v1/runs/claim", h.runsKey, "application/json", `{"key":"a b","payload":1}`, 400, "invalid_field"},
			{"key too long", "POST", "/v1/runs/claim", h.runsKey, "application/json", `{"key":"` + strings.Repeat("k", 201) + `","payload":1}`, 400, "invalid_field"},
			{"lease too long", "POST", "/v1/runs/claim", h.runsKey, "application/json", `{"key":"k2","payload":1,"lease_seconds":99999}`, 400, "invalid_field"},
			{"negative lease", "POST", "/v1/runs/claim", h.runsKey, "application/json", `{"key":"k2","payload":1,"lease_seconds":-1}`, 400, "invalid_field"},
			{"control chars in meta", "POST", "/v1/runs/claim", h.runsKey, "application/json", `{"key":"k2","payload":1,"meta":{"requested_by":"a\nb"}}`, 400, "invalid_field"},
			{"body too large", "POST", "/v1/runs/claim", h.runsKey, "application/json", big, 413, "body_too_large"},
			{"not json", "POST", "/v1/runs/claim", h.runsKey, "application/x-www-form-urlencoded", `key=k2`, 415, "unsupported_media_type"},
			{"no key", "POST", "/v1/runs/claim", "", "application/json", `{"key":"k2","payload":1}`, 401, "unauthenticated"},
			{"bad key", "POST", "/v1/runs/claim", "alk_nope", "application/json", `{"key":"k2","payload":1}`, 401, "unauthenticated"},
			{"revoked key", "POST", "/v1/runs/claim", h.revokedKey, "application/json", `{"key":"k2","payload":1}`, 401, "unauthenticated"},
			{"read scope cannot claim", "POST", "/v1/runs/claim", h.readKey, "application/json", `{"key":"k2","payload":1}`, 403, "forbidden"},
			{"no route", "GET", "/v1/nothing", h.runsKey, "", ``, 404, "not_found"},
			{"wrong method", "DELETE", "/v1/runs/k1", h.runsKey, "", ``, 405, "method_not_allowed"},
			{"run not found", "GET", "/v1/runs/k2", h.runsKey, "", ``, 404, "run_not_found"},
			{"events not found", "GET", "/v1/runs/k2/events", h.runsKey, "", ``, 404, "run_not_found"},
			{"bad events cursor", "GET", "/v1/runs/k1/events?after=x", h.runsKey, "", ``, 400, "invalid_field"},
			{"heartbeat missing version", "POST", "/v1/runs/k1/heartbeat", h.runsKey, "application/json", `{"lease_owner":"` + owner + `"}`, 400, "missing_field"},
			{"heartbeat missing owner", "POST", "/v1/runs/k1/heartbeat", h.runsKey, "application/json", `{"version":1}`, 400, "missing_field"},
			{"heartbeat not owner", "POST", "/v1/runs/k1/heartbeat", h.runsKey, "application/json", `{"lease_owner":"x","version":1}`, 409, "lease_lost"},
			{"heartbeat stale version", "POST", "/v1/runs/k1/heartbeat", h.runsKey, "application/json", `{"lease_owner":"` + owner + `","version":7}`, 409, "version_conflict"},
			{"heartbeat unknown run", "POST", "/v1/runs/k2/heartbeat", h.runsKey, "application/json", `{"lease_owner":"` + owner + `","version":1}`, 404, "run_not_found"},
			{"transition missing to", "POST", "/v1/runs/k1/transition", h.runsKey, "application/json", `{"lease_owner":"` + owner + `","version":1}`, 400, "missing_field"},
			{"transition to a gate state", "POST", "/v1/runs/k1/transition", h.runsKey, "application/json", `{"lease_owner":"` + owner + `","version":1,"to":"approved"}`, 422, "invalid_transition"},
			{"transition to nonsense", "POST", "/v1/runs/k1/transition", h.runsKey, "application/json", `{"lease_owner":"` + owner + `","version":1,"to":"done"}`, 422, "invalid_transition"},
			{"result on retryable", "POST", "/v1/runs/k1/transition", h.runsKey, "application/json", `{"lease_owner":"` + owner + `","version":1,"to":"failed_retryable","result":{}}`, 400, "invalid_field"},
			{"transition stale version", "POST", "/v1/runs/k1/transition", h.runsKey, "application/json", `{"lease_owner":"` + owner + `","version":0,"to":"completed"}`, 409, "version_conflict"},
			{"transition not owner", "POST", "/v1/runs/k1/transition", h.runsKey, "application/json", `{"lease_owner":"thief","version":1,"to":"completed"}`, 409, "lease_lost"},
			{"version wrong type", "POST", "/v1/runs/k1/transition", h.runsKey, "application/json", `{"lease_owner":"` + owner + `","version":"1","to":"completed"}`, 400, "wrong_type"},
		}
		for _, c := range cases {
			r := h.do(c.method, c.path, c.key, c.ctype, c.body)
			t.Run(c.name, func(t *testing.T) { expect(t, r, c.status, c.code) })
		}
		// Nothing was written by the refusals: k1 is as claimed, k2 does not exist.
		run := h.get("/v1/runs/k1")
		if run.body["version"].(float64) != 1 || run.body["state"] != "processing" || run.body["duplicates"].(float64) != 0 {
			t.Fatalf("k1 changed: %s", run.raw)
		}
		expect(t, h.get("/v1/runs/k2"), 404, "run_not_found")
		evs := h.get("/v1/runs/k1/events")
		if n := len(evs.body["events"].([]any)); n != 1 {
			t.Fatalf("k1 has %d events, want only its claim: %s", n, evs.raw)
		}

		// Lease expiry and the lifetime cap through HTTP.
		h.env.Clock.Advance(apptest.LeaseConfig.DefaultLease)
		expect(t, h.post("/v1/runs/k1/heartbeat", `{"lease_owner":"`+owner+`","version":1}`), 409, "lease_lost")
		expect(t, h.post("/v1/runs/k1/transition", `{"lease_owner":"`+owner+`","version":1,"to":"completed"}`), 409, "lease_lost")
		r := h.post("/v1/runs/claim", `{"key":"lc","payload":1,"lease_seconds":3600}`)
		lcOwner := r.body["lease_owner"].(string)
		for range 2 { // the second renewal reaches the 2h cap
			h.env.Clock.Advance(40 * time.Minute)
			expect(t, h.post("/v1/runs/lc/heartbeat", `{"lease_owner":"`+lcOwner+`","version":1,"lease_seconds":3600}`), 200, "")
		}
		h.env.Clock.Advance(10 * time.Minute) // live, but at its cap
		expect(t, h.post("/v1/runs/lc/heartbeat", `{"lease_owner":"`+lcOwner+`","version":1}`), 409, "lease_lifetime_exceeded")
	})
}

func TestSecretsStayOutOfLogsAndEvents(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		h.claim("s1")
		h.do("POST", "/v1/runs/claim", h.revokedKey, "application/json", `{"key":"s2","payload":1}`)
		h.do("POST", "/v1/runs/claim", "alk_guessed-secret-value", "application/json", `{"key":"s2","payload":1}`)
		h.do("GET", "/v1/runs/s1?token=query-secret", h.readKey, "", "")
		evs := h.get("/v1/runs/s1/events").raw
		for _, secret := range []string{h.runsKey, h.readKey, h.revokedKey, "guessed-secret-value", "query-secret", "/v1/runs/s1"} {
			if strings.Contains(h.logs.String(), secret) {
				t.Errorf("the log contains %q", secret)
			}
			if strings.Contains(evs, secret) && !strings.HasPrefix(secret, "/") {
				t.Errorf("an event contains %q", secret)
			}
		}
		if !strings.Contains(h.logs.String(), `"route":"GET /v1/runs/{key}"`) {
			t.Fatalf("access log has no route pattern:\n%s", h.logs.String())
		}
		// Metrics label routes by pattern, never by path.
		m := h.do("GET", "/metrics", "", "", "").raw
		if strings.Contains(m, "s1") || !strings.Contains(m, `route="POST /v1/runs/claim"`) {
			t.Fatalf("metrics labels:\n%s", grep(m, "airlock_http_requests_total"))
		}
		if !strings.Contains(m, `airlock_claims_total{outcome="claimed"}`) {
			t.Fatal("claims counter missing")
		}
	})
}

func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestHealth(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		expect(t, h.do("GET", "/healthz", "", "", ""), 200, "")
		r := h.do("GET", "/readyz", "", "", "")
		expect(t, r, 200, "")
		if r.body["backend"] == "" {
			t.Fatal("readyz names no backend")
		}
	})
}

// TestOpenAPIMatchesRoutes fails when a route and the document disagree.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	h := newHarness(t, storetest.Backends[0])
	r := h.do("GET", "/openapi.json", "", "", "")
	expect(t, r, 200, "")
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal([]byte(r.raw), &doc); err != nil {
		t.Fatal(err)
	}
	inDoc := map[string]bool{}
	for path, ops := range doc.Paths {
		for method := range ops {
			if method == "parameters" {
				continue
			}
			inDoc[strings.ToUpper(method)+" "+path] = true
		}
	}
	for _, rt := range httpapi.Routes {
		name := rt.Method + " " + rt.Pattern
		if !inDoc[name] {
			t.Errorf("route %s is not in openapi.json", name)
		}
		delete(inDoc, name)
		// Routes that need an API key must say so; open ones must opt out.
		var op struct {
			Security *[]map[string][]string `json:"security"`
		}
		_ = json.Unmarshal(doc.Paths[rt.Pattern][strings.ToLower(rt.Method)], &op)
		if open := op.Security != nil && len(*op.Security) == 0; open != (rt.Scope == "") {
			t.Errorf("%s: openapi security does not match scope %q", name, rt.Scope)
		}
		// Every mutating /v1 route takes an Idempotency-Key; no other does.
		var params struct {
			Parameters []struct {
				Ref string `json:"$ref"`
			} `json:"parameters"`
		}
		_ = json.Unmarshal(doc.Paths[rt.Pattern][strings.ToLower(rt.Method)], &params)
		documented := slices.ContainsFunc(params.Parameters, func(p struct {
			Ref string `json:"$ref"`
		}) bool {
			return p.Ref == "#/components/parameters/IdempotencyKey"
		})
		if takes := rt.Scope != "" && rt.Method != "GET" && strings.HasPrefix(rt.Pattern, "/v1/"); documented != takes {
			t.Errorf("%s: Idempotency-Key documented %v, taken %v", name, documented, takes)
		}
	}
	for _, name := range append(slices.Clone(web.Patterns), web.ConsolePatterns...) {
		if !inDoc[name] {
			t.Errorf("page route %s is not in openapi.json", name)
		}
		delete(inDoc, name)
	}
	for name := range inDoc {
		t.Errorf("openapi.json documents %s, which is not a route", name)
	}
	// Every error code the API can return is in the Error schema's enum.
	codes := regexp.MustCompile(`"error":\s*\{[^}]*"enum":\s*\[([^\]]*)\]`).FindStringSubmatch(r.raw)
	if codes == nil {
		t.Fatal("no error enum in openapi.json")
	}
	for _, c := range []string{"payload_mismatch", "lease_lost", "version_conflict", "invalid_transition", "lease_lifetime_exceeded", "unauthenticated", "forbidden", "body_too_large",
		"nul_character", "invalid_idempotency_key", "idempotency_key_reused", "request_in_progress"} {
		if !strings.Contains(codes[1], `"`+c+`"`) {
			t.Errorf("error code %s missing from openapi.json", c)
		}
	}
}

// TestAccessLogFollowsLevel: the access log line is written at info and above and only
// there; below info the request is still counted in the metrics.
func TestAccessLogFollowsLevel(t *testing.T) {
	h := newHarness(t, storetest.Backends[0])
	for _, tc := range []struct {
		level slog.Level
		want  bool
	}{{slog.LevelInfo, true}, {slog.LevelWarn, false}} {
		var logs syncBuffer
		m := metrics.New()
		srv := httptest.NewServer(h.handler(func(d *httpapi.Deps) {
			d.Log = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: tc.level}))
			d.Metrics = m
		}))
		t.Cleanup(srv.Close)
		r, err := h.send(srv.URL, "POST", "/v1/runs/claim", h.runsKey, "", fmt.Sprintf(`{"key":"lvl-%s","payload":1}`, tc.level))
		if err != nil || r.status != http.StatusCreated {
			t.Fatalf("%v: claim: %v %d %s", tc.level, err, r.status, r.raw)
		}
		got := strings.Contains(logs.String(), `"msg":"http"`) && strings.Contains(logs.String(), `"route":"POST /v1/runs/claim"`)
		if got != tc.want {
			t.Errorf("level %v: access log written %v, want %v:\n%s", tc.level, got, tc.want, logs.String())
		}
		var pm dto.Metric
		if err := m.HTTPRequests.WithLabelValues("POST /v1/runs/claim", "201").Write(&pm); err != nil {
			t.Fatal(err)
		}
		if n := pm.GetCounter().GetValue(); n != 1 {
			t.Errorf("level %v: %v claims counted, want 1", tc.level, n)
		}
	}
}
