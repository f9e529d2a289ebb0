package web_test

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"
)

// tile reads the number before an Outstanding now line (its link's id) on This week.
func tile(t *testing.T, page, id string) string {
	t.Helper()
	m := regexp.MustCompile(`id="` + id + `"><b[^>]*>([0-9+]+)</b>`).FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("This week has no %s line:\n%s", id, page)
	}
	return m[1]
}

// Issue 34 items 3 and 4: a run whose holder died (lease lapsed, nothing completed it) is
// counted in Outstanding now, listed by the Runs filter, and re-driven by an operator;
// runs that ended without their effect and effects approved but never taken are counted
// and linked; the duplicate tile says what it counts in words.
func TestConsoleStalledAndOutstanding(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		h.addUser("ops", "ops")
		ops := newBrowser(t)
		if code, _, _ := h.signIn(ops, "ops"); code != 200 {
			t.Fatalf("sign in: %d", code)
		}
		get := func(path string, want int) string {
			t.Helper()
			code, body, _ := ops.do("GET", h.url+path, nil, nil)
			if code != want {
				t.Fatalf("GET %s: %d, want %d\n%s", path, code, want, body)
			}
			return body
		}
		week := get("/console/week", 200)
		for _, id := range []string{"outstanding-stalled", "outstanding-released", "outstanding-failed", "outstanding-rejected", "outstanding-unsent"} {
			if got := tile(t, week, id); got != "0" {
				t.Errorf("an empty airlock counts %s %s", got, id)
			}
		}

		// A worker task queued and never taken; a run that fails for good without
		// sending anything; a delivery twice (one duplicate).
		owner, v := h.claim("task-1")
		expect(t, h.post("/v1/runs/task-1/effects", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"action_type":"task","target":"default","payload":{"msg":"hi"}}`, owner, v)), 201, "")
		owner, v = h.claim("ft-1")
		expect(t, h.post("/v1/runs/ft-1/transition", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"to":"failed_terminal"}`, owner, v)), 200, "")
		if r := h.post("/v1/runs/claim", `{"key":"ft-1","payload":{"ticket":42}}`); r.status == 201 {
			t.Fatalf("a finished run was claimed again: %s", r.raw)
		}
		// n8n dies mid-execution: claimed, then nothing.
		n8nOwner, _ := h.claim("n8n-1")
		h.env.Clock.Advance(11 * time.Minute) // past the lease and the unsent threshold
		h.claim("live-1")

		week = get("/console/week", 200)
		// Stalled: n8n-1, and task-1, whose workflow stopped heartbeating while its task
		// waited (it can complete only once the task is done).
		for id, want := range map[string]string{"outstanding-stalled": "2", "outstanding-failed": "1", "outstanding-unsent": "1", "outstanding-released": "0"} {
			if got := tile(t, week, id); got != want {
				t.Errorf("%s counts %s, want %s", id, got, want)
			}
		}
		for _, want := range []string{`href="/console/runs?stalled=true" id="outstanding-stalled"`, `href="/console/effects#waiting" id="outstanding-unsent"`,
			`href="/console/runs?state=failed_terminal" id="outstanding-failed"`, "1 of 5 deliveries was a duplicate"} {
			if !strings.Contains(week, want) {
				t.Errorf("This week lacks %q:\n%s", want, week)
			}
		}
		if strings.Contains(week, "claims + duplicates") {
			t.Errorf("the duplicate tile still says claims + duplicates")
		}
		if effs := get("/console/effects", 200); !strings.Contains(effs, `id="waiting-effects"`) || !strings.Contains(effs, "task-1") {
			t.Errorf("the effects page does not list the waiting task:\n%s", effs)
		}

		// The Runs filter lists the stalled runs only, marked; so does the API.
		list := get("/console/runs?stalled=true", 200)
		if !strings.Contains(list, "n8n-1") || !strings.Contains(list, "task-1") || strings.Contains(list, "live-1") || strings.Contains(list, "ft-1") ||
			strings.Count(list, `<b class="stalled">stalled</b>`) != 2 {
			t.Fatalf("the stalled filter lists:\n%s", list)
		}
		if !strings.Contains(list, `id="stalled-only" checked`) {
			t.Errorf("the filter form does not show the stalled filter as set")
		}
		api := h.get("/v1/runs?stalled=true")
		keys := map[any]bool{}
		for _, r := range api.body["runs"].([]any) {
			keys[r.(map[string]any)["key"]] = true
		}
		if len(keys) != 2 || !keys["n8n-1"] || !keys["task-1"] {
			t.Fatalf("GET /v1/runs?stalled=true: %s", api.raw)
		}
		expect(t, h.get("/v1/runs?stalled=yes"), 400, "invalid_field")

		// One alert per stall, from the sweep.
		for range 2 {
			if err := h.env.Runs.SweepStalled(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		if e := h.lastEvent("n8n-1", "alert"); !strings.Contains(string(e.Detail), `"run_stalled"`) {
			t.Fatalf("alert: %s", e.Detail)
		}

		// The Run page offers the re-drive and the rerun protocol; the live run neither.
		run := get("/console/runs?key=n8n-1", 200)
		for _, want := range []string{`id="stalled"`, `action="/console/runs/n8n-1/redrive"`, "Release for redelivery", "Give it up", `id="rerun-protocol"`, "Rerun protocol"} {
			if !strings.Contains(run, want) {
				t.Errorf("the stalled run's page lacks %q", want)
			}
		}
		if live := get("/console/runs?key=live-1", 200); strings.Contains(live, `id="redrive"`) || !strings.Contains(live, `id="rerun-protocol"`) {
			t.Errorf("the live run's page offers a re-drive, or lacks the rerun protocol")
		}
		post := func(path string, form url.Values, want int) (string, string) {
			t.Helper()
			code, body, hdr := ops.do("POST", h.url+path, form, nil)
			if code != want {
				t.Fatalf("POST %s: %d, want %d\n%s", path, code, want, body)
			}
			return body, hdr.Get("Location")
		}
		tok := formToken(t, run)
		post("/console/runs/n8n-1/redrive", url.Values{"csrf": {tok}, "to": {"failed_retryable"}, "reason": {" "}}, 422)
		post("/console/runs/live-1/redrive", url.Values{"csrf": {tok}, "to": {"failed_retryable"}, "reason": {"x"}}, 409)
		_, loc := post("/console/runs/n8n-1/redrive", url.Values{"csrf": {tok}, "to": {"failed_retryable"}, "reason": {"n8n was killed mid-execution"}}, 303)
		if loc != "/console/runs?key=n8n-1&done=released" {
			t.Errorf("after the re-drive: Location %q", loc)
		}
		if body, _ := post("/console/runs/n8n-1/redrive", url.Values{"csrf": {tok}, "to": {"failed_retryable"}, "reason": {"again"}}, 409); !strings.Contains(body, "not stalled") {
			t.Errorf("a second re-drive says:\n%s", body)
		}
		if e := h.lastEvent("n8n-1", "run_redriven"); e.Actor != "console:ops" || !strings.Contains(string(e.Detail), "n8n was killed mid-execution") {
			t.Fatalf("event: %+v %s", e, e.Detail)
		}
		week = get("/console/week", 200)
		if tile(t, week, "outstanding-stalled") != "1" || tile(t, week, "outstanding-released") != "1" {
			t.Errorf("after the release This week says:\n%s", week)
		}
		// Neither the alert nor the re-drive records the lease owner (the holder's
		// credential), in the events or the log.
		evs, err := h.env.Store.EventList(context.Background(), "n8n-1", 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			if strings.Contains(string(e.Detail), n8nOwner) || strings.Contains(string(e.Meta), n8nOwner) {
				t.Errorf("the %s event carries the lease owner: %s", e.Kind, e.Detail)
			}
		}
		if strings.Contains(h.logs.String(), n8nOwner) {
			t.Errorf("the log carries the lease owner")
		}
		// The next delivery takes it at once.
		if c := h.post("/v1/runs/claim", `{"key":"n8n-1","payload":{"ticket":42}}`); c.status != 201 {
			t.Fatalf("claim after the re-drive: %d %s", c.status, c.raw)
		}
		// An approver cannot re-drive.
		h.addUser("lead", "support-lead")
		lead := newBrowser(t)
		h.signIn(lead, "lead")
		_, leadPage, _ := lead.do("GET", h.url+"/console", nil, nil)
		if code, _, _ := lead.do("POST", h.url+"/console/runs/live-1/redrive", url.Values{"csrf": {formToken(t, leadPage)}, "to": {"failed_terminal"}, "reason": {"forged"}}, nil); code != 403 {
			t.Errorf("an approver's re-drive: %d", code)
		}
	})
}

