package web_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/airlockhq/airlock/internal/apptest/chromium"

	"github.com/airlockhq/airlock/internal/app"
	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/policy"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// stepsPolicy adds a worker type whose approvals are warned 30 minutes before they lapse
// (2 h) and escalated to finance-lead after an hour.
func stepsPolicy(t *testing.T) func(env *apptest.EffectsEnv, o *app.Options) {
	return func(env *apptest.EffectsEnv, o *app.Options) {
		yaml := strings.Replace(apptest.PolicyYAML(env.Provider.URL), "\nactions:\n", `
actions:
  refund:
    connector: worker
    approvers: {roles: [support-lead]}
    approval_ttl: 2h
    approval: {warn_before: 30m, escalate: {after: 1h, roles: [finance-lead]}}
`, 1)
		pol, err := policy.Parse([]byte(yaml), func(string) (string, bool) { return "", false })
		if err != nil {
			t.Fatal(err)
		}
		o.Policy = pol
	}
}

// TestApprovalStepsInBrowser: the approval card, the console's pending approvals and
// Waiting for me show whether an approval's expiry warning went out and whether it was
// escalated, to which roles and since when (warned_at, escalated_at), in headless Chromium
// with JavaScript off, on both stores. Before either step the card says when each is due
// and the lists say nothing; after the escalation the finance lead may open the card and
// the card names the role; after the warning, both show.
func TestApprovalStepsInBrowser(t *testing.T) {
	chromium.Require(t)
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			h := newHarnessWith(t, b, stepsPolicy(t))
			h.addUser("lead-ops", "support-lead", "ops")
			h.addUser("fin", "finance-lead")
			owner, v := h.claim("refund-311")
			r := h.post("/v1/runs/refund-311/effects", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"action_type":"refund","target":"default","payload":{"amount":40}}`, owner, v))
			expect(t, r, 202, "")
			link := r.body["approve_url"].(string)
			created := h.env.Clock.Now()
			sweep := func(d time.Duration) {
				t.Helper()
				h.env.Clock.Advance(d)
				if err := h.env.Approvals.Sweep(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			stamp := func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04 MST") }

			ctx, step := chromium.NewForms(t)
			open := func(u string, want int64) {
				t.Helper()
				resp, err := chromedp.Run(ctx, chromedp.NavigateResponse(u))
				step("open "+u, err)
				if resp.Status != want {
					t.Fatalf("%s: %d, want %d", u, resp.Status, want)
				}
				chromium.NoScripts(ctx, t, u)
			}
			tab := tabReader{ctx, t, step}
			text, dd, count := tab.text, tab.dd, tab.count
			signIn := func(name string) {
				t.Helper()
				_, err := chromedp.Call(ctx, network.ClearBrowserCookies, cdp.Empty{})
				step("sign out", err)
				open(h.url+"/login", 200)
				step("fill the sign-in form", chromedp.Do(ctx,
					chromedp.SendKeys(chromedp.CSS(`form[action="/login"] input[name="username"]`), name),
					chromedp.SendKeys(chromedp.CSS(`form[action="/login"] input[name="password"]`), "correct horse battery"),
				))
				_, err = chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(`form[action="/login"] button[type="submit"]`)))
				step("sign in", err)
			}
			row := func() string {
				t.Helper()
				open(h.url+"/console/approvals", 200)
				return text(`//table[@id="approvals"]//tr[td//code[normalize-space()="refund-311"]]/td[@class="notes"]`)
			}
			shoot := func(name string) {
				t.Helper()
				png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
				step("screenshot "+name, err)
				step("save "+name, os.WriteFile(filepath.Join(chromium.ScreenshotDir(t), b.Name+"-"+name+".png"), png, 0o644))
			}

			// Before either step: the card says when each is due, the list nothing.
			signIn("lead-ops")
			open(link, 200)
			if w := dd("Expiry warning"); w != "not sent yet; due "+stamp(created.Add(90*time.Minute)) {
				t.Fatalf("expiry warning before it is due: %q", w)
			}
			if e := dd("Escalation"); e != "not yet; role finance-lead may decide too from "+stamp(created.Add(time.Hour))+" if nobody has decided by then" {
				t.Fatalf("escalation before it is due: %q", e)
			}
			if n := count(`#warned b, #escalated b`); n != 0 {
				t.Fatalf("%d steps marked done before either happened", n)
			}
			if who := dd("Who may approve"); !strings.HasPrefix(who, "role support-lead") || strings.Contains(who, "finance") {
				t.Fatalf("who may approve before the escalation: %q", who)
			}
			if n := row(); n != "–" {
				t.Fatalf("the pending approvals row says %q before either step", n)
			}

			// The finance lead may not open it yet.
			signIn("fin")
			open(h.url+"/console/approvals/"+r.body["approval_id"].(string), 403)

			// Escalated after an hour: the card names the role and since when.
			sweep(61 * time.Minute)
			escalated := created.Add(61 * time.Minute)
			signIn("fin") // anew: the test clock moved past the session's idle limit
			open(h.url+"/console/approvals/"+r.body["approval_id"].(string), 200)
			if e := dd("Escalation"); e != "escalated "+stamp(escalated)+": role finance-lead may decide too" {
				t.Fatalf("escalation: %q", e)
			}
			if n := count(`#escalated b`); n != 1 {
				t.Fatal("the escalation is not marked done")
			}
			if who := dd("Who may approve"); !strings.HasPrefix(who, "role support-lead, role finance-lead (escalated)") {
				t.Fatalf("who may approve after the escalation: %q", who)
			}
			if w := dd("Expiry warning"); !strings.HasPrefix(w, "not sent yet") {
				t.Fatalf("expiry warning before it is due: %q", w)
			}
			open(h.url+"/console", 200)
			if s := text(`main`); !strings.Contains(s, "escalated to role finance-lead 0s ago") || strings.Contains(s, "expiry warning sent") {
				t.Fatalf("Waiting for me after the escalation:\n%s", s)
			}

			// Warned 30 minutes before it lapses: both show, on the card and the list.
			sweep(30 * time.Minute)
			warned := created.Add(91 * time.Minute)
			signIn("lead-ops")
			open(link, 200)
			if w := dd("Expiry warning"); w != "sent "+stamp(warned)+": the approvers were told it expires soon" {
				t.Fatalf("expiry warning: %q", w)
			}
			if n := count(`#warned b, #escalated b`); n != 2 {
				t.Fatalf("%d steps marked done, want 2", n)
			}
			shoot("card-steps")
			if n := row(); n != "expiry warning sent 0s ago · escalated to role finance-lead 30m ago" {
				t.Fatalf("the pending approvals row says %q", n)
			}
			shoot("approvals-steps")
			h.env.Clock.Advance(5 * time.Minute)
			if n := row(); n != "expiry warning sent 5m ago · escalated to role finance-lead 35m ago" {
				t.Fatalf("the pending approvals row five minutes on says %q", n)
			}
		})
	}
}
