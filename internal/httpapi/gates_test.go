package httpapi_test

// Attacks on the gates — an approval authorising more than it showed, cancelling what is
// not a window, an agent clearing an unknown effect, mail to someone the card did not
// show, evidence from the model itself, separation of duties dodged by another name, a
// worker key taking types it may not — each against a running server over real HTTP, on
// both stores.

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apikeys"
	"github.com/airlockhq/airlock/internal/app"
	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// key creates an API key as `airlock apikey create` does.
func (h *harness) key(spec apikeys.Spec) string {
	h.t.Helper()
	_, raw, err := apikeys.CreateSpec(context.Background(), h.env.Store, spec, h.env.Clock.Now())
	if err != nil {
		h.t.Fatal(err)
	}
	return raw
}

func (h *harness) tick() {
	h.t.Helper()
	if _, err := h.env.Dispatcher.Tick(context.Background()); err != nil {
		h.t.Fatal(err)
	}
}

// effectsOf returns the run's effects as the API shows them.
func (h *harness) effectsOf(key string) []map[string]any {
	h.t.Helper()
	r := h.get("/v1/runs/" + key)
	expect(h.t, r, 200, "")
	var out []map[string]any
	for _, e := range r.body["effects"].([]any) {
		out = append(out, e.(map[string]any))
	}
	return out
}

func (h *harness) decide(b *browser, link, decision string) int {
	h.t.Helper()
	code, _, _ := b.do("POST", link, url.Values{"decision": {decision}}, nil)
	return code
}

// Item 1: an approval authorises exactly the (run, effect id, action type, target, input
// hash) it showed; the same id and hash with another target or action type asks again.
func TestGateApprovalAuthorisesOnlyWhatItShowed(t *testing.T) {
	setup := func(env *apptest.EffectsEnv, _ *app.Options) {
		other := *env.Policy.Action("share_publicly")
		other.Name = "share_externally"
		env.Policy.Actions["share_externally"] = &other
	}
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			h := newHarnessWith(t, b, setup)
			h.addUser("lead", "support-lead")
			lead := newBrowser(t)
			h.signIn(lead, "lead")
			plan := func(key, owner, action, target string) response {
				return h.post("/v1/runs/"+key+"/ledger/effects/share-01/plan",
					fmt.Sprintf(`{"lease_owner":"%s","action":"%s","target":"%s","input_hash":"h-draft"}`, owner, action, target))
			}
			// A person approves share_publicly → intranet; the agent comes back for more.
			approved := func(key string) string {
				owner, _ := h.claim(key)
				r := plan(key, owner, "share_publicly", "intranet")
				expect(t, r, 202, "")
				if code := h.decide(lead, r.body["approve_url"].(string), "approve"); code != 200 {
					t.Fatalf("approve: %d", code)
				}
				owner, _ = h.claim(key) // back to processing without a lease: the agent claims again
				return owner
			}
			for _, attack := range []struct{ key, action, target string }{
				{"share-target", "share_publicly", "the-whole-internet"},
				{"share-action", "share_externally", "intranet"},
			} {
				owner := approved(attack.key)
				r := plan(attack.key, owner, attack.action, attack.target)
				if r.status == 200 && r.body["execute"] == true {
					t.Fatalf("%s: an approval of share_publicly → intranet authorised %s → %s", attack.key, attack.action, attack.target)
				}
				expect(t, r, 202, "") // a new approval, for what is really asked
				if effs := h.effectsOf(attack.key); len(effs) != 0 {
					t.Fatalf("%s: planned without its approval: %v", attack.key, effs)
				}
				aps, err := h.env.Store.ApprovalsByRun(context.Background(), attack.key)
				open := slices.IndexFunc(aps, func(a store.Approval) bool { return a.ConsumedAt == nil })
				if err != nil || len(aps) != 2 || open < 0 || aps[open].Target != attack.target || aps[open].ActionType != attack.action {
					t.Fatalf("%s: approvals %+v %v", attack.key, aps, err)
				}
			}
			// What was approved, exactly, may execute.
			owner := approved("share-same")
			r := plan("share-same", owner, "share_publicly", "intranet")
			expect(t, r, 200, "")
			if r.body["execute"] != true {
				t.Fatalf("the approved effect: %s", r.raw)
			}
		})
	}
}

