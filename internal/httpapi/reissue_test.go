package httpapi_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// A lost 202 used to lose the approval link for good (the retry got
// version_conflict). The same effect request again now answers with the pending approval
// and a fresh link; the old link stops working at once.
func TestResentEffectRequestReissuesTheApprovalLink(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		h.addUser("lead", "support-lead")
		lead := newBrowser(t)
		h.signIn(lead, "lead")
		live := func(link string) bool {
			t.Helper()
			code, _, _ := lead.do("GET", link, nil, nil)
			if code != http.StatusOK && code != http.StatusNotFound {
				t.Fatalf("GET %s: %d", link, code)
			}
			return code == http.StatusOK
		}
		owner, v := h.claim("rs-1")
		body := fmt.Sprintf(`{"lease_owner":"%s","version":%d,"action_type":"email","target":"default","payload":{"to":"ana@example.com","text":"Your refund"}}`, owner, v)
		first := h.post("/v1/runs/rs-1/effects", body)
		expect(t, first, 202, "")
		link1 := first.body["approve_url"].(string)
		links := []string{link1}

		// The 202 is "lost": the client sends the very same request again.
		again := h.post("/v1/runs/rs-1/effects", body)
		expect(t, again, 202, "")
		link2, _ := again.body["approve_url"].(string)
		if again.body["approval_id"] != first.body["approval_id"] || link2 == "" || link2 == link1 ||
			again.body["reissued"] != true || again.body["state"] != "awaiting_human" || again.body["version"] != first.body["version"] {
			t.Fatalf("re-send: %s (first %s)", again.raw, first.raw)
		}
		links = append(links, link2)
		if live(link1) || !live(link2) {
			t.Fatalf("after a reissue: old link live %v, new link live %v", live(link1), live(link2))
		}
		// Deciding with the old link does nothing.
		if code := h.decide(lead, link1, "approve"); code != http.StatusNotFound {
			t.Fatalf("approve with the old link: %d", code)
		}

		// The same effect id with another payload is still a conflict, and reissues nothing.
		other := strings.Replace(body, "Your refund", "Something else", 1)
		expect(t, h.post("/v1/runs/rs-1/effects", other), 409, "effect_mismatch")
		// Another lease owner (or version) is not the same request: the usual refusal.
		expect(t, h.post("/v1/runs/rs-1/effects", strings.Replace(body, owner, "someone-else", 1)), 409, "lease_lost")
		if !live(link2) {
			t.Fatal("a refused request killed the live link")
		}

		// Two concurrent re-sends: both answer, exactly one of all the links handed out lives.
		var mu sync.Mutex
		var wg sync.WaitGroup
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := h.post("/v1/runs/rs-1/effects", body)
				if r.status != 202 {
					t.Errorf("concurrent re-send: %d %s", r.status, r.raw)
					return
				}
				mu.Lock()
				links = append(links, r.body["approve_url"].(string))
				mu.Unlock()
			}()
		}
		wg.Wait()
		var alive []string
		for _, l := range links {
			if live(l) {
				alive = append(alive, l)
			}
		}
		if len(alive) != 1 || len(links) != 4 {
			t.Fatalf("%d of %d links live after concurrent re-sends", len(alive), len(links))
		}

		// The event names the actor, never the token; neither do the logs.
		evs := h.get("/v1/runs/rs-1/events")
		if n := strings.Count(evs.raw, `"approval_link_reissued"`); n != 3 {
			t.Fatalf("%d approval_link_reissued events, want 3:\n%s", n, evs.raw)
		}
		for _, l := range links {
			token := strings.TrimPrefix(l, h.url+"/approve/")
			if strings.Contains(evs.raw, token) || strings.Contains(h.logs.String(), token) {
				t.Fatalf("token %s… is in the events or the logs", token[:6])
			}
		}
		for _, e := range evs.body["events"].([]any) {
			if ev := e.(map[string]any); ev["kind"] == "approval_link_reissued" && ev["actor"] != "apikey:n8n" {
				t.Fatalf("reissue event actor: %v", ev)
			}
		}

		// The live link decides; afterwards a re-send is refused as before.
		if code := h.decide(lead, alive[0], "approve"); code != http.StatusOK {
			t.Fatalf("approve with the live link: %d", code)
		}
		if r := h.post("/v1/runs/rs-1/effects", body); r.status != 409 {
			t.Fatalf("re-send after the decision: %d %s", r.status, r.raw)
		}
		if n := len(h.effectsOf("rs-1")); n != 1 {
			t.Fatalf("%d effects queued, want 1", n)
		}
	})
}

