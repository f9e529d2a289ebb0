package web_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/oauth2-proxy/mockoidc"

	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/store/storetest"
	"github.com/airlockhq/airlock/internal/web"
)

// idp is an in-process OpenID Connect provider (mockoidc: code flow, PKCE) that records
// every request it receives, whole: method, URL, headers and body.
type idp struct {
	t    *testing.T
	m    *mockoidc.MockOIDC
	mu   sync.Mutex
	seen []string
}

func newIdP(t *testing.T) *idp {
	t.Helper()
	m, err := mockoidc.NewServer(nil)
	if err != nil {
		t.Fatal(err)
	}
	i := &idp{t: t, m: m}
	if err := m.AddMiddleware(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			var hdr bytes.Buffer
			_ = r.Header.Write(&hdr)
			i.mu.Lock()
			i.seen = append(i.seen, r.Method+" "+r.URL.String()+"\n"+hdr.String()+"\n"+string(body))
			i.mu.Unlock()
			next.ServeHTTP(rw, r)
		})
	}); err != nil {
		t.Fatal(err)
	}
	// Another host than airlock's 127.0.0.1, as in production, so the browser's cookie
	// jar keeps the two apart (where 127.0.0.2 cannot be bound, the jar shares them).
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Start(ln, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Shutdown() })
	return i
}

func (i *idp) requests() []string {
	i.mu.Lock()
	defer i.mu.Unlock()
	return append([]string(nil), i.seen...)
}

// pages configures the pages' single sign-on through the policy file's oidc section:
// IdP groups airlock-approvers and helpdesk map to roles; other groups give none.
func (i *idp) pages(publicURL string) web.Option {
	i.t.Helper()
	cfg := i.m.Config()
	doc := fmt.Sprintf(`
oidc:
  issuer: '%s'
  client_id: '%s'
  client_secret_env: IDP_CLIENT_SECRET
  role_map: {airlock-approvers: support-lead, helpdesk: support}
`, cfg.Issuer, cfg.ClientID)
	pol, err := policy.Parse([]byte(doc), func(k string) (string, bool) { return cfg.ClientSecret, k == "IDP_CLIENT_SECRET" })
	if err != nil {
		i.t.Fatal(err)
	}
	o, err := web.DiscoverOIDC(context.Background(), pol.OIDC, publicURL)
	if err != nil {
		i.t.Fatal(err)
	}
	return web.WithOIDC(o)
}

// startSSO follows "Sign in with SSO" and returns the provider URL it leads to.
func (h *harness) startSSO(b *browser) string {
	h.t.Helper()
	code, _, hdr := b.do("GET", h.url+"/login/oidc", nil, nil)
	if code != http.StatusSeeOther {
		h.t.Fatalf("GET /login/oidc: %d", code)
	}
	return hdr.Get("Location")
}

// authorize has the provider sign user in at authURL; it returns the callback URL.
func (i *idp) authorize(b *browser, authURL string, user *mockoidc.MockUser) string {
	i.t.Helper()
	i.m.QueueUser(user)
	code, body, hdr := b.do("GET", authURL, nil, nil)
	if code != http.StatusFound {
		i.t.Fatalf("provider authorize: %d %s", code, body)
	}
	return hdr.Get("Location")
}

// flowCookie is the browser's sign-in attempt: state, nonce, verifier.
func (h *harness) flowCookie(b *browser) []string {
	h.t.Helper()
	u, _ := url.Parse(h.url + web.CallbackPath)
	for _, c := range b.c.Jar.Cookies(u) {
		if c.Name == "airlock_oidc" {
			return strings.Split(c.Value, ".")
		}
	}
	return nil
}

func (h *harness) hasSession(b *browser) bool {
	u, _ := url.Parse(h.url + "/")
	for _, c := range b.c.Jar.Cookies(u) {
		if c.Name == "airlock_session" && c.Value != "" {
			return true
		}
	}
	return false
}

// forEachBackendSSO runs fn on each store with pages that offer single sign-on through
// a provider of the subtest's own (its user queue is FIFO).
func forEachBackendSSO(t *testing.T, fn func(t *testing.T, h *harness, i *idp)) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			i := newIdP(t)
			fn(t, newHarness(t, b, i.pages), i)
		})
	}
}

func lead() *mockoidc.MockUser {
	return &mockoidc.MockUser{Subject: "idp-7f3a", Email: "lead@example.com", EmailVerified: true,
		Groups: []string{"engineering", "airlock-approvers"}}
}