// Item 2: cancel applies only to act_with_window effects, by the lease holder, an operator
// or an approver's link; an approved run whose last open effect is cancelled or abandoned
// settles instead of hanging in approved.
func TestGateCancelOnlyWindowByLeaseOrOperator(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		h.addUser("lead", "support-lead")
		lead := newBrowser(t)
		h.signIn(lead, "lead")
		op := func(path, body string) response { return h.do("POST", path, h.operatorKey, "application/json", body) }
		email := func(key, owner string, v int64) string {
			r := h.post("/v1/runs/"+key+"/effects", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"action_type":"email","target":"default","payload":{"text":"refund"}}`, owner, v))
			expect(t, r, 202, "")
			return r.body["approve_url"].(string)
		}
		digest := func(key, owner string, v int64) (id, link string) {
			r := h.post("/v1/runs/"+key+"/effects", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"action_type":"digest","target":"default","payload":{"week":48}}`, owner, v))
			expect(t, r, 201, "")
			return r.body["effect"].(map[string]any)["id"].(string), r.body["cancel_url"].(string)
		}

		// An effect a person has just approved cannot be withdrawn by any runs key, nor by an
		// operator through cancel: it was approved, not queued with a window.
		owner, v := h.claim("c-approved")
		if code := h.decide(lead, email("c-approved", owner, v), "approve"); code != 200 {
			t.Fatalf("approve: %d", code)
		}
		id := h.effectsOf("c-approved")[0]["id"].(string)
		if r := h.post("/v1/effects/"+id+"/cancel", `{"reason":"changed my mind"}`); r.status == 200 {
			t.Fatalf("a runs key without a lease cancelled an approved effect: %s", r.raw)
		}
		expect(t, h.post("/v1/effects/"+id+"/cancel", `{"reason":"x","lease_owner":"`+owner+`"}`), 409, "not_resolvable")
		expect(t, op("/v1/effects/"+id+"/cancel", `{"reason":"x"}`), 409, "not_resolvable")
		h.tick()
		if run := h.get("/v1/runs/c-approved"); run.body["state"] != "completed" {
			t.Fatalf("the approved run: %s", run.raw)
		}

		// A window effect: not by a read key, not without the lease, not by a stale owner.
		owner, v = h.claim("c-window")
		id, link := digest("c-window", owner, v)
		expect(t, h.do("POST", "/v1/effects/"+id+"/cancel", h.readKey, "application/json", `{"reason":"x"}`), 403, "forbidden")
		expect(t, h.post("/v1/effects/"+id+"/cancel", `{"reason":"x"}`), 400, "missing_field")
		expect(t, h.post("/v1/effects/"+id+"/cancel", `{"reason":"x","lease_owner":"thief"}`), 409, "lease_lost")
		if e := h.effectsOf("c-window")[0]; e["state"] != "pending" {
			t.Fatalf("refused cancels changed the effect: %v", e)
		}
		// The holder of the run's live lease may; the cancel link dies with it.
		c := h.post("/v1/effects/"+id+"/cancel", `{"reason":"customer called","lease_owner":"`+owner+`"}`)
		expect(t, c, 200, "")
		if c.body["state"] != "cancelled" {
			t.Fatalf("cancel: %s", c.raw)
		}
		if code := h.decide(lead, link, "cancel"); code != http.StatusNotFound {
			t.Fatalf("the cancel link after an API cancel: %d", code)
		}

		// An approved run whose last open effect an operator cancels settles.
		owner, v = h.claim("c-settle")
		id, _ = digest("c-settle", owner, v)
		if code := h.decide(lead, email("c-settle", owner, v), "approve"); code != 200 {
			t.Fatalf("approve: %d", code)
		}
		h.tick() // the email is sent; the digest waits for its window
		if run := h.get("/v1/runs/c-settle"); run.body["state"] != "approved" {
			t.Fatalf("before the cancel: %s", run.raw)
		}
		expect(t, op("/v1/effects/"+id+"/cancel", `{"reason":"digest withdrawn"}`), 200, "")
		run := h.get("/v1/runs/c-settle")
		if run.body["state"] != "failed_terminal" || !strings.Contains(run.raw, "effects_cancelled") {
			t.Fatalf("an approved run hangs after its last open effect was cancelled: %s", run.raw)
		}

		// An approved run whose unknown effect an operator abandons settles too.
		owner, v = h.claim("c-abandon")
		h.env.Provider.Reply = func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(http.StatusInternalServerError) }
		if code := h.decide(lead, email("c-abandon", owner, v), "approve"); code != 200 {
			t.Fatalf("approve: %d", code)
		}
		h.tick()
		e := h.effectsOf("c-abandon")[0]
		if e["state"] != "unknown" {
			t.Fatalf("effect: %v", e)
		}
		expect(t, op("/v1/effects/"+e["id"].(string)+"/resolve", `{"outcome":"abandon","note":"checked the mailbox: never arrived"}`), 200, "")
		run = h.get("/v1/runs/c-abandon")
		if run.body["state"] != "failed_terminal" || !strings.Contains(run.raw, "effects_cancelled") {
			t.Fatalf("an approved run hangs after its unknown effect was abandoned: %s", run.raw)
		}
	})
}

