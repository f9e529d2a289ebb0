package web_test

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/store"
)

// unknownEffect claims key, queues a worker task, and leaves it unknown; it returns the
// effect's id.
func (h *harness) unknownEffect(key string) string {
	h.t.Helper()
	owner, v := h.claim(key)
	expect(h.t, h.post("/v1/runs/"+key+"/effects", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"action_type":"task","target":"slack","payload":{"msg":"hi"}}`, owner, v)), 201, "")
	c := h.do("POST", "/v1/effects/claim", h.workerKey, "application/json", `{"types":["task"],"lease_seconds":60}`)
	expect(h.t, c, 200, "")
	id, lo := c.body["id"].(string), c.body["lease_owner"].(string)
	expect(h.t, h.do("POST", "/v1/effects/"+id+"/unknown", h.workerKey, "application/json", `{"lease_owner":"`+lo+`","class":"timeout"}`), 200, "")
	return id
}

// parked claims key and reports unknown_commit: the run is parked.
func (h *harness) parked(key string) {
	h.t.Helper()
	owner, v := h.claim(key)
	r := h.post("/v1/runs/"+key+"/failures", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"class":"unknown_commit"}`, owner, v))
	expect(h.t, r, 200, "")
	if run := h.get("/v1/runs/" + key); run.body["state"] != "awaiting_human" || run.body["park_reason"] != "unknown_commit" {
		h.t.Fatalf("not parked: %s", run.raw)
	}
}

func (h *harness) lastEvent(key, kind string) store.Event {
	h.t.Helper()
	evs, err := h.env.Store.EventList(context.Background(), key, 0, 1000)
	if err != nil {
		h.t.Fatal(err)
	}
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Kind == kind {
			return evs[i]
		}
	}
	h.t.Fatalf("no %s event on %q", kind, key)
	return store.Event{}
}

func TestUnparkRoute(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		h.parked("job-9")
		body := `{"to":"failed_retryable","reason":"the CRM has no such note"}`
		expect(t, h.do("POST", "/v1/runs/job-9/unpark", h.runsKey, "application/json", body), 403, "forbidden")
		expect(t, h.do("POST", "/v1/runs/job-9/unpark", h.operatorKey, "application/json", `{"to":"completed","reason":"x"}`), 400, "invalid_field")
		expect(t, h.do("POST", "/v1/runs/job-9/unpark", h.operatorKey, "application/json", `{"to":"failed_terminal","reason":" "}`), 400, "invalid_field")
		expect(t, h.do("POST", "/v1/runs/nope/unpark", h.operatorKey, "application/json", body), 404, "run_not_found")
		r := h.do("POST", "/v1/runs/job-9/unpark", h.operatorKey, "application/json", body)
		expect(t, r, 200, "")
		if r.body["state"] != "failed_retryable" {
			t.Fatalf("unpark: %s", r.raw)
		}
		expect(t, h.do("POST", "/v1/runs/job-9/unpark", h.operatorKey, "application/json", body), 409, "not_parked")
		if e := h.lastEvent("job-9", "run_unparked"); e.Actor != "apikey:oncall" || !strings.Contains(string(e.Detail), "the CRM has no such note") {
			t.Fatalf("event: %+v %s", e, e.Detail)
		}
		// The next delivery takes it again.
		if c := h.post("/v1/runs/claim", `{"key":"job-9","payload":{"ticket":42}}`); c.status != 201 || c.body["reclaimed"] != true {
			t.Fatalf("claim after unpark: %d %s", c.status, c.raw)
		}
	})
}

var csrfField = regexp.MustCompile(`name="csrf" value="([0-9a-f]{64})"`)

// formToken reads the console's form token from a page of the person's own console.
func formToken(t *testing.T, page string) string {
	t.Helper()
	m := csrfField.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no form token on the page:\n%s", page)
	}
	return m[1]
}

