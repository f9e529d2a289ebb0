package web_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/accounts"
	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

const rightPassword = "correct horse battery"

func (h *harness) login(b *browser, base, name, password string) (int, http.Header) {
	h.t.Helper()
	code, _, hdr := b.do("POST", base+"/login", url.Values{"username": {name}, "password": {password}}, nil)
	return code, hdr
}

// metric reads one sample of the first instance's /metrics.
func (h *harness) metric(series string) float64 {
	h.t.Helper()
	r := h.do("GET", "/metrics", "", "", "")
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(r.raw)
	if m == nil {
		return 0
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

func (h *harness) systemEvents(kind string) []map[string]any {
	h.t.Helper()
	evs, err := h.env.Store.EventList(context.Background(), "", 0, 10000)
	if err != nil {
		h.t.Fatal(err)
	}
	var out []map[string]any
	for _, e := range evs {
		if e.Kind == kind {
			var d map[string]any
			_ = json.Unmarshal(e.Detail, &d)
			out = append(out, d)
		}
	}
	return out
}

// Found before the throttle: 200 wrong passwords in 47 s and no lockout.
func TestSigninThrottlePerAccount(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		h.addUser("lead", "support-lead")
		h.addUser("ana", "support")
		b := newBrowser(t)
		for i := range 6 {
			if code, _ := h.login(b, h.url, "lead", "wrong password "+strconv.Itoa(i)); code != http.StatusUnauthorized {
				t.Fatalf("wrong password %d: %d", i+1, code)
			}
		}
		// Another instance over the same database agrees: the next attempt waits, and
		// the right password is not even checked.
		other := h.another(nil)
		code, hdr := h.login(b, other, "lead", rightPassword)
		if code != http.StatusTooManyRequests || hdr.Get("Retry-After") != "1" || h.hasSession(b) {
			t.Fatalf("right password during the backoff: %d Retry-After %q session %v", code, hdr.Get("Retry-After"), h.hasSession(b))
		}
		// A burst is refused whole, without a single password check.
		var wg sync.WaitGroup
		codes := make([]int, 40)
		for i := range codes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				codes[i], _ = h.login(newBrowser(t), h.url, "lead", "guess "+strconv.Itoa(i))
			}()
		}
		wg.Wait()
		for i, c := range codes {
			if c != http.StatusTooManyRequests {
				t.Fatalf("burst attempt %d: %d", i, c)
			}
		}
		if n := h.metric(`airlock_signin_attempts_total{result="throttled"}`); n != 40 {
			t.Fatalf("throttled metric = %v, want 40", n)
		}
		if n := h.metric(`airlock_signin_attempts_total{result="refused"}`); n != 6 {
			t.Fatalf("refused metric = %v, want 6", n)
		}
		evs := h.systemEvents("signin_throttled")
		if len(evs) != 1 || evs[0]["scope"] != "account" || evs[0]["user"] != "lead" || evs[0]["retry_after_seconds"] != 1.0 {
			t.Fatalf("signin_throttled events: %v", evs)
		}
		// Another account from the same client is not held by lead's backoff.
		if code, _ := h.login(newBrowser(t), h.url, "ana", rightPassword); code != http.StatusOK {
			t.Fatalf("another account: %d", code)
		}
		// After the wait the right password signs in and clears the account's count.
		h.env.Clock.Advance(time.Second)
		if code, _ := h.login(b, other, "lead", rightPassword); code != http.StatusOK || !h.hasSession(b) {
			t.Fatalf("after the wait: %d", code)
		}
		if code, _ := h.login(newBrowser(t), h.url, "lead", "wrong again"); code != http.StatusUnauthorized {
			t.Fatalf("a wrong password after a sign-in: %d", code)
		}

		// The backoff doubles with each further failure.
		for range 5 {
			h.login(b, h.url, "ana", "wrong")
		}
		for _, want := range []string{"1", "2", "4", "8"} {
			if code, _ := h.login(b, h.url, "ana", "wrong"); code != http.StatusUnauthorized {
				t.Fatalf("attempt after the wait: %d", code)
			}
			code, hdr := h.login(b, h.url, "ana", "wrong")
			if code != http.StatusTooManyRequests || hdr.Get("Retry-After") != want {
				t.Fatalf("backoff: %d Retry-After %q, want %s", code, hdr.Get("Retry-After"), want)
			}
			d, _ := strconv.Atoi(want)
			h.env.Clock.Advance(time.Duration(d) * time.Second)
		}
	})
}

