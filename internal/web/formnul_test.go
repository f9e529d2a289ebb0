package web_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/store/storetest"
)

// Bad input in form posts: a NUL character, invalid UTF-8, a control character,
// an over-long value or a malformed form in the sign-in and approval forms is refused with
// a clear 400 page, on both stores (PostgreSQL used to answer 500 for a NUL), and changes
// nothing.
func TestBadFormInputRefused(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		h.addUser("lead", "support-lead")
		link := h.propose("form-1", "")
		before := storetest.DumpAll(t, h.env.Store)
		isPage := func(body string) bool { return strings.Contains(strings.ToLower(body), "<html") }

		for _, c := range []struct{ name, body string }{
			{"NUL in the username", url.Values{"username": {"le\x00ad"}, "password": {"x"}}.Encode()},
			{"NUL in the password", url.Values{"username": {"lead"}, "password": {"correct horse\x00"}}.Encode()},
			{"invalid UTF-8 in the username", url.Values{"username": {"le\xffad"}, "password": {"x"}}.Encode()},
			{"a control character in the username", url.Values{"username": {"le\x1bad"}, "password": {"x"}}.Encode()},
			{"an over-long username", url.Values{"username": {strings.Repeat("a", 300)}, "password": {"x"}}.Encode()},
			{"a malformed form", "username=%zz&password=x"},
		} {
			req, _ := http.NewRequest("POST", h.url+"/login", strings.NewReader(c.body))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Origin", h.url)
			b := newBrowser(t)
			resp, err := b.c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var sb strings.Builder
			buf := make([]byte, 4096)
			for {
				n, err := resp.Body.Read(buf)
				sb.Write(buf[:n])
				if err != nil {
					break
				}
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest || !isPage(sb.String()) || resp.Header.Get("Set-Cookie") != "" {
				t.Errorf("sign-in with %s: %d (cookie %q); want a 400 page", c.name, resp.StatusCode, resp.Header.Get("Set-Cookie"))
			}
		}
		if after := storetest.DumpAll(t, h.env.Store); after != before {
			t.Fatal("a refused sign-in changed the database")
		}

		lead := newBrowser(t)
		if code, _, _ := h.signIn(lead, "lead"); code != http.StatusSeeOther && code != http.StatusOK {
			t.Fatalf("sign-in: %d", code)
		}
		before = storetest.DumpAll(t, h.env.Store) // the session
		for _, c := range []struct {
			name string
			form url.Values
		}{
			{"NUL in the reason", url.Values{"decision": {"reject"}, "reason": {"no\x00pe"}}},
			{"invalid UTF-8 in the reason", url.Values{"decision": {"reject"}, "reason": {"no\xffpe"}}},
			{"a control character in the reason", url.Values{"decision": {"reject"}, "reason": {"no\x07pe"}}},
			{"an over-long reason", url.Values{"decision": {"reject"}, "reason": {strings.Repeat("x", 5000)}}},
			{"NUL in the decision", url.Values{"decision": {"approve\x00"}}},
		} {
			code, body, _ := lead.do("POST", link, c.form, nil)
			if code != http.StatusBadRequest || !isPage(body) {
				t.Errorf("decision with %s: %d; want a 400 page", c.name, code)
			}
		}
		if after := storetest.DumpAll(t, h.env.Store); after != before {
			t.Fatal("a refused form changed the database")
		}
		// A reason on several lines is fine.
		if code, _, _ := lead.do("POST", link, url.Values{"decision": {"reject"}, "reason": {"wrong customer,\r\nsee ticket\tT-1"}}, nil); code != http.StatusOK {
			t.Fatalf("a multi-line reason: %d", code)
		}
	})
}
