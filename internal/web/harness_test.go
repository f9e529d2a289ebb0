package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/accounts"
	"github.com/airlockhq/airlock/internal/apikeys"
	"github.com/airlockhq/airlock/internal/app"
	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/httpapi"
	"github.com/airlockhq/airlock/internal/store/storetest"
	"github.com/airlockhq/airlock/internal/web"
)

// The page tests drive the pages over real HTTP, in a browser-like client (browser) or
// headless Chromium, against the whole graph as `airlock serve` serves it (apptest.Serve:
// one app.New, the API and the pages side by side); they reach the API only to set a
// run up. The API's own tests are internal/httpapi's.

type syncBuffer = apptest.SyncBuffer

type harness struct {
	t                  testing.TB
	env                *apptest.EffectsEnv
	url                string
	runsKey, workerKey string
	operatorKey        string
	logs               *syncBuffer
	log                *slog.Logger // the serving graph's logger (writes to logs)
	another            func(mod func(d *httpapi.Deps)) string
	handler            func(mod func(d *httpapi.Deps)) http.Handler // another instance, unserved
	deps               httpapi.Deps
}

// newHarness serves the API and the pages; pageOpts, given the server's URL, configure
// the pages (single sign-on).
func newHarness(t testing.TB, b storetest.Backend, pageOpts ...func(publicURL string) web.Option) *harness {
	t.Helper()
	return newHarnessWith(t, b, nil, pageOpts...)
}

// newHarnessWith is newHarness with setup applied first: it may change the options the
// graph is built from (another policy, other connectors, other lease bounds).
func newHarnessWith(t testing.TB, b storetest.Backend, setup func(env *apptest.EffectsEnv, o *app.Options), pageOpts ...func(publicURL string) web.Option) *harness {
	t.Helper()
	s := apptest.Serve(t, b, setup, pageOpts...)
	return &harness{t: t, env: s.Env, url: s.URL, logs: s.Logs, log: s.Log, deps: s.Env.App.Deps,
		runsKey: s.RunsKey, workerKey: s.WorkerKey, operatorKey: s.OperatorKey,
		handler: s.Handler, another: func(mod func(d *httpapi.Deps)) string { return s.Another(t, mod) }}
}

func forEachBackend(t *testing.T, fn func(t *testing.T, h *harness)) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			fn(t, newHarness(t, b))
		})
	}
}

// response is an API answer.
type response struct {
	status int
	body   map[string]any
	raw    string
	header http.Header
}

// do calls the API with key.
func (h *harness) do(method, path, key, contentType, body string) response {
	h.t.Helper()
	req, err := http.NewRequest(method, h.url+path, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	// AIRLOCK_TEST_IDEMPOTENCY_KEYS=1: an Idempotency-Key on each mutating request, as
	// internal/httpapi's tests send it.
	if os.Getenv("AIRLOCK_TEST_IDEMPOTENCY_KEYS") != "" && method != "GET" && key != "" {
		req.Header.Set("Idempotency-Key", fmt.Sprintf("every-%d", time.Now().UnixNano()))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
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

// key creates an API key as `airlock apikey create` does.
func (h *harness) key(spec apikeys.Spec) string {
	h.t.Helper()
	_, raw, err := apikeys.CreateSpec(context.Background(), h.env.Store, spec, h.env.Clock.Now())
	if err != nil {
		h.t.Fatal(err)
	}
	return raw
}

// propose claims key and asks for an email effect; it returns the approval link.
func (h *harness) propose(key, requestedBy string) string {
	h.t.Helper()
	owner, v := h.claim(key)
	meta := ""
	if requestedBy != "" {
		meta = `,"meta":{"requested_by":"` + requestedBy + `"}`
	}
	r := h.post("/v1/runs/"+key+"/effects", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"action_type":"email","target":"default","payload":{"to":"ana@example.com","text":"Your refund"}%s}`, owner, v, meta))
	expect(h.t, r, 202, "")
	return r.body["approve_url"].(string)
}

// browser is a person's HTTP client: its own cookies, no automatic redirects.
type browser struct {
	t *testing.T
	c *http.Client
}

func newBrowser(t *testing.T) *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t: t, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (b *browser) do(method, u string, form url.Values, header map[string]string) (int, string, http.Header) {
	b.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, _ := http.NewRequest(method, u, body)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if method == "POST" {
		// What a browser sends with a form post from airlock's own page; a test
		// removes it with an empty value.
		req.Header.Set("Origin", req.URL.Scheme+"://"+req.URL.Host)
	}
	for k, v := range header {
		if v == "" {
			req.Header.Del(k)
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := b.c.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw), resp.Header
}

func (h *harness) addUser(name string, roles ...string) {
	h.t.Helper()
	if err := accounts.CreateUser(context.Background(), h.env.Store, name, "correct horse battery", roles); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) signIn(b *browser, name string) (int, string, http.Header) {
	return b.do("POST", h.url+"/login", url.Values{"username": {name}, "password": {"correct horse battery"}}, nil)
}

func (h *harness) decide(b *browser, link, decision string) int {
	h.t.Helper()
	code, _, _ := b.do("POST", link, url.Values{"decision": {decision}}, nil)
	return code
}
