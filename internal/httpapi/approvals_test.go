package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/accounts"
	"github.com/airlockhq/airlock/internal/apikeys"
	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/store"
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
	if method == "POST" {
		// What a browser sends with a form post from airlock's own page; a test
		// removes it with an empty value.
		req.Header.Set("Origin", req.URL.Scheme+"://"+req.URL.Host)
	}
	for k, v := range header {
		if v == "" {
			req.Header.Del(k)
			continue
		}
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
	if err := accounts.CreateUser(context.Background(), h.env.Store, name, "correct horse battery", roles); err != nil {
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
		if code != http.StatusForbidden || !strings.Contains(page, "not one of the approvers") || strings.Contains(page, "Your refund") || strings.Contains(page, "ana@example.com") {
			t.Fatalf("page for the wrong role: %d %s", code, page)
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
		if code, page, _ := lead.do("GET", h.url+"/approve/continue", nil, nil); code != 200 || !strings.Contains(page, "Approve and send") ||
			!strings.Contains(page, "<code>"+aps[0].PayloadHash+"</code>") {
			t.Fatalf("continue page (with the payload hash %s): %d %s", aps[0].PayloadHash, code, page)
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
		// The decision names the payload hash it is bound to, in the run's hash chain.
		bound := false
		for _, ev := range h.get("/v1/runs/ticket-1/events").body["events"].([]any) {
			ev := ev.(map[string]any)
			if d, _ := ev["detail"].(map[string]any); ev["kind"] == "approval_decided" && d["payload_hash"] == aps[0].PayloadHash {
				bound = true
			}
		}
		if !bound {
			t.Fatal("the approval_decided event does not carry the payload hash")
		}
		if c, err := audit.New(h.env.Store, nil).VerifyChain(context.Background(), "ticket-1"); err != nil || !c.OK || c.Chained == 0 {
			t.Fatalf("the run's chain: %+v %v", c, err)
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

func TestActWithWindow(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		h.addUser("lead", "support-lead")
		lead := newBrowser(t)
		h.signIn(lead, "lead")
		queue := func(key string) (string, string) {
			owner, v := h.claim(key)
			r := h.post("/v1/runs/"+key+"/effects", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"action_type":"digest","target":"default","payload":{"week":48}}`, owner, v))
			expect(t, r, 201, "")
			if r.body["cancel_url"] == nil || r.body["not_before"] == nil {
				t.Fatalf("window queue: %s", r.raw)
			}
			return r.body["cancel_url"].(string), r.body["effect"].(map[string]any)["id"].(string)
		}
		tick := func() {
			if _, err := h.env.Dispatcher.Tick(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		state := func(id string) string {
			e, err := h.env.Effects.Get(context.Background(), id)
			if err != nil {
				t.Fatal(err)
			}
			return string(e.State)
		}

		// Cancelled through the link inside the window: never sent.
		link, id := queue("w-1")
		tick()
		if state(id) != "pending" {
			t.Fatalf("the dispatcher took it early: %s", state(id))
		}
		code, page, _ := lead.do("GET", link, nil, nil)
		if code != 200 || !strings.Contains(page, "Cancel before it is sent") || strings.Contains(page, "Approve and send") {
			t.Fatalf("cancel page: %d", code)
		}
		if code, page, _ := lead.do("POST", link, url.Values{"decision": {"cancel"}}, nil); code != 200 || !strings.Contains(page, "Cancelled") {
			t.Fatalf("cancel: %d %s", code, page)
		}
		h.env.Clock.Advance(11 * time.Minute)
		tick()
		if state(id) != "cancelled" || h.env.Provider.Total() != 0 {
			t.Fatalf("after the window: %s, %d sent", state(id), h.env.Provider.Total())
		}

		// Not cancelled: sent once the window closes; the link is then dead.
		link, id = queue("w-2")
		h.env.Clock.Advance(11 * time.Minute)
		tick()
		if state(id) != "completed" {
			t.Fatalf("after the window: %s", state(id))
		}
		h.signIn(lead, "lead")
		if code, _, _ := lead.do("POST", link, url.Values{"decision": {"cancel"}}, nil); code != 404 {
			t.Fatalf("cancel after the window: %d", code)
		}
		expect(t, h.do("POST", "/v1/effects/"+id+"/cancel", h.operatorKey, "application/json", `{"reason":"late"}`), 409, "not_resolvable")

		// A cancel racing the dispatcher: once leased, it is too late and nothing changes.
		link, id = queue("w-3")
		var leased []store.Effect
		err := h.env.Store.Transact(context.Background(), func(q store.Queries) error {
			now := h.env.Clock.Now().Add(11 * time.Minute)
			var err error
			leased, err = q.EffectLease(context.Background(), store.EffectLeaseParams{Executor: store.ExecutorDispatcher, Caps: apptest.AllTypes(h.env.Policy), Owner: "d", Lease: time.Minute, Limit: 10, Now: &now})
			return err
		})
		if err != nil || len(leased) != 1 {
			t.Fatalf("lease: %v %d", err, len(leased))
		}
		if code, _, _ := lead.do("POST", link, url.Values{"decision": {"cancel"}}, nil); code != http.StatusConflict {
			t.Fatalf("cancel of a leased effect: %d", code)
		}
		if state(id) != "sending" {
			t.Fatalf("state %s", state(id))
		}

		// The API cancel, inside the window (by an operator; see TestGateCancelOnlyWindowByLeaseOrOperator
		// for the lease holder's).
		_, id = queue("w-4")
		c := h.do("POST", "/v1/effects/"+id+"/cancel", h.operatorKey, "application/json", `{"reason":"customer called"}`)
		expect(t, c, 200, "")
		if c.body["state"] != "cancelled" {
			t.Fatalf("API cancel: %s", c.raw)
		}
	})
}

func TestApproveByException(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		evaluators := map[string]string{"classifier": h.key(apikeys.Spec{Name: "classifier", Scopes: []string{apikeys.ScopeEvaluator}})}
		submit := func(key, output, evidence string) response {
			owner, v := h.claim(key)
			lb := fmt.Sprintf(`"lease_owner":"%s","version":%d`, owner, v)
			expect(t, h.post("/v1/runs/"+key+"/validate", `{`+lb+`,"action_type":"triage","output":`+output+`}`), 200, "")
			if evidence != "" { // recorded by the evaluator key named after the source
				src, rest, _ := strings.Cut(evidence, ":")
				expect(t, h.do("POST", "/v1/runs/"+key+"/evidence", evaluators[src], "application/json", rest), 201, "")
			}
			return h.post("/v1/runs/"+key+"/effects", `{`+lb+`,"action_type":"triage","target":"default"}`)
		}
		declined := func(key, reason string) {
			t.Helper()
			evs := h.get("/v1/runs/" + key + "/events").raw
			if !strings.Contains(evs, "auto_approval_declined") || !strings.Contains(evs, reason) {
				t.Fatalf("%s: no auto_approval_declined %s in %s", key, reason, evs)
			}
		}
		// The rule holds with evidence from the evaluator: queued without a person, sampled.
		ok := submit("x-1", `{"label":"spam","confidence":0.99}`, `classifier:{"name":"score","value":0.97}`)
		expect(t, ok, 201, "")
		evs := h.get("/v1/runs/x-1/events").raw
		if !strings.Contains(evs, "auto_approved") || !strings.Contains(evs, "policy_version") || !strings.Contains(evs, "evidence[") {
			t.Fatalf("auto-approval not recorded with its rule and policy version: %s", evs)
		}
		// The model's own confidence is not evidence: a person decides.
		expect(t, submit("x-2", `{"label":"spam","confidence":1.0}`, ""), 202, "")
		declined("x-2", "missing_evidence:classifier")
		// The rule does not hold: a person decides.
		expect(t, submit("x-3", `{"label":"other"}`, `classifier:{"name":"score","value":0.99}`), 202, "")
		declined("x-3", "rule_false")
		// The rule cannot be evaluated: a person decides.
		expect(t, submit("x-4", `{"label":"spam"}`, `classifier:{"name":"other","value":1}`), 202, "")
		declined("x-4", "rule_error")

		// Sampled auto-approvals are reviewed after the fact.
		expect(t, h.get("/v1/reviews"), 403, "forbidden")
		op := func(method, path, body string) response {
			return h.do(method, path, h.operatorKey, "application/json", body)
		}
		list := op("GET", "/v1/reviews", "")
		expect(t, list, 200, "")
		rs := list.body["reviews"].([]any)
		if len(rs) != 1 || rs[0].(map[string]any)["key"] != "x-1" {
			t.Fatalf("reviews: %s", list.raw)
		}
		id := rs[0].(map[string]any)["id"].(string)
		expect(t, op("POST", "/v1/reviews/"+id, `{"decision":"maybe"}`), 422, "decision_not_allowed")
		expect(t, op("POST", "/v1/reviews/"+id, `{"decision":"flag","note":"not spam"}`), 200, "")
		expect(t, op("POST", "/v1/reviews/"+id, `{"decision":"confirm"}`), 404, "review_not_found")
		if !strings.Contains(strings.Join(h.env.Alerts.Kinds(), " "), "auto_approval_flagged:x-1") {
			t.Fatal("a flagged review did not alert")
		}
	})
}

func TestApprovalNotification(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		got := make(chan string, 1)
		hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			got <- string(b)
		}))
		defer hook.Close()
		h.env.Policy.Notify.WebhookURL = hook.URL
		h.env.Policy.Action("email").LogFields = []string{"subject"}
		owner, v := h.claim("n-1")
		r := h.post("/v1/runs/n-1/effects", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"action_type":"email","target":"default","payload":{"subject":"Refund 42","text":"PRIVATE-DRAFT-TEXT"}}`, owner, v))
		expect(t, r, 202, "")
		var card struct{ Text string }
		select {
		case b := <-got:
			if err := json.Unmarshal([]byte(b), &card); err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no notification")
		}
		for _, want := range []string{"n-1", "email", "subject: Refund 42", r.body["approve_url"].(string)} {
			if !strings.Contains(card.Text, want) {
				t.Errorf("card %q lacks %q", card.Text, want)
			}
		}
		if strings.Contains(card.Text, "PRIVATE-DRAFT-TEXT") {
			t.Fatal("the card carries a payload field outside log_fields")
		}
		token := strings.TrimPrefix(r.body["approve_url"].(string), h.url+"/approve/")
		if strings.Contains(h.logs.String(), token) {
			t.Fatal("the token reached the log")
		}
	})
}

func TestGateStricterNeverWeaker(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		ask := func(key, action, gate string) response {
			owner, v := h.claim(key)
			return h.post("/v1/runs/"+key+"/effects", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"action_type":"%s","target":"default","payload":{"a":1},"gate":"%s"}`, owner, v, action, gate))
		}
		expect(t, ask("g-1", "email", "none"), 422, "gate_too_weak")
		expect(t, ask("g-2", "digest", "none"), 422, "gate_too_weak")
		expect(t, ask("g-3", "digest", "approve_before_act"), 202, "")
		expect(t, ask("g-4", "note", "approve_before_act"), 400, "invalid_field") // no approvers to ask
		expect(t, ask("g-5", "email", "sometimes"), 400, "invalid_field")
		if effs := h.get("/v1/runs/g-1").body["effects"].([]any); len(effs) != 0 {
			t.Fatal("a refused gate queued an effect")
		}
	})
}
