package web_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/airlockhq/airlock/internal/apptest/chromium"
)

// tabReader reads what a newFormsChromium tab shows; a read that fails ends the test
// through step, naming it.
type tabReader struct {
	ctx  context.Context
	t    *testing.T
	step func(name string, err error)
}

// text is the trimmed text of the first node sel finds.
func (r tabReader) text(sel string) string {
	r.t.Helper()
	s, err := chromedp.Run(r.ctx, chromedp.Text(sel))
	r.step("read "+sel, err)
	return strings.TrimSpace(s)
}

// dd is the text of the definition a <dt> labelled label introduces.
func (r tabReader) dd(label string) string {
	r.t.Helper()
	return r.text(`//dt[normalize-space()="` + label + `"]/following-sibling::dd[1]`)
}

// count is how many nodes the CSS selector sel finds (none is an answer, not a wait).
func (r tabReader) count(sel string) int {
	r.t.Helper()
	nodes, err := chromedp.Run(r.ctx, chromedp.Nodes(chromedp.CSSAll(sel), chromedp.AtLeast(0)))
	r.step("count "+sel, err)
	return len(nodes)
}

// TestApprovalInBrowser walks the approval flow in a real headless Chromium with
// JavaScript switched off: a signed-out person opens the link, signs in, sees the card,
// approves with the form's button, and the link is dead afterwards.
func TestApprovalInBrowser(t *testing.T) {
	chromium.Require(t)
	forEachBackend(t, func(t *testing.T, h *harness) {
		const key = "ticket-browser-1"
		h.addUser("lead", "support-lead")
		link := h.propose(key, "")
		ctx, step := chromium.NewForms(t)
		start := time.Now()
		path := func(resp *network.Response) string {
			t.Helper()
			u, err := url.Parse(resp.URL)
			if err != nil {
				t.Fatal(err)
			}
			return u.Path
		}

		var err error
		step("script probe", chromedp.Do(ctx, chromedp.Navigate(`data:text/html,<title>off</title><script>document.title="on"</script>`)))
		if title, err := chromedp.Run(ctx, chromedp.Title()); err != nil || title != "off" {
			t.Fatalf("a page script still ran (title %q, %v): the check below would prove nothing", title, err)
		}

		// Signed out: the link leads to the sign-in page, without the token in the URL.
		resp, err := chromedp.Run(ctx, chromedp.NavigateResponse(link))
		step("open the link", err)
		if resp.Status != 200 || path(resp) != "/login" {
			t.Fatalf("opening the link signed out: %d %s, want 200 /login", resp.Status, path(resp))
		}
		step("sign-in page", chromedp.Do(ctx, chromedp.WaitVisible(`//h1[normalize-space()="Sign in to airlock"]`)))
		chromium.NoScripts(ctx, t, "the sign-in page")

		// Sign in with real key presses and a click on the button.
		step("fill the sign-in form", chromedp.Do(ctx,
			chromedp.SendKeys(chromedp.CSS(`form[action="/login"] input[name="username"]`), "lead"),
			chromedp.SendKeys(chromedp.CSS(`form[action="/login"] input[name="password"]`), "correct horse battery"),
		))
		resp, err = chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(`form[action="/login"] button[type="submit"]`)))
		step("sign in", err)
		if resp.Status != 200 || path(resp) != "/approve/continue" {
			t.Fatalf("after sign-in: %d %s, want 200 /approve/continue", resp.Status, path(resp))
		}

		// The approval card: the idempotency key and the decision buttons; the rerun
		// protocol is the operator's (the console's run page), not the approver's.
		step("approval card", chromedp.Do(ctx,
			chromedp.WaitVisible(`//h1[starts-with(normalize-space(), "Approve or reject")]`),
			chromedp.WaitVisible(`//button[normalize-space()="Approve and send"]`),
		))
		shownKey, err := chromedp.Run(ctx, chromedp.Text(`//dt[normalize-space()="Idempotency key"]/following-sibling::dd[1]`))
		step("read the idempotency key", err)
		if strings.TrimSpace(shownKey) != key {
			t.Fatalf("the card shows idempotency key %q, want %q", shownKey, key)
		}
		body, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("body")))
		step("read the card", err)
		for _, want := range []string{key, "Signed in as lead"} {
			if !strings.Contains(body, want) {
				t.Fatalf("the card does not show %q:\n%s", want, body)
			}
		}
		if strings.Contains(body, "Rerun protocol") {
			t.Fatalf("the approver's card still carries the rerun protocol:\n%s", body)
		}
		chromium.NoScripts(ctx, t, "the approval card")

		// Approve with the form's button.
		resp, err = chromedp.RunResponse(ctx, chromedp.Click(`//button[normalize-space()="Approve and send"]`))
		step("approve", err)
		if resp.Status != 200 {
			t.Fatalf("approve: status %d", resp.Status)
		}
		step("decision page", chromedp.Do(ctx, chromedp.WaitVisible(`//h1[normalize-space()="Decision recorded"]`)))
		msg, err := chromedp.Run(ctx, chromedp.Text(`//h1[normalize-space()="Decision recorded"]/following-sibling::p[1]`))
		step("read the decision", err)
		if !strings.HasPrefix(strings.TrimSpace(msg), "Approved") {
			t.Fatalf("after approving the page says %q, want Approved…", msg)
		}
		chromium.NoScripts(ctx, t, "the decision page")

		// Through the API: approved, with one effect queued.
		run := h.get("/v1/runs/" + key)
		effs, _ := run.body["effects"].([]any)
		if run.body["state"] != "approved" || len(effs) != 1 || effs[0].(map[string]any)["state"] != "pending" {
			t.Fatalf("after approving in the browser: %s", run.raw)
		}

		// The same link again, still signed in as its approver: what was decided, by whom
		// and when (issue 22 item 7: it said "unknown, expired or already used"); nothing
		// changed, and no button to decide again.
		resp, err = chromedp.Run(ctx, chromedp.NavigateResponse(link))
		step("open the link again", err)
		if resp.Status != 200 {
			t.Fatalf("second visit: status %d, want 200", resp.Status)
		}
		step("decided page", chromedp.Do(ctx, chromedp.WaitVisible(`//h1[starts-with(normalize-space(), "Already decided")]`)))
		decidedBy, err := chromedp.Run(ctx, chromedp.Text(`//dt[normalize-space()="Decided by"]/following-sibling::dd[1]`))
		step("read who decided", err)
		outcome, err := chromedp.Run(ctx, chromedp.Text(`//dt[normalize-space()="Outcome"]/following-sibling::dd[1]`))
		step("read the outcome", err)
		if strings.TrimSpace(decidedBy) != "lead" || !strings.HasPrefix(strings.TrimSpace(outcome), "approved") {
			t.Fatalf("second visit shows decided by %q, outcome %q", decidedBy, outcome)
		}
		body, err = chromedp.Run(ctx, chromedp.Text(chromedp.CSS("body")))
		step("read the decided page", err)
		if strings.Contains(body, "Approve and send") || !strings.Contains(body, key) {
			t.Fatalf("second visit shows:\n%s", body)
		}
		chromium.NoScripts(ctx, t, "the decided page")
		if effs := h.get("/v1/runs/" + key).body["effects"].([]any); len(effs) != 1 {
			t.Fatalf("%d effects after the second visit", len(effs))
		}
		t.Logf("browser flow took %v", time.Since(start).Round(time.Millisecond))
	})
}
