package web_test

import (
	"fmt"
	"html"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
)

var runLink = regexp.MustCompile(`<td[^>]*><a href="/console/runs\?key=([^"]+)">`)

// TestConsoleRunsList is the console's runs page on both stores: GET /v1/runs's
// filters and keyset pages as a form and links, each run linking to its Run page, bad
// filters refused with the 400 page, for operators only; and This week's "Outstanding
// now" counting pending approvals and parked runs, each linked to the page listing
// them (Pending approvals shows every one, without its payload).
func TestConsoleRunsList(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		h.addUser("lead", "support-lead")
		h.addUser("ops", "ops")
		h.claim("ord-1")
		h.env.Clock.Advance(time.Hour)
		h.propose("ticket-1", "")
		h.propose("ticket-2", "")
		h.parked("job-2")
		owner, v := h.claim("ord-2")
		expect(t, h.post("/v1/runs/ord-2/transition", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"to":"completed"}`, owner, v)), 200, "")
		h.env.Clock.Advance(30 * time.Minute) // within the approvals' hour
		h.claim("ord-3")

		anon := newBrowser(t)
		if code, _, hdr := anon.do("GET", h.url+"/console/runs?state=processing", nil, nil); code != 303 || hdr.Get("Location") != "/login" {
			t.Fatalf("anonymous runs page: %d %v", code, hdr)
		}
		lead, ops := newBrowser(t), newBrowser(t)
		for name, b := range map[string]*browser{"lead": lead, "ops": ops} {
			if code, _, _ := h.signIn(b, name); code != 200 {
				t.Fatalf("sign in %s: %d", name, code)
			}
		}
		get := func(b *browser, path string, want int) string {
			t.Helper()
			code, body, _ := b.do("GET", h.url+path, nil, nil)
			if code != want {
				t.Fatalf("GET %s: %d, want %d\n%s", path, code, want, body)
			}
			return body
		}
		for _, p := range []string{"/console/runs", "/console/runs?state=awaiting_human", "/console/approvals"} {
			if body := get(lead, p, 403); strings.Contains(body, "ord-1") || strings.Contains(body, "ticket-1") {
				t.Fatalf("%s shows an approver the runs:\n%s", p, body)
			}
		}
		if page := get(ops, "/console", 200); !strings.Contains(page, `href="/console/runs"`) || !strings.Contains(page, `href="/console/approvals"`) {
			t.Fatalf("the nav lacks Runs or Approvals:\n%s", page)
		}
		keys := func(path string) ([]string, string) {
			t.Helper()
			page := get(ops, path, 200)
			var ks []string
			for _, m := range runLink.FindAllStringSubmatch(page, -1) {
				ks = append(ks, html.UnescapeString(m[1]))
			}
			next := ""
			if m := regexp.MustCompile(`id="next-page" href="([^"]+)"`).FindStringSubmatch(page); m != nil {
				next = html.UnescapeString(m[1])
			}
			return ks, next
		}
		// Newest first; runs created at the same time by key, descending.
		all := []string{"ord-3", "ticket-2", "ticket-1", "ord-2", "job-2", "ord-1"}
		for _, tt := range []struct {
			query string
			want  []string
		}{
			{"", all},
			{"?state=completed", []string{"ord-2"}},
			{"?state=awaiting_human", []string{"ticket-2", "ticket-1", "job-2"}},
			{"?action_type=email", []string{"ticket-2", "ticket-1"}},
			{"?action_type=email&state=completed", nil},
			{"?key_prefix=ord-", []string{"ord-3", "ord-2", "ord-1"}},
			{"?key_prefix=ord-&state=processing", []string{"ord-3", "ord-1"}},
			{"?older_than=60m", []string{"ord-1"}},
			{"?older_than=30m&key_prefix=ticket", []string{"ticket-2", "ticket-1"}},
			{"?older_than=1d", nil},
			{"?key=", all}, // an empty key is the list, not the Run page
		} {
			if got, _ := keys("/console/runs" + tt.query); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("/console/runs%s lists %v, want %v", tt.query, got, tt.want)
			}
		}
		// The form shows the filters given again.
		if page := get(ops, "/console/runs?state=completed&key_prefix=ord-", 200); !strings.Contains(page, `<option value="completed" selected>`) ||
			!strings.Contains(page, `name="key_prefix" value="ord-"`) {
			t.Fatalf("the form forgets the filters:\n%s", page)
		}
		// Keyset pages: every run once, in order, the filters kept on each next link.
		for _, tt := range []struct {
			first string
			want  []string
		}{
			{"/console/runs?limit=2", all},
			{"/console/runs?limit=1&key_prefix=ord-", []string{"ord-3", "ord-2", "ord-1"}},
		} {
			var got []string
			path := tt.first
			for range 10 {
				ks, next := keys(path)
				got = append(got, ks...)
				if next == "" {
					break
				}
				if strings.Contains(tt.first, "key_prefix") && !strings.Contains(next, "key_prefix=ord-") {
					t.Fatalf("the next link drops the filter: %s", next)
				}
				path = next
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("pages from %s = %v, want %v", tt.first, got, tt.want)
			}
		}
		// Each run links to its Run page.
		if rp := get(ops, "/console/runs?key=ord-2", 200); !strings.Contains(rp, "Processed?") || !strings.Contains(rp, "completed") {
			t.Fatalf("the run page:\n%s", rp)
		}
		// Bad filters: the 400 page says which and why; nothing is listed.
		for q, want := range map[string]string{
			"state=bogus":                            "The state filter must be one of",
			"older_than=soon":                        "The older_than filter must be a Go duration (36h) or days (7d)",
			"older_than=-1h":                         "The older_than filter",
			"limit=0":                                "The limit filter must be from 1 to 500",
			"after=x":                                "The after filter must be",
			"key_prefix=" + strings.Repeat("k", 201): "The key_prefix filter must be at most 200 bytes",
			"key_prefix=a%00b":                       "NUL",
		} {
			body := get(ops, "/console/runs?"+q, 400)
			if !strings.Contains(body, want) || !strings.Contains(body, "Nothing was looked up") || runLink.MatchString(body) {
				t.Errorf("/console/runs?%s:\n%s", q, body)
			}
		}

		// Pending approvals: both, whoever may decide, linked to their runs, no payload.
		ap := get(ops, "/console/approvals", 200)
		for _, want := range []string{`href="/console/runs?key=ticket-1"`, `href="/console/runs?key=ticket-2"`, "role support-lead"} {
			if !strings.Contains(ap, want) {
				t.Fatalf("pending approvals lack %q:\n%s", want, ap)
			}
		}
		if strings.Contains(ap, "Your refund") || strings.Contains(ap, ">decide<") {
			t.Fatalf("pending approvals show an operator the draft or a decision:\n%s", ap)
		}

		// This week: outstanding pending approvals and parked runs, each linked.
		wk := get(ops, "/console/week", 200)
		for _, re := range []string{
			`<a href="/console/approvals" id="outstanding-approvals"><b[^>]*>2</b> pending approvals</a>`,
			`<a href="/console/parked" id="outstanding-parked"><b[^>]*>1</b> parked run</a>`,
			`<a href="/console/runs\?state=awaiting_human" id="outstanding-waiting">`,
			`<a href="/console/effects"><b[^>]*>0</b> unknown`,
		} {
			if !regexp.MustCompile(re).MatchString(wk) {
				t.Fatalf("This week lacks %s:\n%s", re, wk)
			}
		}
		// A decided approval and an unparked run leave the counts.
		card := get(lead, "/console/approvals/"+h.approvalID("ticket-1"), 200)
		if code, body, _ := lead.do("POST", h.url+"/console/approvals/"+h.approvalID("ticket-1"), map[string][]string{"csrf": {formToken(t, card)}, "decision": {"approve"}}, nil); code != 200 {
			t.Fatalf("approve: %d\n%s", code, body)
		}
		expect(t, h.do("POST", "/v1/runs/job-2/unpark", h.operatorKey, "application/json", `{"to":"failed_terminal","reason":"done by hand"}`), 200, "")
		wk = get(ops, "/console/week", 200)
		for _, re := range []string{`id="outstanding-approvals"><b[^>]*>1</b> pending approval</a>`, `id="outstanding-parked"><b[^>]*>0</b> parked runs</a>`} {
			if !regexp.MustCompile(re).MatchString(wk) {
				t.Fatalf("after a decision and an unpark, This week lacks %s:\n%s", re, wk)
			}
		}
		if ap := get(ops, "/console/approvals", 200); strings.Contains(ap, "key=ticket-1") {
			t.Fatalf("a decided approval is still pending:\n%s", ap)
		}
	})
}
