package web_test

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/airlockhq/airlock/internal/apptest/chromium"
)

// TestConsoleInBrowser drives the console in headless Chromium with JavaScript off, on
// both stores: an approver decides from the console and is refused the operators'
// pages; an operator resolves an unknown effect and unparks a run and is offered no kill
// switch; an admin stops every send. Each page is photographed at a laptop's and a
// phone's width.
func TestConsoleInBrowser(t *testing.T) {
	chromium.Require(t)
	forEachBackend(t, func(t *testing.T, h *harness) {
		h.addUser("lead", "support-lead")
		h.addUser("ops", "ops")
		h.addUser("sre", "sre")
		h.propose("ticket-7", "")
		h.propose("ticket-8", "")
		eid := h.unknownEffect("job-1")
		h.parked("job-2")
		dir := chromium.ScreenshotDir(t)
		ctx, step := chromium.NewForms(t)
		var err error
		backend := strings.ToLower(filepath.Base(t.Name()))
		shoot := func(name string) {
			t.Helper()
			for _, vp := range []struct {
				label string
				w, h  int64
			}{{"laptop", 1280, 800}, {"phone", 390, 844}} {
				step("viewport", chromedp.Do(ctx, chromedp.EmulateViewport(vp.w, vp.h)))
				png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
				step("screenshot "+name, err)
				step("save "+name, os.WriteFile(filepath.Join(dir, backend+"-"+name+"-"+vp.label+".png"), png, 0o644))
			}
			step("viewport", chromedp.Do(ctx, chromedp.EmulateViewport(1280, 800)))
		}
		status := func(resp *network.Response, want int, path string) {
			t.Helper()
			u, _ := url.Parse(resp.URL)
			if resp.Status != int64(want) || (path != "" && u.Path != path) {
				t.Fatalf("%s: %d %s, want %d %s", resp.URL, resp.Status, u.Path, want, path)
			}
		}
		body := func() string {
			t.Helper()
			s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("body")))
			step("read the page", err)
			return s
		}
		count := tabReader{ctx, t, step}.count
		signIn := func(name string) {
			t.Helper()
			resp, err := chromedp.Run(ctx, chromedp.NavigateResponse(h.url+"/login"))
			step("sign-in page", err)
			status(resp, 200, "/login")
			step("fill the sign-in form", chromedp.Do(ctx,
				chromedp.SendKeys(chromedp.CSS(`form[action="/login"] input[name="username"]`), name),
				chromedp.SendKeys(chromedp.CSS(`form[action="/login"] input[name="password"]`), "correct horse battery"),
			))
			resp, err = chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(`form[action="/login"] button[type="submit"]`)))
			step("sign in", err)
			status(resp, 200, "/login")
			resp, err = chromedp.RunResponse(ctx, chromedp.Click(`//a[normalize-space()="Open the console"]`))
			step("open the console", err)
			status(resp, 200, "/console")
		}
		signOut := func() {
			t.Helper()
			_, err := chromedp.Run(ctx, chromedp.NavigateResponse(h.url+"/console"))
			step("open the console", err)
			resp, err := chromedp.RunResponse(ctx, chromedp.Click(`//header//button[normalize-space()="sign out"]`))
			step("sign out", err)
			status(resp, 200, "/login")
		}
		open := func(path string, want int) {
			t.Helper()
			resp, err := chromedp.Run(ctx, chromedp.NavigateResponse(h.url+path))
			step("open "+path, err)
			status(resp, want, "")
			chromium.NoScripts(ctx, t, path)
		}

		// The approver: their two approvals, no operator pages, a decision from the console.
		signIn("lead")
		if b := body(); !strings.Contains(b, "ticket-7") || !strings.Contains(b, "ticket-8") {
			t.Fatalf("waiting for me:\n%s", b)
		}
		if n := count(`a[href="/console/effects"]`); n != 0 {
			t.Fatal("the approver is shown the effects page")
		}
		shoot("waiting")
		open("/console/effects", 403)
		if b := body(); strings.Contains(b, "job-1") || count("form.act") != 0 {
			t.Fatalf("the approver sees the effects:\n%s", b)
		}
		open("/console", 200)
		resp, err := chromedp.RunResponse(ctx, chromedp.Click(`//h3/a[contains(., "ticket-7")]`))
		step("open the card", err)
		status(resp, 200, "/console/approvals/"+h.approvalID("ticket-7"))
		shoot("card")
		resp, err = chromedp.RunResponse(ctx, chromedp.Click(`//button[normalize-space()="Approve and send"]`))
		step("approve", err)
		status(resp, 200, "")
		if b := body(); !strings.Contains(b, "Approved") {
			t.Fatalf("after approving:\n%s", b)
		}
		if run := h.get("/v1/runs/ticket-7"); run.body["state"] != "approved" {
			t.Fatalf("after approving in the console: %s", run.raw)
		}
		// A fresh link for the other one: shown once, the old one dead.
		open("/console/approvals/"+h.approvalID("ticket-8"), 200)
		resp, err = chromedp.RunResponse(ctx, chromedp.Click(`//button[normalize-space()="Re-issue the link"]`))
		step("reissue", err)
		status(resp, 200, "/console/approvals/"+h.approvalID("ticket-8")+"/reissue")
		if b := body(); !strings.Contains(b, "New approval link") || !strings.Contains(b, h.url+"/approve/") {
			t.Fatalf("after reissuing:\n%s", b)
		}
		shoot("reissued")
		signOut()

		// The operator: resolve the unknown effect, unpark the run; no kill switch button.
		signIn("ops")
		open("/console/effects", 200)
		shoot("effects")
		step("fill the resolve form", chromedp.Do(ctx,
			chromedp.SetValue(chromedp.CSS(`form[action="/console/effects/`+eid+`/resolve"] select[name="outcome"]`), "sent"),
			chromedp.SendKeys(chromedp.CSS(`form[action="/console/effects/`+eid+`/resolve"] input[name="provider_id"]`), "ts-9"),
			chromedp.SendKeys(chromedp.CSS(`form[action="/console/effects/`+eid+`/resolve"] input[name="note"]`), "seen in Slack"),
		))
		resp, err = chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(`form[action="/console/effects/`+eid+`/resolve"] button`)))
		step("resolve", err)
		status(resp, 200, "/console/effects")
		if b := body(); !strings.Contains(b, "The effect is resolved") || strings.Contains(b, "job-1") {
			t.Fatalf("after resolving:\n%s", b)
		}
		if eff := h.get("/v1/runs/job-1").body["effects"].([]any)[0].(map[string]any); eff["state"] != "completed" || eff["provider_id"] != "ts-9" {
			t.Fatalf("after resolving in the browser: %v", eff)
		}
		open("/console/parked", 200)
		shoot("parked")
		step("fill the unpark form", chromedp.Do(ctx,
			chromedp.SendKeys(chromedp.CSS(`form[action="/console/runs/job-2/unpark"] input[name="reason"]`), "no such note in the CRM"),
		))
		resp, err = chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(`form[action="/console/runs/job-2/unpark"] button`)))
		step("unpark", err)
		status(resp, 200, "/console/parked")
		if run := h.get("/v1/runs/job-2"); run.body["state"] != "failed_retryable" {
			t.Fatalf("after unparking in the browser: %s", run.raw)
		}
		open("/console/runs?key=job-2", 200)
		if b := body(); !strings.Contains(b, "Processed?") || !strings.Contains(b, "no such note in the CRM") {
			t.Fatalf("the run page:\n%s", b)
		}
		shoot("run")
		open("/console/kill-switch", 200)
		if n := count(`form[action="/console/kill-switch"]`); n != 0 {
			t.Fatalf("the operator is offered %d kill switch forms", n)
		}
		open("/console/week", 200)
		if n := count("svg"); n < 4 {
			t.Fatalf("the week page draws %d charts", n)
		}
		shoot("week")
		signOut()

		// The admin stops every send.
		signIn("sre")
		open("/console/kill-switch", 200)
		step("fill the kill switch form", chromedp.Do(ctx,
			chromedp.SendKeys(chromedp.CSS(`form[action="/console/kill-switch"]:has(input[value="global"]) input[name="reason"]`), "incident 42"),
		))
		resp, err = chromedp.RunResponse(ctx, chromedp.Click(`//form[.//input[@value="global"]]//button[normalize-space()="Stop sending everything"]`))
		step("stop sending", err)
		status(resp, 200, "/console/kill-switch")
		if ok, _ := h.env.Effects.Enabled(context.Background(), ""); ok {
			t.Fatal("the kill switch did not stop sends")
		}
		if b := body(); !strings.Contains(b, "console:sre") || !strings.Contains(b, "incident 42") {
			t.Fatalf("the kill switch page after the change:\n%s", b)
		}
		shoot("killswitch")
	})
}