// Item 3: an agent reconciles only planned effects; an unknown one is a person's.
func TestGateAgentCannotClearUnknown(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		owner, _ := h.claim("agent-1")
		base := "/v1/runs/agent-1/ledger/effects/draft-01/"
		plan := func() response {
			return h.post(base+"plan", `{"lease_owner":"`+owner+`","action":"create_internal_draft","target":"internal-docs","input_hash":"h1"}`)
		}
		expect(t, plan(), 200, "")
		r := h.post(base+"reconcile", `{"lease_owner":"`+owner+`","undetermined":true}`)
		expect(t, r, 200, "")
		if r.body["status"] != "unknown" {
			t.Fatalf("undetermined search: %s", r.raw)
		}
		// The agent cannot decide it was never done, and so cannot redo it.
		expect(t, h.post(base+"reconcile", `{"lease_owner":"`+owner+`","found":[]}`), 409, "not_planned")
		expect(t, h.post(base+"reconcile", `{"lease_owner":"`+owner+`","found":["doc-1"]}`), 409, "not_planned")
		expect(t, plan(), 409, "reconcile_first")
		if v := h.get("/v1/runs/agent-1/resume"); v.body["verdict"] != "stop" {
			t.Fatalf("resume with an unknown effect: %s", v.raw)
		}
		// A person resolves it; then the agent may plan it again.
		e := h.effectsOf("agent-1")[0]
		expect(t, h.do("POST", "/v1/effects/"+e["id"].(string)+"/resolve", h.operatorKey, "application/json",
			`{"outcome":"not_sent","note":"searched the document store: nothing"}`), 200, "")
		r = plan()
		expect(t, r, 200, "")
		if r.body["execute"] != true {
			t.Fatalf("after the operator's resolution: %s", r.raw)
		}
	})
}

// Item 4: an SMTP target is the recipient, not a label: a payload cannot send the mail
// anywhere else, and the card shows the envelope recipients exactly.
func TestGateSMTPTargetIsTheRecipient(t *testing.T) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			var ms *apptest.MailServer
			h := newHarnessWith(t, b, apptest.SMTPActions(t, &ms))
			owner, v := h.claim("m-1")
			queue := func(action, target, payload string) response {
				return h.post("/v1/runs/m-1/effects", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"action_type":"%s","target":%q,"payload":%s,"effect_id":"e-%d"}`,
					owner, v, action, target, payload, time.Now().UnixNano()))
			}
			// The card and the audit would say alice; the payload names mallory and eve.
			for _, p := range []string{
				`{"to":"mallory@example.net","subject":"Refund","text":"t"}`,
				`{"to":["alice@example.com","eve@example.net"],"subject":"Refund","text":"t"}`,
				`{"to":[],"subject":"Refund","text":"t"}`,
			} {
				expect(t, queue("mail_now", "alice@example.com", p), 400, "invalid_field")
			}
			// A target without smtp.targets is one bare address.
			for _, target := range []string{"alice@example.com, eve@example.net", "Alice <alice@example.com>", "alice"} {
				expect(t, queue("mail_now", target, `{"subject":"Refund","text":"t"}`), 422, "invalid_target")
			}
			// With smtp.targets, the payload names no one.
			expect(t, queue("mail_fixed", "alice", `{"to":"alice@example.com","subject":"Refund","text":"t"}`), 400, "invalid_field")
			expect(t, queue("mail_now", "alice@example.com", `{"to":"alice@EXAMPLE.com","subject":"Refund","text":"t"}`), 201, "")
			h.tick()
			if got := ms.Recipients(); len(got) != 1 || got[0] != "alice@example.com" {
				t.Fatalf("envelope recipients %v, want only alice", got)
			}

			// The approval card shows the envelope recipients exactly.
			h.addUser("lead", "support-lead")
			lead := newBrowser(t)
			h.signIn(lead, "lead")
			for _, c := range []struct{ key, action, target, want string }{
				{"m-2", "mail", "bob@example.com", "<code>bob@example.com</code>"},
				{"m-3", "mail_fixed", "alice", "<code>alice@example.com</code>"},
			} {
				o, ver := h.claim(c.key)
				r := h.post("/v1/runs/"+c.key+"/effects", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"action_type":"%s","target":"%s","payload":{"subject":"Refund","text":"t"}}`, o, ver, c.action, c.target))
				expect(t, r, 202, "")
				code, page, _ := lead.do("GET", r.body["approve_url"].(string), nil, nil)
				if code != 200 || !strings.Contains(page, "Envelope recipients") || !strings.Contains(page, c.want) {
					t.Fatalf("%s: the card does not show the recipients %s: %d %s", c.key, c.want, code, page)
				}
				if code := h.decide(lead, r.body["approve_url"].(string), "approve"); code != 200 {
					t.Fatalf("approve: %d", code)
				}
			}
			h.tick()
			got := ms.Recipients()
			slices.Sort(got)
			if strings.Join(got, " ") != "alice@example.com alice@example.com bob@example.com" {
				t.Fatalf("envelope recipients after the approvals: %v", got)
			}
		})
	}
}