// The per-client backoff holds a client that tries many names.
func TestSigninThrottlePerClient(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		h.addUser("lead", "support-lead")
		b := newBrowser(t)
		for i := range accounts.DefaultThrottle.ClientFree + 1 {
			if code, _ := h.login(b, h.url, "nobody-"+strconv.Itoa(i), "x"); code != http.StatusUnauthorized {
				t.Fatalf("name %d: %d", i, code)
			}
		}
		code, hdr := h.login(b, h.url, "lead", rightPassword)
		if code != http.StatusTooManyRequests || hdr.Get("Retry-After") != "1" {
			t.Fatalf("client past its allowance: %d %q", code, hdr.Get("Retry-After"))
		}
		// A throttled client creates no row for the names it tries next.
		before := storetest.DumpAll(t, h.env.Store)
		for i := range 20 {
			h.login(b, h.url, "fresh-"+strconv.Itoa(i), "x")
		}
		if after := storetest.DumpAll(t, h.env.Store); after != before {
			t.Fatal("a throttled client's attempts wrote to the database")
		}
		evs := h.systemEvents("signin_throttled")
		if len(evs) != 1 || evs[0]["scope"] != "client" {
			t.Fatalf("events: %v", evs)
		}
		h.env.Clock.Advance(time.Second)
		if code, _ := h.login(b, h.url, "lead", rightPassword); code != http.StatusOK {
			t.Fatalf("after the wait: %d", code)
		}
	})
}

// An unknown name used to answer in 11 ms, a real one in 184 ms: the timing told which
// names exist.
func TestSigninTimingSameForUnknownUsers(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		h.addUser("lead", "support-lead")
		h.addUser("gone", "support-lead")
		if _, err := (accounts.Accounts{Store: h.env.Store, Actor: "test"}).Disable(context.Background(), "gone"); err != nil {
			t.Fatal(err)
		}
		timed := func(name string) time.Duration {
			start := time.Now()
			if code, _ := h.login(newBrowser(t), h.url, name, "wrong password"); code != http.StatusUnauthorized {
				t.Fatalf("%s: %d", name, code)
			}
			return time.Since(start)
		}
		var known, unknown, disabled []time.Duration
		for i := range 5 { // within the per-account allowance; 15 attempts within the client's
			known = append(known, timed("lead"))
			unknown = append(unknown, timed("nobody-"+strconv.Itoa(i)))
			disabled = append(disabled, timed("gone"))
		}
		// The fastest of each, not the median: on a loaded machine an answer can only be
		// slowed by others' work, so the minimum is the closest to its own cost (a bcrypt
		// check for all three, or none for the unknown and disabled if the dummy check went).
		k, u, g := slices.Min(known), slices.Min(unknown), slices.Min(disabled)
		t.Logf("fastest answer: real user %v, unknown %v, disabled %v", k, u, g)
		if u < k/2 || g < k/2 {
			t.Fatalf("unknown (%v) or disabled (%v) users answer much faster than a real one (%v)", u, g, k)
		}
	})
}

func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

func cookieOf(b *browser, base, name string) string {
	u, _ := url.Parse(base + "/")
	for _, c := range b.c.Jar.Cookies(u) {
		if c.Name == name {
			return c.Value
		}
	}
	return ""
}

// Anonymous POST /approve/<anything> used to write a row per request.
func TestAnonymousApprovalRequestsWriteNothing(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		h.addUser("lead", "support-lead")
		link := h.propose("anon-1", "")
		token := strings.TrimPrefix(link, h.url+"/approve/")
		before := storetest.DumpAll(t, h.env.Store)
		anon := newBrowser(t)
		for i := range 200 {
			u := h.url + "/approve/" + randomToken()
			if i%2 == 1 {
				u = link
			}
			code, _, hdr := anon.do("POST", u, url.Values{"decision": {"approve"}}, nil)
			if code != http.StatusSeeOther || hdr.Get("Location") != "/login" {
				t.Fatalf("anonymous POST %d: %d", i, code)
			}
		}
		if code, _, _ := anon.do("GET", link, nil, nil); code != http.StatusSeeOther {
			t.Fatalf("anonymous GET: %d", code)
		}
		if after := storetest.DumpAll(t, h.env.Store); after != before {
			t.Fatalf("anonymous approval requests wrote to the database:\nbefore:\n%s\nafter:\n%s", before, after)
		}
		// The place is kept in the cookie, sealed: neither the token nor its hash shows.
		intent := cookieOf(anon, h.url, "airlock_intent")
		raw, _ := base64.RawURLEncoding.DecodeString(intent)
		if intent == "" || strings.Contains(intent, token) || strings.Contains(string(raw), approvals.HashToken(token)) {
			t.Fatalf("intent cookie %q", intent)
		}
		if code, hdr := h.login(anon, h.url, "lead", rightPassword); code != http.StatusSeeOther || hdr.Get("Location") != "/approve/continue" {
			t.Fatalf("sign-in with an intent: %d", code)
		}
		if code, page, _ := anon.do("GET", h.url+"/approve/continue", nil, nil); code != 200 || !strings.Contains(page, "Approve and send") {
			t.Fatalf("continue: %d", code)
		}
		// Another instance reads the same key (generated at migrate).
		other := h.another(nil)
		if code, page, _ := anon.do("GET", other+"/approve/continue", nil, nil); code != 200 || !strings.Contains(page, "anon-1") {
			t.Fatalf("continue on another instance: %d", code)
		}
		// An altered cookie, or an expired one, is ignored.
		u, _ := url.Parse(h.url + "/")
		flip := []byte(intent)
		flip[len(flip)/2] ^= 1
		anon.c.Jar.SetCookies(u, []*http.Cookie{{Name: "airlock_intent", Value: string(flip), Path: "/"}})
		if code, page, _ := anon.do("GET", h.url+"/approve/continue", nil, nil); code != 404 || !strings.Contains(page, "cannot be used") {
			t.Fatalf("altered intent: %d", code)
		}
		anon.c.Jar.SetCookies(u, []*http.Cookie{{Name: "airlock_intent", Value: intent, Path: "/"}})
		h.env.Clock.Advance(16 * time.Minute)
		if code, _, _ := anon.do("GET", h.url+"/approve/continue", nil, nil); code != 404 {
			t.Fatalf("expired intent: %d", code)
		}
	})
}

