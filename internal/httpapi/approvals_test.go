package httpapi_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/web"
)

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
	for k, v := range header {
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
	if err := web.CreateUser(context.Background(), h.env.Store, name, "correct horse battery", roles); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) signIn(b *browser, name string) (int, string, http.Header) {
	return b.do("POST", h.url+"/login", url.Values{"username": {name}, "password": {"correct horse battery"}}, nil)
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

func TestApprovalFlow(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		h.addUser("lead", "support-lead")
		h.addUser("intern", "support")
		link := h.propose("ticket-1", "")
		token := strings.TrimPrefix(link, h.url+"/approve/")
		if !regexp.MustCompile(`^[A-Za-z0-9_-]{43}$`).MatchString(token) {
			t.Fatalf("token %q is not 256 bits of base64url", token)
		}
		run := h.get("/v1/runs/ticket-1")
		if run.body["state"] != "awaiting_human" || len(run.body["effects"].([]any)) != 0 || run.body["park_reason"] != "approval" {
			t.Fatalf("while waiting: %s", run.raw)
		}
		// Only the token's hash is stored.
		aps, err := h.env.Store.ApprovalsByRun(context.Background(), "ticket-1")
		if err != nil || len(aps) != 1 || aps[0].TokenHash != approvals.HashToken(token) || strings.Contains(fmt.Sprint(aps[0]), token) {
			t.Fatalf("stored approval: %+v %v", aps, err)
		}

		// Not signed in: GET leads to sign-in, twice, and changes nothing.
		anon := newBrowser(t)
		for range 2 {
			code, _, hdr := anon.do("GET", link, nil, nil)
			if code != http.StatusSeeOther || hdr.Get("Location") != "/login" || strings.Contains(hdr.Get("Location"), token) {
				t.Fatalf("anonymous GET: %d %v", code, hdr)
			}
		}
		if code, _, hdr := anon.do("POST", link, url.Values{"decision": {"approve"}}, nil); code != http.StatusSeeOther || hdr.Get("Location") != "/login" {
			t.Fatalf("anonymous POST: %d", code)
		}
		// The wrong role sees the card but cannot decide.
		intern := newBrowser(t)
		if code, _, hdr := h.signIn(intern, "intern"); code != http.StatusOK || hdr.Get("Set-Cookie") == "" {
			t.Fatalf("sign-in: %d", code)
		}
		code, page, hdr := intern.do("GET", link, nil, nil)
		if code != 200 || !strings.Contains(page, "ticket-1") || !strings.Contains(page, "not one of the approvers") || !strings.Contains(page, "Rerun protocol") {
			t.Fatalf("card for the wrong role: %d %s", code, page)
		}
		for k, v := range map[string]string{"Referrer-Policy": "no-referrer", "Cache-Control": "no-store", "X-Frame-Options": "DENY"} {
			if hdr.Get(k) != v {
				t.Errorf("header %s = %q", k, hdr.Get(k))
			}
		}
		if !strings.Contains(hdr.Get("Content-Security-Policy"), "frame-ancestors 'none'") {
			t.Error("no CSP frame-ancestors")
		}
		if code, _, _ := intern.do("POST", link, url.Values{"decision": {"approve"}}, nil); code != http.StatusForbidden {
			t.Fatalf("wrong role decided: %d", code)
		}
		// The lead signs in through the link: the place is kept server-side.
		lead := newBrowser(t)
		lead.do("GET", link, nil, nil)
		code, _, hdr = h.signIn(lead, "lead")
		if code != http.StatusSeeOther || hdr.Get("Location") != "/approve/continue" {
			t.Fatalf("sign-in with an intent: %d %v", code, hdr)
		}
		if code, page, _ := lead.do("GET", h.url+"/approve/continue", nil, nil); code != 200 || !strings.Contains(page, "Approve and send") {
			t.Fatalf("continue page: %d %s", code, page)
		}
		// A cross-site POST is refused.
		if code, _, _ := lead.do("POST", link, url.Values{"decision": {"approve"}}, map[string]string{"Sec-Fetch-Site": "cross-site"}); code != http.StatusForbidden {
			t.Fatalf("cross-site POST: %d", code)
		}
		if code, _, _ := lead.do("POST", link, url.Values{"decision": {"maybe"}}, nil); code != http.StatusForbidden {
			t.Fatalf("disallowed decision: %d", code)
		}
		if aps, _ := h.env.Store.ApprovalsByRun(context.Background(), "ticket-1"); aps[0].ConsumedAt != nil {
			t.Fatal("refused attempts consumed the approval")
		}
		code, page, _ = lead.do("POST", h.url+"/approve/continue", url.Values{"decision": {"approve"}}, nil)
		if code != 200 || !strings.Contains(page, "Approved") {
			t.Fatalf("approve: %d %s", code, page)
		}
		run = h.get("/v1/runs/ticket-1")
		effs := run.body["effects"].([]any)
		if run.body["state"] != "approved" || len(effs) != 1 || effs[0].(map[string]any)["state"] != "pending" {
			t.Fatalf("after approval: %s", run.raw)
		}
		// Replay: the same neutral page as a forged link.
		c1, replay, _ := lead.do("POST", link, url.Values{"decision": {"approve"}}, nil)
		c2, forged, _ := lead.do("GET", h.url+"/approve/"+strings.Repeat("A", 43), nil, nil)
		if c1 != 404 || c2 != 404 || !strings.Contains(replay, "cannot be used") || !strings.Contains(forged, "cannot be used") {
			t.Fatalf("replay %d / forged %d", c1, c2)
		}
		// The dispatcher sends it; the approved run completes with its effect.
		if _, err := h.env.Dispatcher.Tick(context.Background()); err != nil {
			t.Fatal(err)
		}
		if run = h.get("/v1/runs/ticket-1"); run.body["state"] != "completed" {
			t.Fatalf("after dispatch: %s", run.raw)
		}
		// The raw token never reached a log or an event.
		if strings.Contains(h.logs.String(), token) || strings.Contains(h.get("/v1/runs/ticket-1/events").raw, token) {
			t.Fatal("the raw token leaked into a log or an event")
		}
	})
}

