package web_test

import (
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/store/storetest"
)

// Console query parameters with a NUL (/console?after=-1_%00,
// /console/runs?key=%00) answered 500 on PostgreSQL, and the console's resolve form
// stored any provider_id (NUL or invalid UTF-8: 500 on PostgreSQL). Every console page
// and action now checks its path, query parameters and form fields by one rule before
// anything is looked up: a 400 page, on both stores; provider_id, in every caller, is
// also refused with an invisible or bidirectional format character (422).
func TestConsoleRefusesBadTextBeforeAnyLookup(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		h.addUser("ops", "ops")
		eid := h.unknownEffect("job-1")
		ops := newBrowser(t)
		if code, _, _ := h.signIn(ops, "ops"); code != 200 {
			t.Fatalf("sign in: %d", code)
		}
		_, effPage, _ := ops.do("GET", h.url+"/console/effects", nil, nil)
		tok := formToken(t, effPage)
		before := storetest.DumpAll(t, h.env.Store)
		isPage := func(body string) bool { return strings.Contains(strings.ToLower(body), "<html") }
		for _, p := range []string{
			"/console?after=-1_%00", "/console/runs?key=%00", "/console/runs?key=job%FF1", "/console/effects?unknown_after=1_%1b",
			"/console/effects?failed_after=%00", "/console/parked?after=1_a%00", "/console/week?x%00=1", "/console/approvals/%00",
			"/console/kill-switch?done=%C0%AF", "/console/runs?key=%zz",
			"/console/runs?key_prefix=%00", "/console/runs?action_type=t%FF", "/console/runs?state=%1b", "/console/approvals?after=1_%00",
		} {
			if code, body, _ := ops.do("GET", h.url+p, nil, nil); code != 400 || !isPage(body) || !strings.Contains(body, "Nothing was looked up") {
				t.Errorf("GET %s: %d; want a 400 page", p, code)
			}
		}
		resolve := h.url + "/console/effects/" + eid + "/resolve"
		for _, c := range []struct {
			name string
			form url.Values
			want int
		}{
			{"NUL in provider_id", url.Values{"csrf": {tok}, "outcome": {"sent"}, "note": {"checked"}, "provider_id": {"p\x00"}}, 400},
			{"invalid UTF-8 in provider_id", url.Values{"csrf": {tok}, "outcome": {"sent"}, "note": {"checked"}, "provider_id": {"p\xff"}}, 400},
			{"a control character in provider_id", url.Values{"csrf": {tok}, "outcome": {"sent"}, "note": {"checked"}, "provider_id": {"p\x1b[2J"}}, 400},
			{"NUL in a field no handler reads", url.Values{"csrf": {tok}, "outcome": {"sent"}, "note": {"checked"}, "x": {"\x00"}}, 400},
			{"a right-to-left override in provider_id", url.Values{"csrf": {tok}, "outcome": {"sent"}, "note": {"checked"}, "provider_id": {"\u202e1-p"}}, 422},
			{"an over-long provider_id", url.Values{"csrf": {tok}, "outcome": {"sent"}, "note": {"checked"}, "provider_id": {strings.Repeat("p", 201)}}, 422},
		} {
			if code, body, _ := ops.do("POST", resolve, c.form, nil); code != c.want || !isPage(body) {
				t.Errorf("resolve with %s: %d; want a %d page", c.name, code, c.want)
			}
		}
		// The API refuses the same provider ids.
		for _, c := range []struct{ body, code string }{
			{`{"outcome":"sent","note":"checked","provider_id":"p\u001b"}`, "invalid_field"},
			{`{"outcome":"sent","note":"checked","provider_id":"\u202e1-p"}`, "invisible_character"},
			{`{"outcome":"sent","note":"checked","provider_id":"` + strings.Repeat("p", 201) + `"}`, "invalid_field"},
		} {
			r := h.do("POST", "/v1/effects/"+eid+"/resolve", h.operatorKey, "application/json", c.body)
			if r.body["error"] != c.code {
				t.Errorf("API resolve %.60s: %d %s; want %s", c.body, r.status, r.raw, c.code)
			}
		}
		if after := storetest.DumpAll(t, h.env.Store); after != before {
			t.Fatal("a refused request changed the database")
		}
		// Good text still goes through.
		if code, _, _ := ops.do("GET", h.url+"/console/runs?key=job-1", nil, nil); code != 200 {
			t.Fatalf("run page: %d", code)
		}
		seen := fmt.Sprint(h.get("/v1/runs/job-1").body["effects"].([]any)[0].(map[string]any)["version"])
		if code, body, _ := ops.do("POST", resolve, url.Values{"csrf": {tok}, "outcome": {"sent"}, "note": {"found it in the CRM"}, "provider_id": {"crm-77"}, "version": {seen}}, nil); code != 200 && code != 303 {
			t.Fatalf("resolve: %d\n%s", code, body)
		}
		if run := h.get("/v1/runs/job-1"); !strings.Contains(run.raw, "crm-77") {
			t.Fatalf("resolved effect: %s", run.raw)
		}
	})
}
