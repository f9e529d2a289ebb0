package httpapi_test

import (
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/airlockhq/airlock/internal/apptest/chromium"
)

// TestSlackLinkInBrowser: in headless Chromium (JavaScript off), on both stores, a person
// signs in, takes a link code on the console's Link Slack page, and the code links their
// Slack user through a signed slash command; the page the Slack message links to is the
// approval's console page, with the card and the decision form. Both are photographed.
func TestSlackLinkInBrowser(t *testing.T) {
	chromium.Require(t)
	forEachBackend(t, func(t *testing.T, h *harness) {
		s := newSlackStandin(t, h)
		h.addUser("lead", "support-lead")
		h.proposeSubject("sb-1", "", "Refund for order 1182")
		msg := parseSlackMessage(t, s.lastMessage())

		ctx, step := chromium.NewForms(t)
		_, err := chromedp.Run(ctx, chromedp.NavigateResponse(h.url+"/login"))
		step("sign-in page", err)
		step("fill the sign-in form", chromedp.Do(ctx,
			chromedp.SendKeys(chromedp.CSS(`form[action="/login"] input[name="username"]`), "lead"),
			chromedp.SendKeys(chromedp.CSS(`form[action="/login"] input[name="password"]`), "correct horse battery"),
		))
		_, err = chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(`form[action="/login"] button[type="submit"]`)))
		step("sign in", err)
		_, err = chromedp.Run(ctx, chromedp.NavigateResponse(h.url+"/console/slack"))
		step("Link Slack page", err)
		chromium.NoScripts(ctx, t, "/console/slack")
		resp, err := chromedp.RunResponse(ctx, chromedp.Click(`//button[normalize-space()="Get a link code"]`))
		step("get a code", err)
		if resp.Status != 200 {
			t.Fatalf("code: %d", resp.Status)
		}
		command, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("#slack-command")))
		step("read the command", err)
		m := regexp.MustCompile(`^/airlock link ([0-9A-F]{20})$`).FindStringSubmatch(strings.TrimSpace(command))
		if m == nil {
			t.Fatalf("command: %q", command)
		}
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		step("screenshot", err)
		step("save", os.WriteFile(filepath.Join(chromium.ScreenshotDir(t), strings.ToLower(filepath.Base(t.Name()))+"-slack-link.png"), png, 0o644))
		if r := s.command("U5", "link "+m[1]); !strings.Contains(r.raw, "you are lead") {
			t.Fatalf("link: %s", r.raw)
		}

		// The message's page link: the approval's console page, its card and its form.
		resp, err = chromedp.RunResponse(ctx, chromedp.Navigate(msg.link))
		step("open the message's link", err)
		if u, _ := url.Parse(resp.URL); resp.Status != 200 || !strings.HasPrefix(u.Path, "/console/approvals/") {
			t.Fatalf("approval page: %d %s", resp.Status, resp.URL)
		}
		text, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("body")))
		step("read the page", err)
		if !strings.Contains(text, "Refund for order 1182") || !strings.Contains(text, h.approvalOf("sb-1").PayloadHash[:12]) {
			t.Fatalf("approval page:\n%s", text)
		}
		png, err = chromedp.Run(ctx, chromedp.FullScreenshot(100))
		step("screenshot", err)
		step("save", os.WriteFile(filepath.Join(chromium.ScreenshotDir(t), strings.ToLower(filepath.Base(t.Name()))+"-slack-approval-page.png"), png, 0o644))
	})
}