func TestApprovalRejectSelfApprovalExpiryAndRace(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		h.addUser("lead", "support-lead")
		h.addUser("lead2", "support-lead")
		lead := newBrowser(t)
		h.signIn(lead, "lead")

		// Separation of duties: the requester cannot approve.
		self := h.propose("t-self", "lead")
		if code, page, _ := lead.do("POST", self, url.Values{"decision": {"approve"}}, nil); code != http.StatusForbidden || !strings.Contains(page, "separation of duties") {
			t.Fatalf("self-approval: %d", code)
		}
		// Reject needs a reason; then nothing is queued.
		link := h.propose("t-reject", "")
		if code, _, _ := lead.do("POST", link, url.Values{"decision": {"reject"}}, nil); code != http.StatusUnprocessableEntity {
			t.Fatalf("reject without reason: %d", code)
		}
		if code, _, _ := lead.do("POST", link, url.Values{"decision": {"reject"}, "reason": {"wrong tone"}}, nil); code != 200 {
			t.Fatalf("reject: %d", code)
		}
		run := h.get("/v1/runs/t-reject")
		if run.body["state"] != "rejected" || len(run.body["effects"].([]any)) != 0 || !strings.Contains(run.raw, "wrong tone") {
			t.Fatalf("after reject: %s", run.raw)
		}
		// A rejected key is never restarted by a delivery.
		if again := h.post("/v1/runs/claim", `{"key":"t-reject","payload":{"ticket":42}}`); again.body["claimed"] != false {
			t.Fatalf("claim of a rejected key: %s", again.raw)
		}

		// Two concurrent decisions of one token: one wins, one effect.
		link = h.propose("t-race", "")
		other := newBrowser(t)
		h.signIn(other, "lead2")
		var wg sync.WaitGroup
		codes := make([]int, 2)
		for i, b := range []*browser{lead, other} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				codes[i], _, _ = b.do("POST", link, url.Values{"decision": {"approve"}}, nil)
			}()
		}
		wg.Wait()
		if !(codes[0] == 200 && codes[1] == 404 || codes[0] == 404 && codes[1] == 200) {
			t.Fatalf("concurrent decisions: %v", codes)
		}
		if effs := h.get("/v1/runs/t-race").body["effects"].([]any); len(effs) != 1 {
			t.Fatalf("%d effects after two decisions", len(effs))
		}

		// Expiry: the run fails for good; the link is dead.
		link = h.propose("t-expire", "")
		h.env.Clock.Advance(time.Hour)
		if err := h.env.Approvals.ExpireDue(context.Background()); err != nil {
			t.Fatal(err)
		}
		run = h.get("/v1/runs/t-expire")
		if run.body["state"] != string(store.StateFailedTerminal) || !strings.Contains(run.raw, "approval_expired") {
			t.Fatalf("after expiry: %s", run.raw)
		}
		h.signIn(lead, "lead") // the hour also outlived the session's idle limit
		if code, _, _ := lead.do("POST", link, url.Values{"decision": {"approve"}}, nil); code != 404 {
			t.Fatalf("decision after expiry: %d", code)
		}
		// Sign-out ends the session.
		lead.do("POST", h.url+"/logout", url.Values{}, nil)
		if code, _, _ := lead.do("POST", h.propose("t-after", ""), url.Values{"decision": {"approve"}}, nil); code != http.StatusSeeOther {
			t.Fatalf("after sign-out: %d", code)
		}
	})
}
