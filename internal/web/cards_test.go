package web_test

import (
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/apikeys"
	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/ledger"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// cardHarness serves the test policy plus SMTP actions (mail), with a lead and an intern.
func cardHarness(t *testing.T, b storetest.Backend) *harness {
	t.Helper()
	var ms *apptest.MailServer
	h := newHarnessWith(t, b, apptest.SMTPActions(t, &ms))
	h.addUser("lead", "support-lead")
	h.addUser("intern", "support")
	return h
}

// queueMail claims key and asks for the gated SMTP effect mail with payload and meta; it
// returns the approval link.
func (h *harness) queueMail(key, payload, meta string) string {
	h.t.Helper()
	owner, v := h.claim(key)
	if meta != "" {
		meta = `,"meta":` + meta
	}
	r := h.post("/v1/runs/"+key+"/effects", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"action_type":"mail","target":"ana@example.com","payload":%s%s}`, owner, v, payload, meta))
	expect(h.t, r, 202, "")
	return r.body["approve_url"].(string)
}

// planTool claims key and plans the gated worker action share_publicly as an MCP tool
// call through the ledger; it returns the approval link.
func (h *harness) planTool(key, tool, args, meta string) string {
	h.t.Helper()
	owner, _ := h.claim(key)
	input := `{"tool":"` + tool + `","arguments":` + args + `}`
	hash, err := ledger.InputHash([]byte(input))
	if err != nil {
		h.t.Fatal(err)
	}
	if meta != "" {
		meta = `,"meta":` + meta
	}
	r := h.post("/v1/runs/"+key+"/ledger/effects/mcp."+tool+".1/plan", fmt.Sprintf(`{"lease_owner":"%s","action":"share_publicly","target":"memory","input_hash":"%s","input":%s%s}`,
		owner, hash, input, meta))
	expect(h.t, r, 202, "")
	return r.body["approve_url"].(string)
}

// Issue 22 item 2: meta.source_url becomes a link on the card, so only an absolute http
// or https URL without credentials is taken; anything else is refused with 422
// invalid_source_url on every door that takes meta, and nothing is written.
func TestCardSourceURLValidated(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		h.addUser("lead", "support-lead")
		owner, v := h.claim("src-1")
		bad := []string{"javascript:alert(document.cookie)", "JavaScript:alert(1)", "data:text/html,<script>alert(1)</script>",
			"ftp://files.example.com/t/1", "//evil.example/t/1", "/tickets/1", "https://user:pw@support.example.com/t/1",
			"https://", "vbscript:msgbox(1)", "https://support.example.com/t/1\u202e", "https://support.example.com/a b"}
		before := storetest.DumpAll(t, h.env.Store)
		for _, u := range bad {
			meta := fmt.Sprintf(`{"source_url":%q}`, u)
			r := h.post("/v1/runs/src-1/effects", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"action_type":"email","target":"default","payload":{"to":"ana@example.com","text":"hi"},"meta":%s}`, owner, v, meta))
			if r.status != 422 || (r.body["error"] != "invalid_source_url" && r.body["error"] != "invisible_character") {
				t.Errorf("effect with source_url %q: %d %s, want 422 invalid_source_url", u, r.status, r.raw)
			}
			if r := h.post("/v1/runs/claim", `{"key":"src-other","payload":{"a":1},"meta":`+meta+`}`); r.status != 422 {
				t.Errorf("claim with source_url %q: %d %s, want 422", u, r.status, r.raw)
			}
		}
		if after := storetest.DumpAll(t, h.env.Store); after != before {
			t.Fatal("a refused source_url wrote to the database")
		}
		// A good one is a link on the card, opened without the opener or a referrer.
		r := h.post("/v1/runs/src-1/effects", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"action_type":"email","target":"default","payload":{"to":"ana@example.com","text":"hi"},"meta":{"source_url":"https://support.example.com/tickets/42?view=full&x=1"}}`, owner, v))
		expect(t, r, 202, "")
		b := newBrowser(t)
		h.signIn(b, "lead")
		code, page, _ := b.do("GET", r.body["approve_url"].(string), nil, nil)
		if code != 200 || !strings.Contains(page, `<a href="https://support.example.com/tickets/42?view=full&amp;x=1" rel="noopener noreferrer"`) {
			t.Fatalf("card %d without the source link:\n%s", code, page)
		}
	})
}

// Issue 22 item 2: an email card shows the mail as the recipient gets it, and a hostile
// subject, text or HTML body is text on the page: no element, attribute or script of
// theirs reaches it. The HTML part is shown as its text (scripts dropped).
func TestCardEscapesHostileMail(t *testing.T) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			h := cardHarness(t, b)
			link := h.queueMail("m-hostile", `{"subject":"<script>alert('s')</script><img src=x onerror=alert(1)>","text":"</pre><a href=\"javascript:alert(2)\">click</a>","html":"<p>Dear Ana,</p><script>steal()</script><img src=x onerror=alert(3)><b onclick=\"alert(4)\">refund approved</b><style>body{display:none}</style>"}`, "")
			br := newBrowser(t)
			h.signIn(br, "lead")
			code, page, _ := br.do("GET", link, nil, nil)
			if code != 200 {
				t.Fatalf("card: %d %s", code, page)
			}
			for _, bad := range []string{"<script", "<img", `<a href="javascript:`, "<b onclick", "<style>body{display"} {
				if strings.Contains(page, bad) {
					t.Errorf("the card carries %q from the payload as markup:\n%s", bad, page)
				}
			}
			for _, want := range []string{"<h2>Email to be sent</h2>", "<dt>To</dt><dd>ana@example.com</dd>", "<dt>From</dt><dd>support@example.com</dd>",
				"&lt;script&gt;alert(&#39;s&#39;)&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;", "&lt;/pre&gt;&lt;a href=&#34;javascript:alert(2)&#34;&gt;click&lt;/a&gt;",
				"<summary>Raw JSON payload</summary>"} {
				if !strings.Contains(page, want) {
					t.Errorf("the card lacks %q:\n%s", want, page)
				}
			}
			// The HTML part as its text: the words, not the script or the style.
			_, part, _ := strings.Cut(page, "<dt>HTML version</dt>")
			part, _, _ = strings.Cut(part, "</dd>")
			if !strings.Contains(part, "Dear Ana,") || !strings.Contains(part, "refund approved") || strings.Contains(part, "steal()") || strings.Contains(part, "display:none") {
				t.Errorf("the HTML part shows %q", part)
			}
		})
	}
}

