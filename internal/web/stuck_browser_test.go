package web_test

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/airlockhq/airlock/internal/apptest/chromium"
)

// TestStuckApprovalsInBrowser: an operator reaches an approval nobody can decide from the
// console's navigation in headless Chromium (JavaScript off), on both stores, and follows
// its link to the run; the page is photographed.
func TestStuckApprovalsInBrowser(t *testing.T) {
	chromium.Require(t)
	forEachBackend(t, func(t *testing.T, h *harness) {
		h.addUser("ops", "ops")
		h.propose("refund-77", "") // nobody holds support-lead
		if err := h.env.Approvals.Sweep(context.Background()); err != nil {
			t.Fatal(err)
		}
		ctx, step := chromium.NewForms(t)
		var err error
		_, err = chromedp.Run(ctx, chromedp.NavigateResponse(h.url+"/login"))
		step("sign-in page", err)
		step("fill the sign-in form", chromedp.Do(ctx,
			chromedp.SendKeys(chromedp.CSS(`form[action="/login"] input[name="username"]`), "ops"),
			chromedp.SendKeys(chromedp.CSS(`form[action="/login"] input[name="password"]`), "correct horse battery"),
		))
		_, err = chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(`form[action="/login"] button[type="submit"]`)))
		step("sign in", err)
		_, err = chromedp.RunResponse(ctx, chromedp.Click(`//a[normalize-space()="Open the console"]`))
		step("open the console", err)
		resp, err := chromedp.RunResponse(ctx, chromedp.Click(`//header//a[normalize-space()="Stuck approvals"]`))
		step("open Stuck approvals", err)
		if u, _ := url.Parse(resp.URL); resp.Status != 200 || u.Path != "/console/stuck" {
			t.Fatalf("stuck page: %d %s", resp.Status, resp.URL)
		}
		chromium.NoScripts(ctx, t, "/console/stuck")
		text, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("body")))
		step("read the page", err)
		if !strings.Contains(text, "refund-77") || !strings.Contains(text, "role support-lead") || !strings.Contains(text, "Stuck for") {
			t.Fatalf("stuck page:\n%s", text)
		}
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		step("screenshot", err)
		step("save", os.WriteFile(filepath.Join(chromium.ScreenshotDir(t), strings.ToLower(filepath.Base(t.Name()))+"-stuck.png"), png, 0o644))
		resp, err = chromedp.RunResponse(ctx, chromedp.Click(`//h3/a[contains(., "refund-77")]`))
		step("open the run", err)
		if resp.Status != 200 || !strings.Contains(resp.URL, "/console/runs?key=refund-77") {
			t.Fatalf("run page: %d %s", resp.Status, resp.URL)
		}
	})
}