// Item 5: approve_by_exception counts only evidence an evaluator key recorded on the run,
// never evidence in the effect request.
func TestGateEvidenceOnlyFromEvaluators(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		classifier := h.key(apikeys.Spec{Name: "classifier", Scopes: []string{apikeys.ScopeEvaluator}})
		impostor := h.key(apikeys.Spec{Name: "helper", Scopes: []string{apikeys.ScopeEvaluator}})
		validated := func(key string) string {
			owner, v := h.claim(key)
			lb := fmt.Sprintf(`"lease_owner":"%s","version":%d`, owner, v)
			expect(t, h.post("/v1/runs/"+key+"/validate", `{`+lb+`,"action_type":"triage","output":{"label":"spam"}}`), 200, "")
			return `{` + lb + `,"action_type":"triage","target":"default"`
		}
		evidence := func(key, apiKey, body string) response {
			return h.do("POST", "/v1/runs/"+key+"/evidence", apiKey, "application/json", body)
		}
		// The workflow vouches for itself in the request: refused, nothing queued.
		body := validated("e-1")
		r := h.post("/v1/runs/e-1/effects", body+`,"evidence":[{"source":"classifier","name":"score","value":0.99}]}`)
		if r.status == 201 {
			t.Fatalf("auto-approved on the workflow's own evidence: %s", r.raw)
		}
		expect(t, r, 400, "invalid_field")
		if effs := h.effectsOf("e-1"); len(effs) != 0 {
			t.Fatal("a refused request queued an effect")
		}
		// Without recorded evidence a person decides.
		expect(t, h.post("/v1/runs/e-1/effects", body+`}`), 202, "")

		// Only evaluator keys record evidence — not runs, operator or admin keys.
		for _, k := range []string{h.runsKey, h.operatorKey, h.adminKy, h.workerKey} {
			expect(t, evidence("e-2", k, `{"name":"score","value":0.99}`), 403, "forbidden")
		}
		expect(t, evidence("nope", classifier, `{"name":"score","value":0.99}`), 404, "run_not_found")
		// Another evaluator's finding is not the classifier's.
		body = validated("e-2")
		expect(t, evidence("e-2", impostor, `{"name":"score","value":0.99}`), 201, "")
		expect(t, h.post("/v1/runs/e-2/effects", body+`}`), 202, "")
		// The classifier's recorded finding counts.
		body = validated("e-3")
		rec := evidence("e-3", classifier, `{"name":"score","value":0.99}`)
		expect(t, rec, 201, "")
		if rec.body["source"] != "classifier" {
			t.Fatalf("evidence: %s", rec.raw)
		}
		expect(t, h.post("/v1/runs/e-3/effects", body+`}`), 201, "")
		if evs := h.get("/v1/runs/e-3/events").raw; !strings.Contains(evs, "evidence_recorded") || !strings.Contains(evs, "auto_approved") {
			t.Fatalf("events: %s", evs)
		}
		// An evaluator key cannot also act.
		if _, err := apikeys.ParseScopes("runs,evaluator"); err == nil {
			t.Fatal("a key may be both workflow and evaluator")
		}
	})
}