// Issue 22 item 2: an HTTP card is the request (method, URL, headers without the secret,
// body); a tool call is its tool and named arguments; a worker task its fields.
func TestCardPerConnector(t *testing.T) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			h := cardHarness(t, b)
			br := newBrowser(t)
			h.signIn(br, "lead")
			card := func(link string) string {
				t.Helper()
				code, page, _ := br.do("GET", link, nil, nil)
				if code != 200 {
					t.Fatalf("card: %d %s", code, page)
				}
				return page
			}
			httpCard := card(h.propose("c-http", ""))
			for _, want := range []string{"<h2>HTTP request to be made</h2>", "<dt>Method</dt><dd>POST</dd>", "<dt>URL</dt><dd><code>" + h.env.Provider.URL + "/mail</code>",
				"<dt>Idempotency-Key</dt>", "<dt>Body</dt>", "&#34;to&#34;: &#34;ana@example.com&#34;"} {
				if !strings.Contains(httpCard, want) {
					t.Errorf("the HTTP card lacks %q:\n%s", want, httpCard)
				}
			}
			mcp := card(h.planTool("c-mcp", "delete_entities", `{"entityNames":["customer:ana","customer:bob"],"reason":"GDPR erasure"}`, ""))
			for _, want := range []string{"<h2>Action to be performed</h2>", "<dt>Tool</dt><dd><code>delete_entities</code>", "<dt>entityNames</dt>", "customer:ana", "<dt>reason</dt>", "GDPR erasure"} {
				if !strings.Contains(mcp, want) {
					t.Errorf("the MCP card lacks %q:\n%s", want, mcp)
				}
			}
			owner, v := h.claim("c-worker")
			r := h.post("/v1/runs/c-worker/effects", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"action_type":"share_publicly","target":"blog","payload":{"title":"Release notes","draft":"We shipped."}}`, owner, v))
			expect(t, r, 202, "")
			worker := card(r.body["approve_url"].(string))
			for _, want := range []string{"<h2>Task the worker will perform</h2>", "<dt>title</dt>", "Release notes", "<dt>draft</dt>", "We shipped."} {
				if !strings.Contains(worker, want) {
					t.Errorf("the worker card lacks %q:\n%s", want, worker)
				}
			}
		})
	}
}

// Issue 22 item 2: an approve_by_exception effect that a person must decide shows why
// (the rule's outcome), the evaluator's evidence, and the validations with their errors
// and repairs.
func TestCardValidationsAndEvidence(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		h.addUser("lead", "support-lead")
		classifier := h.key(apikeys.Spec{Name: "classifier", Scopes: []string{apikeys.ScopeEvaluator}})
		owner, v := h.claim("x-card")
		lb := fmt.Sprintf(`"lease_owner":"%s","version":%d`, owner, v)
		expect(t, h.post("/v1/runs/x-card/validate", `{`+lb+`,"action_type":"triage","output":{"label":"maybe"}}`), 200, "")
		expect(t, h.post("/v1/runs/x-card/validate", `{`+lb+`,"action_type":"triage","output":{"label":"other"}}`), 200, "")
		expect(t, h.do("POST", "/v1/runs/x-card/evidence", classifier, "application/json", `{"name":"score","value":0.42}`), 201, "")
		r := h.post("/v1/runs/x-card/effects", `{`+lb+`,"action_type":"triage","target":"default"}`)
		expect(t, r, 202, "")
		b := newBrowser(t)
		h.signIn(b, "lead")
		code, page, _ := b.do("GET", r.body["approve_url"].(string), nil, nil)
		if code != 200 {
			t.Fatalf("card: %d %s", code, page)
		}
		for _, want := range []string{"<h2>Why a person decides</h2>", "rule_false", "<h2>Evidence</h2>", "classifier · score", "0.42",
			"<h2>Validation</h2>", "<b>invalid</b>", "/label: ", "repairs used 1 of 2"} {
			if !strings.Contains(page, want) {
				t.Errorf("the card lacks %q:\n%s", want, page)
			}
		}
	})
}

// Issue 22 item 7: a used link shows what was decided — to one of its approvers only.
// Anyone else (signed out, or signed in without the role) gets the very page an unknown
// token gets, so the link is no oracle of whether it ever existed.
func TestUsedLinkShowsTheDecisionToItsApprovers(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		h.addUser("lead", "support-lead")
		h.addUser("lead2", "support-lead")
		h.addUser("intern", "support")
		link := h.propose("used-1", "")
		unknown := h.url + "/approve/" + strings.Repeat("A", 43)
		lead := newBrowser(t)
		h.signIn(lead, "lead")
		if code := h.decide(lead, link, "approve"); code != 200 {
			t.Fatalf("approve: %d", code)
		}
		// The other approver sees the outcome, who and when, and onward links.
		lead2 := newBrowser(t)
		h.signIn(lead2, "lead2")
		code, page, _ := lead2.do("GET", link, nil, nil)
		for _, want := range []string{"Already decided", "<dt>Decided by</dt><dd>lead</dd>", "approved:", "<dt>When</dt>", `href="/console"`} {
			if code != 200 || !strings.Contains(page, want) {
				t.Errorf("the used link for another approver (%d) lacks %q:\n%s", code, want, page)
			}
		}
		if strings.Contains(page, "Approve and send") || strings.Contains(page, "ana@example.com") {
			t.Errorf("the used link offers a decision or shows the payload:\n%s", page)
		}
		// The intern: the page of an unknown token, byte for byte.
		intern := newBrowser(t)
		h.signIn(intern, "intern")
		c1, used, _ := intern.do("GET", link, nil, nil)
		c2, none, _ := intern.do("GET", unknown, nil, nil)
		if c1 != 404 || c1 != c2 || used != none || strings.Contains(used, "lead") {
			t.Errorf("for a non-approver a used link (%d) differs from an unknown one (%d):\n%s\n---\n%s", c1, c2, used, none)
		}
		// The requester, though they hold the approver role: separation of duties kept them
		// from deciding, and the used link tells them no more than an unknown one — not the
		// outcome, not who decided (issue 33 item 5).
		own := h.propose("used-2", "lead2")
		if code := h.decide(lead, own, "approve"); code != 200 {
			t.Fatalf("approve: %d", code)
		}
		c1, used, _ = lead2.do("GET", own, nil, nil)
		c2, none, _ = lead2.do("GET", unknown, nil, nil)
		if c1 != 404 || c1 != c2 || used != none || strings.Contains(used, "Decided by") || strings.Contains(used, "approved") {
			t.Errorf("for its requester a used link (%d) differs from an unknown one (%d):\n%s\n---\n%s", c1, c2, used, none)
		}
		// Signed out: the same, and no sign-in redirect that would tell a live token.
		anon := newBrowser(t)
		c1, used, _ = anon.do("GET", link, nil, nil)
		c2, none, _ = anon.do("GET", unknown, nil, nil)
		if c1 != 404 || c1 != c2 || used != none {
			t.Errorf("signed out, a used link (%d) differs from an unknown one (%d)", c1, c2)
		}
		// Nothing changed by looking.
		if effs := h.get("/v1/runs/used-1").body["effects"].([]any); len(effs) != 1 {
			t.Fatalf("%d effects after looking at the used link", len(effs))
		}
	})
}

// planInput claims key and plans the gated share_publicly through the ledger as a
// client's agent does, with input (raw JSON; "" sends none); it returns the approval link.
func (h *harness) planInput(key, input string) string {
	h.t.Helper()
	owner, _ := h.claim(key)
	hash := strings.Repeat("ab", 32)
	body := fmt.Sprintf(`{"lease_owner":"%s","action":"share_publicly","target":"default","input_hash":"%s"}`, owner, hash)
	if input != "" {
		var err error
		if hash, err = ledger.InputHash([]byte(input)); err != nil {
			h.t.Fatal(err)
		}
		body = fmt.Sprintf(`{"lease_owner":"%s","action":"share_publicly","target":"default","input_hash":"%s","input":%s}`, owner, hash, input)
	}
	r := h.post("/v1/runs/"+key+"/ledger/effects/refund-1/plan", body)
	expect(h.t, r, 202, "")
	return r.body["approve_url"].(string)
}

// Issue 34 item 1: each executor's card says what approving does, in its own words. An
// agent's plan shows its input as named fields under "Action to be performed" with a
// plain "Approve"; a plan without input says so; email keeps "Approve and send"; a
// worker's task has no "Target default"; and no approver's card carries the rerun
// protocol (the console's run page does).
func TestCardPerExecutor(t *testing.T) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			h := cardHarness(t, b)
			br := newBrowser(t)
			h.signIn(br, "lead")
			card := func(link string) string {
				t.Helper()
				code, page, _ := br.do("GET", link, nil, nil)
				if code != 200 {
					t.Fatalf("card: %d %s", code, page)
				}
				if strings.Contains(page, "Rerun protocol") || strings.Contains(page, "Model output to be sent") {
					t.Errorf("an approver's card carries the rerun protocol or the email's wording:\n%s", page)
				}
				return page
			}
			button := func(page string) string {
				t.Helper()
				_, rest, ok := strings.Cut(page, `name="decision" value="approve">`)
				if !ok {
					t.Fatalf("no approve button:\n%s", page)
				}
				label, _, _ := strings.Cut(rest, "</button>")
				return label
			}
			agent := card(h.planInput("x-agent", `{"order_id":"A-17","amount":{"value":40,"currency":"EUR"},"note":"refund the broken kettle"}`))
			for _, want := range []string{"<h2>Action to be performed</h2>", "<dt>Action</dt><dd><code>share_publicly</code>", "<dt>order_id</dt>", "A-17",
				"<dt>amount</dt>", "&#34;currency&#34;: &#34;EUR&#34;", "<dt>note</dt>", "refund the broken kettle"} {
				if !strings.Contains(agent, want) {
					t.Errorf("the agent's card lacks %q:\n%s", want, agent)
				}
			}
			if got := button(agent); got != "Approve" {
				t.Errorf("the agent's approve button says %q, want Approve", got)
			}
			blind := card(h.planInput("x-blind", ""))
			for _, want := range []string{"<h2>Action to be performed</h2>", `id="card-empty"`, "did not send what it will do", strings.Repeat("ab", 32)} {
				if !strings.Contains(blind, want) {
					t.Errorf("the card of a plan without input lacks %q:\n%s", want, blind)
				}
			}
			mcp := card(h.planTool("x-mcp", "delete_entities", `{"entityNames":["customer:ana"]}`, ""))
			if got := button(mcp); got != "Approve" || !strings.Contains(mcp, "<h2>Action to be performed</h2>") {
				t.Errorf("the MCP card's button says %q:\n%s", got, mcp)
			}
			mail := card(h.queueMail("x-mail", `{"subject":"Your refund","text":"Dear Ana"}`, ""))
			if got := button(mail); got != "Approve and send" {
				t.Errorf("the email's button says %q, want Approve and send", got)
			}
			httpCard := card(h.propose("x-http", ""))
			if got := button(httpCard); got != "Approve and send" {
				t.Errorf("the HTTP card's button says %q", got)
			}
			if !strings.Contains(httpCard, "<dt>Idempotency-Key</dt><dd><code>x-http/") {
				t.Errorf("the HTTP card's Idempotency-Key is not the one the provider gets (run key/effect id):\n%s", httpCard)
			}
			owner, v := h.claim("x-worker")
			r := h.post("/v1/runs/x-worker/effects", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"action_type":"share_publicly","target":"default","payload":{"title":"Release notes"}}`, owner, v))
			expect(t, r, 202, "")
			worker := card(r.body["approve_url"].(string))
			if got := button(worker); got != "Approve" {
				t.Errorf("the worker's button says %q, want Approve", got)
			}
			_, workerCard, _ := strings.Cut(worker, "<h2>Task the worker will perform</h2>")
			workerCard, _, _ = strings.Cut(workerCard, "</dl>")
			if workerCard == "" || strings.Contains(workerCard, "Target") || strings.Contains(workerCard, ">default<") {
				t.Errorf("the worker's card says the target jargon: %q", workerCard)
			}
			// The decision page says what approving did, per executor.
			if code, page, _ := br.do("POST", h.planInput("x-agent-2", `{"order_id":"A-18"}`), url.Values{"decision": {"approve"}}, nil); code != 200 ||
				!strings.Contains(page, "the agent may now perform this action, once, with exactly the input shown") {
				t.Errorf("approving the agent's plan: %d\n%s", code, page)
			}
			if code, page, _ := br.do("POST", h.planInput("x-blind-2", ""), url.Values{"decision": {"approve"}}, nil); code != 200 ||
				!strings.Contains(page, "(none was shown)") {
				t.Errorf("approving a plan without input: %d\n%s", code, page)
			}
		})
	}
}