// The console's "resend link": POST /v1/approvals/{id}/reissue, operator scope, the same
// domain operation.
func TestReissueApprovalRoute(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		h.addUser("lead", "support-lead")
		lead := newBrowser(t)
		h.signIn(lead, "lead")
		link := h.propose("ra-1", "")
		aps := h.get("/v1/runs/ra-1/events")
		var id string
		for _, e := range aps.body["events"].([]any) {
			if ev := e.(map[string]any); ev["kind"] == "approval_requested" {
				id = ev["detail"].(map[string]any)["approval_id"].(string)
			}
		}
		path := "/v1/approvals/" + id + "/reissue"
		expect(t, h.do("POST", path, h.runsKey, "", ""), 403, "forbidden")
		expect(t, h.do("POST", "/v1/approvals/no-such-id/reissue", h.operatorKey, "", ""), 404, "approval_not_found")
		r := h.do("POST", path, h.operatorKey, "", "")
		expect(t, r, 200, "")
		fresh, _ := r.body["approve_url"].(string)
		if fresh == "" || fresh == link || r.body["approval_id"] != id || r.body["key"] != "ra-1" {
			t.Fatalf("reissue: %s", r.raw)
		}
		if code, _, _ := lead.do("GET", link, nil, nil); code != http.StatusNotFound {
			t.Fatalf("old link after reissue: %d", code)
		}
		if code := h.decide(lead, fresh, "approve"); code != http.StatusOK {
			t.Fatalf("approve with the fresh link: %d", code)
		}
		expect(t, h.do("POST", path, h.operatorKey, "", ""), 409, "approval_not_pending")
		evs := h.get("/v1/runs/ra-1/events").raw
		if !strings.Contains(evs, `"actor":"apikey:oncall"`) || strings.Contains(evs, strings.TrimPrefix(fresh, h.url+"/approve/")) {
			t.Fatalf("events: %s", evs)
		}
	})
}

// act_with_window: the same request again gets a fresh cancel link while the window is
// open (it used to get none), and none once the window closed.
func TestResentWindowRequestGetsAFreshCancelLink(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		h.addUser("lead", "support-lead")
		lead := newBrowser(t)
		h.signIn(lead, "lead")
		owner, v := h.claim("rw-1")
		body := fmt.Sprintf(`{"lease_owner":"%s","version":%d,"action_type":"digest","target":"default","payload":{"week":48}}`, owner, v)
		first := h.post("/v1/runs/rw-1/effects", body)
		expect(t, first, 201, "")
		c1 := first.body["cancel_url"].(string)
		again := h.post("/v1/runs/rw-1/effects", body)
		expect(t, again, 200, "")
		c2, _ := again.body["cancel_url"].(string)
		if c2 == "" || c2 == c1 || again.body["created"] != false || again.body["reissued"] != true {
			t.Fatalf("re-send: %s", again.raw)
		}
		if code, _, _ := lead.do("GET", c1, nil, nil); code != http.StatusNotFound {
			t.Fatalf("old cancel link: %d", code)
		}
		if code, _, _ := lead.do("GET", c2, nil, nil); code != http.StatusOK {
			t.Fatalf("fresh cancel link: %d", code)
		}
		expect(t, h.post("/v1/runs/rw-1/effects", strings.Replace(body, `"week":48`, `"week":49`, 1)), 409, "effect_mismatch")

		// Cancelled through the fresh link: the window is closed, a re-send gets no link.
		if code := h.decide(lead, c2, "cancel"); code != http.StatusOK {
			t.Fatalf("cancel with the fresh link: %d", code)
		}
		late := h.post("/v1/runs/rw-1/effects", body)
		if late.status != 200 || late.body["cancel_url"] != nil || late.body["effect"].(map[string]any)["state"] != "cancelled" {
			t.Fatalf("re-send after the window: %d %s", late.status, late.raw)
		}
		h.env.Clock.Advance(11 * time.Minute)
		h.tick()
		if h.env.Provider.Total() != 0 {
			t.Fatal("a cancelled effect was sent")
		}
	})
}

// Every change has its event: a cancel window that closes unused (the approval row is
// consumed as expired) says so on the run's timeline.
func TestClosedWindowHasItsEvent(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		owner, v := h.claim("wc-1")
		r := h.post("/v1/runs/wc-1/effects", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"action_type":"digest","target":"default","payload":{"week":48}}`, owner, v))
		expect(t, r, 201, "")
		h.env.Clock.Advance(11 * time.Minute)
		if err := h.env.Approvals.ExpireDue(context.Background()); err != nil {
			t.Fatal(err)
		}
		aps, err := h.env.Store.ApprovalsByRun(context.Background(), "wc-1")
		if err != nil || len(aps) != 1 || aps[0].Decision != "expired" {
			t.Fatalf("window approval: %+v %v", aps, err)
		}
		evs := h.get("/v1/runs/wc-1/events").raw
		if !strings.Contains(evs, `"cancel_window_closed"`) || !strings.Contains(evs, aps[0].ID) {
			t.Fatalf("no cancel_window_closed event naming the approval:\n%s", evs)
		}
	})
}