// Item 6: separation of duties compares normalised identities of the authenticated
// requester (its key, the person the key acts for) and the declared requested_by.
func TestGateSeparationOfDutiesByIdentity(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		h.addUser("ana", "support-lead")
		h.addUser("lead2", "support-lead")
		ana, other := newBrowser(t), newBrowser(t)
		h.signIn(ana, "ana")
		h.signIn(other, "lead2")
		forAna := h.key(apikeys.Spec{Name: "ana-assistant", Scopes: []string{apikeys.ScopeRuns}, OnBehalfOf: "ana"})
		propose := func(apiKey, key, requestedBy string) string {
			r := h.do("POST", "/v1/runs/claim", apiKey, "application/json", `{"key":"`+key+`","payload":{"ticket":1}}`)
			expect(t, r, 201, "")
			meta := ""
			if requestedBy != "" {
				meta = fmt.Sprintf(`,"meta":{"requested_by":%q}`, requestedBy)
			}
			r = h.do("POST", "/v1/runs/"+key+"/effects", apiKey, "application/json", fmt.Sprintf(`{"lease_owner":"%s","version":%v,"action_type":"email","target":"default","payload":{"text":"refund"}%s}`,
				r.body["lease_owner"], r.body["version"], meta))
			expect(t, r, 202, "")
			return r.body["approve_url"].(string)
		}
		for i, c := range []struct{ apiKey, requestedBy string }{
			{h.runsKey, "ANA"},
			{h.runsKey, "ana "},
			{h.runsKey, "ａｎａ"}, // fullwidth: NFKC
			{forAna, ""},       // the key acts for ana
			{forAna, "bob"},    // and still does when it declares someone else
		} {
			link := propose(c.apiKey, fmt.Sprintf("sod-%d", i), c.requestedBy)
			code, page, _ := ana.do("POST", link, url.Values{"decision": {"approve"}}, nil)
			if code != http.StatusForbidden || !strings.Contains(page, "separation of duties") {
				t.Fatalf("case %d (requested_by %q): ana decided her own request: %d", i, c.requestedBy, code)
			}
			if i == 4 {
				if code := h.decide(other, link, "approve"); code != 200 {
					t.Fatalf("another approver: %d", code)
				}
			}
		}
		// The approval records who asked.
		aps, err := h.env.Store.ApprovalsByRun(context.Background(), "sod-4")
		if err != nil || len(aps) != 1 || strings.Join(aps[0].Requesters, " ") != "apikey:ana-assistant ana bob" {
			t.Fatalf("requesters: %+v %v", aps, err)
		}
	})
}

// Item 13: a worker key limited to action types never receives another type's payloads.
func TestGateWorkerKeyTypes(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		taskOnly := h.key(apikeys.Spec{Name: "task-worker", Scopes: []string{apikeys.ScopeWorker}, Types: []string{"task"}})
		owner, v := h.claim("wk-1")
		lb := fmt.Sprintf(`"lease_owner":"%s","version":%d`, owner, v)
		expect(t, h.post("/v1/runs/wk-1/effects", `{`+lb+`,"action_type":"create_internal_draft","target":"docs","payload":{"secret":"draft"}}`), 201, "")
		claim := func(apiKey, types string) response {
			return h.do("POST", "/v1/effects/claim", apiKey, "application/json", `{"types":`+types+`}`)
		}
		for _, types := range []string{`["create_internal_draft"]`, `["task","create_internal_draft"]`} {
			r := claim(taskOnly, types)
			if strings.Contains(r.raw, "draft") && r.status == 200 {
				t.Fatalf("a task-only key received another type's payload: %s", r.raw)
			}
			expect(t, r, 403, "forbidden")
		}
		if r := claim(taskOnly, `["task"]`); r.status != http.StatusNoContent {
			t.Fatalf("claim of its own type: %d %s", r.status, r.raw)
		}
		// Nor can it report on one it did not claim.
		got := claim(h.workerKey, `["create_internal_draft"]`)
		expect(t, got, 200, "")
		id := got.body["id"].(string)
		expect(t, h.do("POST", "/v1/effects/"+id+"/complete", taskOnly, "application/json",
			`{"lease_owner":"`+got.body["lease_owner"].(string)+`","provider_id":"forged"}`), 403, "forbidden")
		// Its own type works end to end.
		expect(t, h.post("/v1/runs/wk-1/effects", `{`+lb+`,"action_type":"task","target":"x","payload":{"n":1}}`), 201, "")
		mine := claim(taskOnly, `["task"]`)
		expect(t, mine, 200, "")
		expect(t, h.do("POST", "/v1/effects/"+mine.body["id"].(string)+"/complete", taskOnly, "application/json",
			`{"lease_owner":"`+mine.body["lease_owner"].(string)+`","provider_id":"t-1"}`), 200, "")
		// Types limit worker keys only.
		if _, _, err := apikeys.CreateSpec(context.Background(), h.env.Store, apikeys.Spec{Name: "x", Scopes: []string{"runs"}, Types: []string{"task"}}, h.env.Clock.Now()); err == nil {
			t.Fatal("types accepted on a runs key")
		}
	})
}
