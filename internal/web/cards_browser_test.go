package web_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/airlockhq/airlock/internal/apptest/chromium"

	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// TestCardsInBrowser is issue 22 items 2 and 7 as a person sees them, in headless
// Chromium with scripts off, on both stores: an email as an email (a hostile subject is
// text, the HTML part its words), an HTTP request as its fields, an MCP call as its
// arguments, the source record as a safe link; the decision page leads onward; a used
// link shows its decision to an approver and the neutral page to anyone else; the Run
// page prints commands without backticks; parked runs say what happened; This week says
// that everything is stopped, and which types, and what is outstanding, each linked; the
// runs page lists, filters and pages runs and links each to its Run page, and a bad
// filter is its 400 page. AIRLOCK_SCREENSHOTS=DIR keeps the PNGs.
func TestCardsInBrowser(t *testing.T) {
	chromium.Require(t)
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			h := cardHarness(t, b)
			h.addUser("lead-ops", "support-lead", "ops")
			const source = "https://support.example.com/tickets/4711"
			mail := h.queueMail("ticket-4711", `{"subject":"Your refund <img src=x onerror=alert(1)>","text":"Dear Ana,\n\nyour refund of 40 EUR is on its way.\n\nThe support team","html":"<p>Dear Ana,</p><p>your refund of <b>40 EUR</b> is on its way.</p><script>steal()</script>","reply_to":"help@example.com"}`,
				`{"source_url":"`+source+`","trigger_source":"zendesk","model":{"provider":"openai","name":"gpt-5-mini"}}`)
			httpLink := h.propose("crm-note-9", "")
			mcp := h.planTool("agent-run-3", "delete_entities", `{"entityNames":["customer:ana","customer:bob"],"reason":"GDPR erasure request 881"}`, `{"source_url":"https://crm.example.com/requests/881"}`)
			h.unknownEffect("job-unknown")
			owner, v := h.claim("job-parked")
			expect(t, h.post("/v1/runs/job-parked/failures", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"class":"unknown_commit","detail":"CRM write timed out after the request was sent"}`, owner, v)), 200, "")
			ctx0 := context.Background()
			for scope, on := range map[string]bool{effects.GlobalScope: false, effects.ActionScope("mail"): false} {
				if err := h.env.Effects.SetKillSwitch(ctx0, scope, on, "incident 12", "test"); err != nil {
					t.Fatal(err)
				}
			}

			dir := chromium.ScreenshotDir(t)
			ctx, step := chromium.NewForms(t)
			var err error
			shoot := func(name string) {
				t.Helper()
				png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
				step("screenshot "+name, err)
				step("save "+name, os.WriteFile(filepath.Join(dir, b.Name+"-"+name+".png"), png, 0o644))
			}
			status := func(resp *network.Response, want int, path string) {
				t.Helper()
				u, _ := url.Parse(resp.URL)
				if resp.Status != int64(want) || (path != "" && u.Path != path) {
					t.Fatalf("%s: %d %s, want %d %s", resp.URL, resp.Status, u.Path, want, path)
				}
			}
			open := func(u string, want int) {
				t.Helper()
				resp, err := chromedp.Run(ctx, chromedp.NavigateResponse(u))
				step("open "+u, err)
				status(resp, want, "")
				chromium.NoScripts(ctx, t, u)
			}
			tab := tabReader{ctx, t, step}
			text, dd, count := tab.text, tab.dd, tab.count
			attr := func(sel, name string) string {
				t.Helper()
				r, err := chromedp.Run(ctx, chromedp.AttributeValue(chromedp.CSS(sel), name))
				step("attribute "+name, err)
				return r.Value
			}
			signIn := func(name string) {
				t.Helper()
				open(h.url+"/login", 200)
				step("fill the sign-in form", chromedp.Do(ctx,
					chromedp.SendKeys(chromedp.CSS(`form[action="/login"] input[name="username"]`), name),
					chromedp.SendKeys(chromedp.CSS(`form[action="/login"] input[name="password"]`), "correct horse battery"),
				))
				resp, err := chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(`form[action="/login"] button[type="submit"]`)))
				step("sign in", err)
				status(resp, 200, "/login")
			}
			signIn("lead-ops")

			// The email: recipient, subject as text, the body, the HTML part as its words,
			// the source record as a link that carries neither opener nor referrer.
			open(mail, 200)
			if h2 := text(`//h2[1]`); h2 != "Email to be sent" {
				t.Fatalf("the mail card's heading is %q", h2)
			}
			if to, subj := dd("To"), dd("Subject"); to != "ana@example.com" || subj != "Your refund <img src=x onerror=alert(1)>" {
				t.Fatalf("the mail card shows To %q, Subject %q", to, subj)
			}
			if msg := dd("Message"); !strings.HasPrefix(msg, "Dear Ana,") {
				t.Fatalf("the message reads %q", msg)
			}
			if part := dd("HTML version"); !strings.Contains(part, "your refund of 40 EUR is on its way.") || strings.Contains(part, "steal") {
				t.Fatalf("the HTML part reads %q", part)
			}
			if n := count("dl.card img, dl.card b, dl.card script"); n != 0 {
				t.Fatalf("%d elements of the payload rendered on the card", n)
			}
			if href, rel := attr("#source-link", "href"), attr("#source-link", "rel"); href != source || rel != "noopener noreferrer" {
				t.Fatalf("source link href %q rel %q", href, rel)
			}
			if n := count("details > pre"); n != 1 {
				t.Fatalf("the raw JSON is not one click away (%d details blocks)", n)
			}
			shoot("card-email")

			// The HTTP request.
			open(httpLink, 200)
			if m, u := dd("Method"), dd("URL"); m != "POST" || u != h.env.Provider.URL+"/mail" {
				t.Fatalf("the HTTP card shows %q %q", m, u)
			}
			if dd("Idempotency-Key") == "" || !strings.Contains(dd("Body"), `"to": "ana@example.com"`) {
				t.Fatal("the HTTP card lacks its key or body")
			}
			shoot("card-http")

			// The MCP call, its arguments by name; approve it; the decision page leads on.
			open(mcp, 200)
			if tool, names := dd("Tool"), dd("entityNames"); tool != "delete_entities" || !strings.Contains(names, "customer:bob") {
				t.Fatalf("the MCP card shows tool %q, entityNames %q", tool, names)
			}
			if attr("#source-link", "href") != "https://crm.example.com/requests/881" {
				t.Fatal("the MCP card lacks the call's source link")
			}
			shoot("card-mcp")
			// An agent's action is approved, not "sent": airlock sends nothing itself.
			resp, err := chromedp.RunResponse(ctx, chromedp.Click(`//button[normalize-space()="Approve"]`))
			step("approve", err)
			status(resp, 200, "")
			if n := count(`p.onward a[href="/console"]`) + count(`p.onward a[href="/console/runs?key=agent-run-3"]`); n != 2 {
				t.Fatalf("the decision page is a dead end (%d onward links)", n)
			}
			shoot("decided")

			// The used link again: what was decided, by whom, when.
			open(mcp, 200)
			if o, who := dd("Outcome"), dd("Decided by"); !strings.HasPrefix(o, "approved") || who != "lead-ops" || dd("When") == "" {
				t.Fatalf("the used link shows outcome %q by %q", o, who)
			}
			if count(`button[name="decision"]`) != 0 {
				t.Fatal("the used link offers a decision")
			}
			shoot("used-link")
			resp, err = chromedp.RunResponse(ctx, chromedp.Click(`//p[@class="onward"]/a[normalize-space()="The run's status"]`))
			step("onward to the run", err)
			status(resp, 200, "/console/runs")

			// The Run page: the CLI command as code, no backticks.
			open(h.url+"/console/runs?key=job-unknown", 200)
			if sent := dd("Sent?"); strings.Contains(sent, "`") || !strings.Contains(sent, "airlock effects resolve") {
				t.Fatalf("Sent? reads %q", sent)
			}
			if code := text(`//dt[normalize-space()="Sent?"]/following-sibling::dd[1]/code`); code != "airlock effects resolve" {
				t.Fatalf("the command shows as %q", code)
			}
			shoot("run")

			// Parked runs: what happened, with the client's detail.
			open(h.url+"/console/parked", 200)
			if f := text(`p.failure`); !strings.Contains(f, "failure unknown_commit") || !strings.Contains(f, "CRM write timed out after the request was sent") {
				t.Fatalf("the parked card says %q", f)
			}
			shoot("parked")

			// This week: everything stopped, and the type stopped on its own.
			open(h.url+"/console/week", 200)
			if s := text(`#sending`); !strings.Contains(s, "stopped for everything") || !strings.Contains(s, "stopped: mail") || strings.Contains(s, "disabled") {
				t.Fatalf("the sending tile says %q", s)
			}
			shoot("week")

			// Outstanding now: the pending approvals and the parked run, each a link to its list.
			if s := text(`#outstanding`); !strings.Contains(s, "2 pending approvals") || !strings.Contains(s, "1 parked run") || !strings.Contains(s, "1 unknown") {
				t.Fatalf("Outstanding now says %q", s)
			}
			resp, err = chromedp.RunResponse(ctx, chromedp.Click(`#outstanding-approvals`))
			step("open the pending approvals", err)
			status(resp, 200, "/console/approvals")
			if n := count(`table#approvals tr`); n != 3 || !strings.Contains(text(`#approvals`), "ticket-4711") || !strings.Contains(text(`#approvals`), "crm-note-9") {
				t.Fatalf("pending approvals: %d rows: %s", n, text(`#approvals`))
			}
			shoot("approvals")
			open(h.url+"/console/week", 200)
			resp, err = chromedp.RunResponse(ctx, chromedp.Click(`#outstanding-parked`))
			step("open the parked runs", err)
			status(resp, 200, "/console/parked")
			open(h.url+"/console/week", 200)
			resp, err = chromedp.RunResponse(ctx, chromedp.Click(`#outstanding-waiting`))
			step("open the runs waiting for a person", err)
			status(resp, 200, "/console/runs")
			listed := func(key string) int {
				t.Helper()
				return count(`table#runs a[href="/console/runs?key=` + key + `"]`)
			}
			if n := count(`table#runs tr`); n != 4 || listed("job-parked")+listed("ticket-4711")+listed("crm-note-9") != 3 || listed("job-unknown") != 0 {
				t.Fatalf("runs waiting for a person: %d rows", n)
			}

			// The runs page: from the nav, every run; the filter form; a run's link; pages.
			open(h.url+"/console", 200)
			resp, err = chromedp.RunResponse(ctx, chromedp.Click(`//header//a[normalize-space()="Runs"]`))
			step("open the runs from the nav", err)
			status(resp, 200, "/console/runs")
			if n := count(`table#runs tr`); n != 6 {
				t.Fatalf("the runs page lists %d rows, want 5 runs and the header", n)
			}
			shoot("runs")
			step("fill the filters", chromedp.Do(ctx,
				chromedp.SetValue(chromedp.CSS(`#filters select[name="state"]`), "awaiting_human"),
				chromedp.SendKeys(chromedp.CSS(`#filters input[name="key_prefix"]`), "job-"),
			))
			resp, err = chromedp.RunResponse(ctx, chromedp.Click(`//form[@id="filters"]//button[normalize-space()="Filter"]`))
			step("filter", err)
			status(resp, 200, "/console/runs")
			if u, _ := url.Parse(resp.URL); u.Query().Get("state") != "awaiting_human" || u.Query().Get("key_prefix") != "job-" {
				t.Fatalf("the filter form sent %s", resp.URL)
			}
			if n := count(`table#runs tr`); n != 2 || listed("job-parked") != 1 {
				t.Fatalf("filtered runs: %d rows", n)
			}
			if v := attr(`#filters input[name="key_prefix"]`, "value"); v != "job-" {
				t.Fatalf("the form forgot the key prefix: %q", v)
			}
			resp, err = chromedp.RunResponse(ctx, chromedp.Click(`//table[@id="runs"]//a[normalize-space()="job-parked"]`))
			step("open a run from the list", err)
			status(resp, 200, "/console/runs")
			if h1 := text(`h1`); h1 != "Run job-parked" {
				t.Fatalf("the run's link opens %q", h1)
			}
			// Keyset pages of two: every run once.
			open(h.url+"/console/runs?limit=2", 200)
			seen := map[string]int{}
			keys := []string{"ticket-4711", "crm-note-9", "agent-run-3", "job-unknown", "job-parked"}
			for range 5 {
				for _, k := range keys {
					seen[k] += listed(k)
				}
				if count(`#next-page`) == 0 {
					break
				}
				resp, err = chromedp.RunResponse(ctx, chromedp.Click(`#next-page`))
				step("next page", err)
				status(resp, 200, "/console/runs")
			}
			for _, k := range keys {
				if seen[k] != 1 {
					t.Fatalf("the pages of two show the runs %v times, want each once", seen)
				}
			}
			// A bad filter: the 400 page says which and why.
			open(h.url+"/console/runs?older_than=soon", 400)
			if h1, msg := text(`h1`), text(`main p`); h1 != "Not shown" || !strings.Contains(msg, "The older_than filter must be a Go duration (36h) or days (7d)") {
				t.Fatalf("a bad filter shows %q: %q", h1, msg)
			}

			// Someone signed in without the role: the used link is the neutral page.
			h.addUser("intern-2", "support")
			resp, err = chromedp.RunResponse(ctx, chromedp.Click(`//header//button[normalize-space()="sign out"]`))
			step("sign out", err)
			status(resp, 200, "/login")
			signIn("intern-2")
			open(mcp, 404)
			if h1 := text(`h1`); h1 != "This link cannot be used" {
				t.Fatalf("a non-approver opening a used link sees %q", h1)
			}
		})
	}
}
