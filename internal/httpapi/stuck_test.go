package httpapi_test

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/accounts"
)

// TestStuckApprovalsOverHTTP: an approval for a role nobody holds is listed by
// GET /v1/approvals?undecidable=true and on the console's Stuck approvals page, counted by
// airlock_approvals_undecidable and alerted once; it leaves the list and the gauge when
// someone gets the role. On both stores.
func TestStuckApprovalsOverHTTP(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		h.addUser("ops", "ops")
		h.addUser("lead", "support-lead")
		h.propose("ok-1", "") // lead may decide this one
		if _, err := (accounts.Accounts{Store: h.env.Store, Actor: "cli:test"}).Disable(ctx, "lead"); err != nil {
			t.Fatal(err)
		}
		h.env.Clock.Advance(time.Minute)
		link := h.propose("stuck-1", "") // nobody holds support-lead now
		h.env.Clock.Advance(time.Minute)
		h.propose("stuck-2", "")
		if err := h.env.Approvals.Sweep(ctx); err != nil { // marks ok-1 too
			t.Fatal(err)
		}
		if err := h.env.Approvals.Sweep(ctx); err != nil {
			t.Fatal(err)
		}

		keys := func(path string) ([]string, string) {
			t.Helper()
			r := h.do("GET", path, h.operatorKey, "", "")
			expect(t, r, 200, "")
			var ks []string
			for _, a := range r.body["approvals"].([]any) {
				a := a.(map[string]any)
				for _, leak := range []string{"payload", "token_hash", "token"} {
					if _, ok := a[leak]; ok {
						t.Fatalf("the list shows %s: %s", leak, r.raw)
					}
				}
				if !strings.HasSuffix(a["console_url"].(string), "/console/approvals/"+a["id"].(string)) {
					t.Fatalf("console_url: %s", r.raw)
				}
				ks = append(ks, a["key"].(string))
			}
			next, _ := r.body["next_after"].(string)
			return ks, next
		}
		if got, _ := keys("/v1/approvals?undecidable=true"); !reflect.DeepEqual(got, []string{"stuck-2", "stuck-1", "ok-1"}) {
			t.Fatalf("undecidable = %v", got)
		}
		if got, _ := keys("/v1/approvals"); !reflect.DeepEqual(got, []string{"stuck-2", "stuck-1", "ok-1"}) {
			t.Fatalf("pending = %v", got)
		}
		var pages []string
		path := "/v1/approvals?undecidable=true&limit=1"
		for range 5 {
			ks, next := keys(path)
			pages = append(pages, ks...)
			if next == "" {
				break
			}
			path = "/v1/approvals?undecidable=true&limit=1&after=" + next
		}
		if !reflect.DeepEqual(pages, []string{"stuck-2", "stuck-1", "ok-1"}) {
			t.Fatalf("pages = %v", pages)
		}
		if strings.Contains(h.do("GET", "/v1/approvals?undecidable=true", h.operatorKey, "", "").raw, strings.TrimPrefix(link, h.url+"/approve/")) {
			t.Fatal("the list carries an approval token")
		}
		expect(t, h.get("/v1/approvals?undecidable=true"), 403, "forbidden") // a runs key is no operator
		for _, bad := range []string{"undecidable=yes", "limit=0", "limit=501", "after=x", "after=12_"} {
			expect(t, h.do("GET", "/v1/approvals?"+bad, h.operatorKey, "", ""), 400, "invalid_field")
		}

		metric := func(want ...string) {
			t.Helper()
			h.env.Alerts.Flush(t) // the relay raises alerts in the background
			text := h.do("GET", "/metrics", "", "", "").raw
			for _, w := range want {
				if !strings.Contains(text, w+"\n") {
					t.Fatalf("metrics lack %q:\n%s", w, grepLines(text, "undecidable"))
				}
			}
		}
		metric("airlock_approvals_undecidable 3", `airlock_alerts_total{kind="approval_undecidable"} 3`)
		for _, key := range []string{"stuck-1", "ok-1"} {
			n := 0
			evs, _ := h.env.Store.EventList(ctx, key, 0, 1000)
			for _, e := range evs {
				if e.Kind == "approval_undecidable" {
					n++
				}
			}
			if n != 1 {
				t.Fatalf("%s has %d approval_undecidable events after two sweeps, want 1", key, n)
			}
		}

		// The console lists them for operators, linked.
		ops := newBrowser(t)
		if code, _, _ := h.signIn(ops, "ops"); code != 200 {
			t.Fatalf("sign in: %d", code)
		}
		code, page, _ := ops.do("GET", h.url+"/console/stuck", nil, nil)
		if code != 200 || !strings.Contains(page, `href="/console/runs?key=stuck-1"`) || !strings.Contains(page, "role support-lead") ||
			!strings.Contains(page, `href="/console/approvals/`) || !strings.Contains(page, `href="/console/stuck"`) {
			t.Fatalf("stuck page: %d\n%s", code, page)
		}

		week := func(want string) {
			t.Helper()
			code, page, _ := ops.do("GET", h.url+"/console/week", nil, nil)
			if code != 200 || !strings.Contains(page, `<a href="/console/stuck" id="outstanding-undecidable">`) || !strings.Contains(page, want) {
				t.Fatalf("This week's Outstanding now lacks %q: %d\n%s", want, code, grepLines(page, "outstanding"))
			}
		}
		week(">3</b> nobody can decide")

		// Someone gets the role: nothing is stuck any more.
		h.addUser("lea", "support-lead")
		if err := h.env.Approvals.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
		if got, _ := keys("/v1/approvals?undecidable=true"); got != nil {
			t.Fatalf("undecidable after lea = %v", got)
		}
		metric("airlock_approvals_undecidable 0")
		week(">0</b> nobody can decide")
		if _, page, _ := ops.do("GET", h.url+"/console/stuck", nil, nil); !strings.Contains(page, "No stuck approvals.") {
			t.Fatalf("stuck page after lea:\n%s", page)
		}
		lead := newBrowser(t)
		if code, _, _ := h.signIn(lead, "lead"); code == 200 {
			t.Fatal("a disabled account signed in")
		}
	})
}

func grepLines(text, word string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, word) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