func TestSSOApprovalFlow(t *testing.T) {
	forEachBackendSSO(t, func(t *testing.T, h *harness, i *idp) {
		link := h.propose("sso-1", "")
		token := strings.TrimPrefix(link, h.url+"/approve/")

		// Signed out: the link leads to the sign-in page, which offers both ways in.
		b := newBrowser(t)
		if code, _, hdr := b.do("GET", link, nil, nil); code != http.StatusSeeOther || hdr.Get("Location") != "/login" {
			t.Fatalf("anonymous GET: %d %v", code, hdr)
		}
		code, page, _ := b.do("GET", h.url+"/login", nil, nil)
		if code != 200 || !strings.Contains(page, `href="/login/oidc"`) || !strings.Contains(page, "Sign in with SSO") || !strings.Contains(page, `action="/login"`) {
			t.Fatalf("sign-in page: %d %s", code, page)
		}

		// Start: state, nonce and an S256 challenge go to the provider; the verifier stays
		// in an HttpOnly, SameSite=Lax cookie on airlock's origin.
		_, _, hdr := b.do("GET", h.url+"/login/oidc", nil, nil)
		authURL := hdr.Get("Location")
		au, err := url.Parse(authURL)
		if err != nil || !strings.HasPrefix(authURL, i.m.AuthorizationEndpoint()+"?") {
			t.Fatalf("start led to %q", authURL)
		}
		q := au.Query()
		if q.Get("code_challenge_method") != "S256" || q.Get("code_challenge") == "" || q.Get("state") == "" || q.Get("nonce") == "" ||
			q.Get("redirect_uri") != h.url+"/login/oidc/callback" || q.Get("scope") != "openid profile email groups" || q.Get("response_type") != "code" {
			t.Fatalf("authorization request: %v", q)
		}
		setCookie := hdr.Get("Set-Cookie")
		for _, attr := range []string{"airlock_oidc=", "Path=/login/oidc", "HttpOnly", "SameSite=Lax", "Max-Age=600"} {
			if !strings.Contains(setCookie, attr) {
				t.Errorf("flow cookie %q lacks %s", setCookie, attr)
			}
		}
		flow := h.flowCookie(b)
		if len(flow) != 3 || flow[0] != q.Get("state") || flow[1] != q.Get("nonce") || strings.Contains(authURL, flow[2]) {
			t.Fatalf("flow cookie %v for %v", flow, q)
		}

		// The provider signs the approver in and sends the browser back.
		callback := i.authorize(b, authURL, lead())
		if !strings.HasPrefix(callback, h.url+"/login/oidc/callback?") {
			t.Fatalf("provider redirected to %q", callback)
		}
		code, _, hdr = b.do("GET", callback, nil, nil)
		if code != http.StatusSeeOther || hdr.Get("Location") != "/approve/continue" {
			t.Fatalf("callback: %d %v", code, hdr)
		}
		if !h.hasSession(b) || h.flowCookie(b) != nil {
			t.Fatalf("after the callback: session %v, flow cookie %v", h.hasSession(b), h.flowCookie(b))
		}

		// The approval's place was kept across the round trip: the card, then the decision.
		code, page, _ = b.do("GET", h.url+"/approve/continue", nil, nil)
		if code != 200 || !strings.Contains(page, "Approve and send") || !strings.Contains(page, "Signed in as lead@example.com (support-lead)") {
			t.Fatalf("continue page: %d %s", code, page)
		}
		code, page, _ = b.do("POST", h.url+"/approve/continue", url.Values{"decision": {"approve"}}, nil)
		if code != 200 || !strings.Contains(page, "Approved") {
			t.Fatalf("approve: %d %s", code, page)
		}
		if run := h.get("/v1/runs/sso-1"); run.body["state"] != "approved" || len(run.body["effects"].([]any)) != 1 {
			t.Fatalf("after approval: %s", run.raw)
		}
		if evs := h.get("/v1/runs/sso-1/events").raw; !strings.Contains(evs, `"approver":"lead@example.com"`) {
			t.Fatalf("events do not name the approver: %s", evs)
		}

		// The callback is single-use.
		if code, _, _ := b.do("GET", callback, nil, nil); code != http.StatusBadRequest {
			t.Fatalf("replayed callback: %d", code)
		}

		// Nothing the provider received holds the approval token, its hash or its path;
		// the code was redeemed with the PKCE verifier.
		seen := i.requests()
		var authorized, exchanged bool
		for _, r := range seen {
			for _, secret := range []string{token, approvals.HashToken(token), "/approve/"} {
				if strings.Contains(r, secret) || strings.Contains(r, url.QueryEscape(secret)) {
					t.Errorf("the provider received %q in:\n%s", secret, r)
				}
			}
			authorized = authorized || strings.HasPrefix(r, "GET /oidc/authorize?")
			exchanged = exchanged || strings.HasPrefix(r, "POST /oidc/token") && strings.Contains(r, "code_verifier="+flow[2])
		}
		if !authorized || !exchanged {
			t.Fatalf("provider requests (authorize %v, token with verifier %v):\n%s", authorized, exchanged, strings.Join(seen, "\n---\n"))
		}
		if strings.Contains(h.logs.String(), token) || strings.Contains(h.logs.String(), flow[2]) {
			t.Fatal("the token or the verifier reached the log")
		}
	})
}