// TestConsoleRoles signs in as each role over HTTP: each sees only its pages and
// buttons, and a forged POST from a role that may not act (with its own valid form
// token, from the same origin) is 403 and changes nothing.
func TestConsoleRoles(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		h.addUser("lead", "support-lead")
		h.addUser("ops", "ops")
		h.addUser("sre", "sre")
		h.addUser("guest", "visitor")
		h.propose("ticket-7", "")
		oldLink := h.propose("ticket-8", "")
		eid := h.unknownEffect("job-1")
		h.parked("job-2")

		anon := newBrowser(t)
		if code, _, hdr := anon.do("GET", h.url+"/console", nil, nil); code != 303 || hdr.Get("Location") != "/login" {
			t.Fatalf("anonymous console: %d %v", code, hdr)
		}
		if code, _, _ := anon.do("POST", h.url+"/console/effects/"+eid+"/resolve", url.Values{"outcome": {"abandon"}, "note": {"x"}}, nil); code != 403 {
			t.Fatalf("anonymous resolve: %d", code)
		}

		as := func(name string) *browser {
			b := newBrowser(t)
			if code, _, _ := h.signIn(b, name); code != 200 {
				t.Fatalf("sign in %s: %d", name, code)
			}
			return b
		}
		lead, ops, sre, guest := as("lead"), as("ops"), as("sre"), as("guest")
		get := func(b *browser, path string, want int) string {
			t.Helper()
			code, body, hdr := b.do("GET", h.url+path, nil, nil)
			if code != want {
				t.Fatalf("GET %s: %d, want %d\n%s", path, code, want, body)
			}
			if !strings.Contains(hdr.Get("Content-Security-Policy"), "frame-ancestors 'none'") || hdr.Get("Cache-Control") != "no-store" {
				t.Fatalf("GET %s: security headers missing: %v", path, hdr)
			}
			return body
		}

		// An approver sees their approval, and nothing of the operators' pages.
		page := get(lead, "/console", 200)
		if !strings.Contains(page, "ticket-7") || strings.Contains(page, "/console/effects") || strings.Contains(page, "Kill switch") {
			t.Fatalf("the approver's console:\n%s", page)
		}
		for _, p := range []string{"/console/effects", "/console/parked", "/console/runs?key=job-1", "/console/kill-switch", "/console/week"} {
			if body := get(lead, p, 403); strings.Contains(body, "job-1") || strings.Contains(body, "job-2") {
				t.Fatalf("%s shows the approver something:\n%s", p, body)
			}
		}
		// Someone with no console role and no approver role sees an empty list.
		if page := get(guest, "/console", 200); strings.Contains(page, "ticket-7") {
			t.Fatalf("a stranger sees the approval:\n%s", page)
		}
		// The operators see the queue and the parked run, and no approval they may not decide.
		if page := get(ops, "/console", 200); strings.Contains(page, "ticket-7") {
			t.Fatalf("an operator sees an approval they may not decide:\n%s", page)
		}
		effPage := get(ops, "/console/effects", 200)
		if !strings.Contains(effPage, "job-1") || !strings.Contains(effPage, `action="/console/effects/`+eid+`/resolve"`) {
			t.Fatalf("effects page:\n%s", effPage)
		}
		if page := get(ops, "/console/parked", 200); !strings.Contains(page, "job-2") || !strings.Contains(page, `action="/console/runs/job-2/unpark"`) {
			t.Fatalf("parked page:\n%s", page)
		}
		// The kill switch: operators see it, without a button.
		ksOps := get(ops, "/console/kill-switch", 200)
		if strings.Contains(ksOps, `action="/console/kill-switch"`) || strings.Contains(ksOps, "Stop sending") {
			t.Fatalf("an operator is offered the kill switch:\n%s", ksOps)
		}
		if ks := get(sre, "/console/kill-switch", 200); !strings.Contains(ks, "Stop sending") {
			t.Fatalf("an admin is not offered the kill switch:\n%s", ks)
		}

		// An approval's card is only for those who may decide it, in the console too.
		if body := get(ops, "/console/approvals/"+h.approvalID("ticket-7"), 403); strings.Contains(body, "Your refund") {
			t.Fatalf("an operator sees the draft:\n%s", body)
		}
		// A note with a NUL (PostgreSQL cannot store it) is refused, not a 500.
		post := func(b *browser, path string, form url.Values, want int) string {
			t.Helper()
			code, body, _ := b.do("POST", h.url+path, form, nil)
			if code != want {
				t.Fatalf("POST %s: %d, want %d\n%s", path, code, want, body)
			}
			return body
		}
		post(ops, "/console/effects/"+eid+"/resolve", url.Values{"csrf": {formToken(t, effPage)}, "outcome": {"abandon"}, "note": {"a\x00b"}}, 400)

		// Forged posts: the approver, with their own valid token, cannot resolve or unpark;
		// the operator, with theirs, cannot flip the kill switch.
		leadTok := formToken(t, get(lead, "/console/approvals/"+h.approvalID("ticket-7"), 200))
		opsTok := formToken(t, effPage)
		post(lead, "/console/effects/"+eid+"/resolve", url.Values{"csrf": {leadTok}, "outcome": {"abandon"}, "note": {"forged"}}, 403)
		post(lead, "/console/runs/job-2/unpark", url.Values{"csrf": {leadTok}, "to": {"failed_terminal"}, "reason": {"forged"}}, 403)
		post(ops, "/console/kill-switch", url.Values{"csrf": {opsTok}, "scope": {"global"}, "enabled": {"false"}, "reason": {"forged"}}, 403)
		// Without the token, with another session's token, or from another origin: refused.
		post(ops, "/console/effects/"+eid+"/resolve", url.Values{"outcome": {"abandon"}, "note": {"no token"}}, 403)
		post(ops, "/console/effects/"+eid+"/resolve", url.Values{"csrf": {leadTok}, "outcome": {"abandon"}, "note": {"lead's token"}}, 403)
		if code, _, _ := ops.do("POST", h.url+"/console/effects/"+eid+"/resolve", url.Values{"csrf": {opsTok}, "outcome": {"abandon"}, "note": {"x"}},
			map[string]string{"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}); code != 403 {
			t.Fatalf("cross-site resolve: %d", code)
		}
		if run := h.get("/v1/runs/job-1"); run.body["effects"].([]any)[0].(map[string]any)["state"] != "unknown" {
			t.Fatalf("a refused post changed the effect: %s", run.raw)
		}
		if run := h.get("/v1/runs/job-2"); run.body["state"] != "awaiting_human" {
			t.Fatalf("a refused post unparked the run: %s", run.raw)
		}
		if ok, _ := h.env.Effects.Enabled(context.Background(), ""); !ok {
			t.Fatal("a refused post flipped the kill switch")
		}

		// The operator acts: a reason is required; then the effect is resolved and the run unparked.
		if body := post(ops, "/console/effects/"+eid+"/resolve", url.Values{"csrf": {opsTok}, "outcome": {"sent"}, "note": {" "}}, 422); !strings.Contains(body, "required") {
			t.Fatalf("resolve without a note:\n%s", body)
		}
		// The form carries the version the page showed: one the effect has left is refused.
		seen := fmt.Sprint(h.get("/v1/runs/job-1").body["effects"].([]any)[0].(map[string]any)["version"])
		if body := post(ops, "/console/effects/"+eid+"/resolve", url.Values{"csrf": {opsTok}, "outcome": {"sent"}, "note": {"x"}}, 422); !strings.Contains(body, "version") {
			t.Fatalf("resolve without the form's version:\n%s", body)
		}
		if body := post(ops, "/console/effects/"+eid+"/resolve", url.Values{"csrf": {opsTok}, "outcome": {"not_sent"}, "note": {"x"}, "version": {"1"}}, 409); !strings.Contains(body, "changed") {
			t.Fatalf("resolve on a version the effect has left:\n%s", body)
		}
		post(ops, "/console/effects/"+eid+"/resolve", url.Values{"csrf": {opsTok}, "outcome": {"sent"}, "provider_id": {"ts-9"}, "note": {"seen in Slack"}, "version": {seen}}, 303)
		eff := h.get("/v1/runs/job-1").body["effects"].([]any)[0].(map[string]any)
		if eff["state"] != "completed" || eff["provider_id"] != "ts-9" {
			t.Fatalf("after resolving: %v", eff)
		}
		if e := h.lastEvent("job-1", "effect_resolved"); e.Actor != "console:ops" || !strings.Contains(string(e.Detail), "seen in Slack") {
			t.Fatalf("resolve event: %+v %s", e, e.Detail)
		}
		post(ops, "/console/effects/"+eid+"/resolve", url.Values{"csrf": {opsTok}, "outcome": {"sent"}, "provider_id": {"ts-9"}, "note": {"again"}, "version": {seen}}, 409)
		post(ops, "/console/runs/job-2/unpark", url.Values{"csrf": {opsTok}, "to": {"failed_terminal"}, "reason": {"sent by hand"}}, 303)
		if run := h.get("/v1/runs/job-2"); run.body["state"] != "failed_terminal" {
			t.Fatalf("after unparking: %s", run.raw)
		}
		if e := h.lastEvent("job-2", "run_unparked"); e.Actor != "console:ops" {
			t.Fatalf("unpark event: %+v", e)
		}

		// The admin stops every send, with a reason.
		sreTok := formToken(t, get(sre, "/console/kill-switch", 200))
		post(sre, "/console/kill-switch", url.Values{"csrf": {sreTok}, "scope": {"global"}, "enabled": {"false"}, "reason": {"incident 42"}}, 303)
		if ok, _ := h.env.Effects.Enabled(context.Background(), ""); ok {
			t.Fatal("the admin's kill switch did not stop sends")
		}
		if ks := get(ops, "/console/kill-switch", 200); !strings.Contains(ks, "console:sre") || !strings.Contains(ks, "incident 42") {
			t.Fatalf("the kill switch page does not say who and why:\n%s", ks)
		}

		// The approver decides from the console, through the same rules as the link.
		card := get(lead, "/console/approvals/"+h.approvalID("ticket-7"), 200)
		post(lead, "/console/approvals/"+h.approvalID("ticket-7"), url.Values{"csrf": {formToken(t, card)}, "decision": {"approve"}}, 200)
		if run := h.get("/v1/runs/ticket-7"); run.body["state"] != "approved" {
			t.Fatalf("after deciding in the console: %s", run.raw)
		}
		if page := get(lead, "/console", 200); strings.Contains(page, "ticket-7") {
			t.Fatalf("a decided approval is still waiting:\n%s", page)
		}

		// Re-issuing a link: not by someone who may not decide it (with their own token);
		// by the approver, who gets a new link once; the old one dies.
		guestTok := formToken(t, get(guest, "/console/kill-switch", 403))
		post(guest, "/console/approvals/"+h.approvalID("ticket-8")+"/reissue", url.Values{"csrf": {guestTok}}, 403)
		post(ops, "/console/approvals/"+h.approvalID("ticket-8")+"/reissue", url.Values{"csrf": {opsTok}}, 403)
		if code, _, _ := lead.do("GET", oldLink, nil, nil); code != 200 {
			t.Fatalf("a refused reissue killed the link: %d", code)
		}
		card8 := get(lead, "/console/approvals/"+h.approvalID("ticket-8"), 200)
		if !strings.Contains(card8, "Re-issue the link") {
			t.Fatalf("the card offers no reissue:\n%s", card8)
		}
		page = post(lead, "/console/approvals/"+h.approvalID("ticket-8")+"/reissue", url.Values{"csrf": {formToken(t, card8)}}, 200)
		newLink := regexp.MustCompile(`http://[^<"]*/approve/[A-Za-z0-9_-]{43}`).FindString(page)
		if newLink == "" || newLink == oldLink {
			t.Fatalf("the reissue page shows no new link:\n%s", page)
		}
		if code, _, _ := lead.do("GET", oldLink, nil, nil); code != 404 {
			t.Fatalf("the old link after reissue: %d", code)
		}
		if code, _, _ := lead.do("GET", newLink, nil, nil); code != 200 {
			t.Fatalf("the new link: %d", code)
		}
		if e := h.lastEvent("ticket-8", "approval_link_reissued"); e.Actor != "console:lead" {
			t.Fatalf("reissue event: %+v", e)
		}

		// The run page answers explain's four questions.
		rp := get(ops, "/console/runs?key=job-2", 200)
		for _, want := range []string{"Processed?", "Sent?", "Who approved?", "Which model?", "run_unparked", "sent by hand"} {
			if !strings.Contains(rp, want) {
				t.Fatalf("the run page lacks %q:\n%s", want, rp)
			}
		}
		get(ops, "/console/runs?key=nope", 404)
		if wk := get(ops, "/console/week", 200); !strings.Contains(wk, "<svg") || !strings.Contains(wk, "Duplicate-delivery rate") {
			t.Fatalf("the week page:\n%s", wk)
		}
	})
}

// approvalID is the id of the run's only approval.
func (h *harness) approvalID(key string) string {
	h.t.Helper()
	aps, err := h.env.Store.ApprovalsByRun(context.Background(), key)
	if err != nil || len(aps) == 0 {
		h.t.Fatalf("approvals of %s: %v %v", key, aps, err)
	}
	return aps[len(aps)-1].ID
}