// Issue 34 item 2: an unknown effect's card shows the error, the idempotency key the
// provider saw, the payload as far as log_fields allow (other fields by hash only), and
// what to check before resolving.
func TestConsoleUnknownEffectCard(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		h.addUser("ops", "ops")
		ops := newBrowser(t)
		h.signIn(ops, "ops")
		id := h.unknownEffect("job-1")
		run := h.get("/v1/runs/job-1")
		effectID := run.body["effects"].([]any)[0].(map[string]any)["effect_id"].(string)
		code, page, _ := ops.do("GET", h.url+"/console/effects", nil, nil)
		if code != 200 {
			t.Fatalf("effects page: %d", code)
		}
		_, item, _ := strings.Cut(page, `id="effect-`+id+`"`)
		item, _, _ = strings.Cut(item, "</form>")
		for _, want := range []string{`<dd class="error-detail">timeout · 1 attempt`, `<code class="provider-key">job-1/` + effectID + `</code>`,
			"<dt>msg</dt>", "not shown (not in log_fields): sha256:", "Check before resolving", "In the worker&#39;s system", "job-1/" + effectID + "; the worker passes",
			"resolve as not sent"} {
			if !strings.Contains(item, want) {
				t.Errorf("the unknown effect's card lacks %q:\n%s", want, item)
			}
		}
		if strings.Contains(item, ">hi<") {
			t.Errorf("the card shows a payload field outside log_fields:\n%s", item)
		}
	})
}