// The card and its draft are for those who may decide.
func TestApprovalCardOnlyForApprovers(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		h.addUser("lead", "support-lead")
		h.addUser("lead2", "support-lead")
		h.addUser("intern", "support")
		link := h.propose("card-1", "lead")
		secret := []string{"Your refund", "ana@example.com", "Approve and send", "card-1"}
		for _, c := range []struct{ name, why string }{{"intern", "not one of the approvers"}, {"lead", "Separation of duties"}} {
			b := newBrowser(t)
			b.do("GET", link, nil, nil) // through the sign-in, as from the notification
			h.login(b, h.url, c.name, rightPassword)
			for _, u := range []string{h.url + "/approve/continue", link} {
				code, page, _ := b.do("GET", u, nil, nil)
				if code != http.StatusForbidden || !strings.Contains(page, c.why) {
					t.Fatalf("%s at %s: %d %s", c.name, u, code, page)
				}
				for _, s := range secret {
					if strings.Contains(page, s) {
						t.Fatalf("%s sees %q", c.name, s)
					}
				}
			}
			code, page, _ := b.do("POST", link, url.Values{"decision": {"approve"}}, nil)
			if code != http.StatusForbidden || strings.Contains(page, "Your refund") {
				t.Fatalf("%s POST: %d", c.name, code)
			}
		}
		b := newBrowser(t)
		h.login(b, h.url, "lead2", rightPassword)
		if code, page, _ := b.do("GET", link, nil, nil); code != 200 || !strings.Contains(page, "Your refund") || !strings.Contains(page, "Approve and send") {
			t.Fatalf("approver: %d", code)
		}
	})
}

// A POST with only a cross-origin Referer used to decide an approval.
func TestFormPostsNeedTheirOrigin(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		h.addUser("lead", "support-lead")
		lead := newBrowser(t)
		if code, _ := h.login(lead, h.url, "lead", rightPassword); code != 200 {
			t.Fatalf("sign-in: %d", code)
		}
		link := h.propose("origin-1", "")
		approve := url.Values{"decision": {"approve"}}
		for _, c := range []struct {
			name   string
			header map[string]string
		}{
			{"cross-origin Referer only", map[string]string{"Origin": "", "Referer": "https://evil.example/page"}},
			{"Referer on another port", map[string]string{"Origin": "", "Referer": "http://127.0.0.1:1/approve/x"}},
			{"no Origin, Sec-Fetch-Site or Referer", map[string]string{"Origin": ""}},
			{"cross-site Sec-Fetch-Site", map[string]string{"Sec-Fetch-Site": "cross-site"}},
			{"foreign Origin", map[string]string{"Origin": "https://evil.example"}},
		} {
			if code, _, _ := lead.do("POST", link, approve, c.header); code != http.StatusForbidden {
				t.Fatalf("%s: %d", c.name, code)
			}
		}
		if aps, _ := h.env.Store.ApprovalsByRun(context.Background(), "origin-1"); aps[0].ConsumedAt != nil {
			t.Fatal("a refused post decided the approval")
		}
		// Sign-in and sign-out are form posts too.
		fresh := newBrowser(t)
		code, _, _ := fresh.do("POST", h.url+"/login", url.Values{"username": {"lead"}, "password": {rightPassword}},
			map[string]string{"Origin": "", "Referer": "https://evil.example/"})
		if code != http.StatusForbidden || h.hasSession(fresh) {
			t.Fatalf("cross-origin sign-in: %d", code)
		}
		if code, _, _ := lead.do("POST", h.url+"/logout", url.Values{}, map[string]string{"Origin": ""}); code != http.StatusForbidden || !h.hasSession(lead) {
			t.Fatalf("sign-out without an origin: %d", code)
		}
		// A same-origin Referer (an older browser without Origin) is accepted.
		code, page, _ := lead.do("POST", link, approve, map[string]string{"Origin": "", "Referer": link})
		if code != 200 || !strings.Contains(page, "Approved") {
			t.Fatalf("same-origin Referer: %d", code)
		}
	})
}