func TestSSOSignedInWithoutApproverRole(t *testing.T) {
	forEachBackendSSO(t, func(t *testing.T, h *harness, i *idp) {
		link := h.propose("sso-2", "")
		for _, c := range []struct {
			user  *mockoidc.MockUser
			roles string
		}{
			{&mockoidc.MockUser{Subject: "idp-1", Email: "desk@example.com", EmailVerified: true, Groups: []string{"helpdesk"}}, "(support)"},
			{&mockoidc.MockUser{Subject: "idp-2", Email: "eng@example.com", EmailVerified: true, Groups: []string{"engineering"}}, "()"},
		} {
			b := newBrowser(t)
			b.do("GET", link, nil, nil)
			code, _, hdr := b.do("GET", i.authorize(b, h.startSSO(b), c.user), nil, nil)
			if code != http.StatusSeeOther || hdr.Get("Location") != "/approve/continue" {
				t.Fatalf("%s: callback %d %v", c.user.Email, code, hdr)
			}
			code, page, _ := b.do("GET", h.url+"/approve/continue", nil, nil)
			if code != http.StatusForbidden || !strings.Contains(page, "Signed in as "+c.user.Email+" "+c.roles) ||
				!strings.Contains(page, "not one of the approvers") || strings.Contains(page, "Approve and send") {
				t.Fatalf("%s: card %d %s", c.user.Email, code, page)
			}
			if code, _, _ := b.do("POST", h.url+"/approve/continue", url.Values{"decision": {"approve"}}, nil); code != http.StatusForbidden {
				t.Fatalf("%s decided: %d", c.user.Email, code)
			}
		}
		if run := h.get("/v1/runs/sso-2"); run.body["state"] != "awaiting_human" {
			t.Fatalf("run moved: %s", run.raw)
		}
	})
}

func TestSSORefusals(t *testing.T) {
	forEachBackendSSO(t, func(t *testing.T, h *harness, i *idp) {
		// refused checks the answer, that no session started, and the reason in the log.
		refused := func(b *browser, name, u string, want int, reason string) {
			t.Helper()
			before := len(h.logs.String())
			code, page, _ := b.do("GET", u, nil, nil)
			if code != want || !strings.Contains(page, "Sign in with SSO") || h.hasSession(b) {
				t.Fatalf("%s: %d (want %d), session %v\n%s", name, code, want, h.hasSession(b), page)
			}
			if logged := h.logs.String()[before:]; !strings.Contains(logged, "sso sign-in refused") || !strings.Contains(logged, reason) {
				t.Fatalf("%s: the log does not give the reason %q:\n%s", name, reason, logged)
			}
		}
		withParam := func(u, k, v string) string {
			p, _ := url.Parse(u)
			q := p.Query()
			q.Set(k, v)
			p.RawQuery = q.Encode()
			return p.String()
		}

		// A callback without this browser's attempt (another browser, an injected code).
		b := newBrowser(t)
		other := newBrowser(t)
		callback := i.authorize(other, h.startSSO(other), lead())
		refused(b, "callback in another browser", callback, http.StatusBadRequest, "state does not match")

		// A wrong state is refused, and does not end the real attempt.
		callback = i.authorize(b, h.startSSO(b), lead())
		refused(b, "wrong state", withParam(callback, "state", "forged"), http.StatusBadRequest, "state does not match")
		refused(b, "no state", withParam(callback, "state", ""), http.StatusBadRequest, "state does not match")
		code, _, hdr := b.do("GET", callback, nil, nil)
		if code != http.StatusSeeOther || hdr.Get("Location") != "/login" || !h.hasSession(b) {
			t.Fatalf("real callback after forged ones: %d %v", code, hdr)
		}
		if code, page, _ := b.do("GET", h.url+"/login", nil, nil); code != 200 || !strings.Contains(page, "You are signed in") || !strings.Contains(page, "lead@example.com") {
			t.Fatalf("signed-in page: %d %s", code, page)
		}

		// The ID token must carry this attempt's nonce.
		b = newBrowser(t)
		refused(b, "nonce", i.authorize(b, withParam(h.startSSO(b), "nonce", "other-nonce"), lead()), http.StatusUnauthorized, "nonce does not match")
		// PKCE: a code issued for another challenge cannot be redeemed with this verifier.
		b = newBrowser(t)
		refused(b, "challenge", i.authorize(b, withParam(h.startSSO(b), "code_challenge", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"), lead()), http.StatusUnauthorized, "token exchange failed")
		// The provider refused (the state matches).
		b = newBrowser(t)
		h.startSSO(b)
		refused(b, "provider error", h.url+"/login/oidc/callback?error=access_denied&state="+h.flowCookie(b)[0], http.StatusUnauthorized, "access_denied")
		// An e-mail address the provider has not verified does not name anyone.
		b = newBrowser(t)
		unverified := lead()
		unverified.EmailVerified = false
		refused(b, "unverified email", i.authorize(b, h.startSSO(b), unverified), http.StatusUnauthorized, "email_verified")
	})
}

func TestSSONotConfigured(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		b := newBrowser(t)
		if code, page, _ := b.do("GET", h.url+"/login", nil, nil); code != 200 || strings.Contains(page, "/login/oidc") {
			t.Fatalf("sign-in page without SSO: %d %s", code, page)
		}
		for _, p := range []string{"/login/oidc", "/login/oidc/callback?state=x&code=y"} {
			if code, _, _ := b.do("GET", h.url+p, nil, nil); code != http.StatusNotFound {
				t.Fatalf("%s without SSO: %d", p, code)
			}
		}
	})
}
