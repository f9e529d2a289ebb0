package web_test

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/airlockhq/airlock/internal/apptest/chromium"
)

// Issue 34 in Chromium (JavaScript off), on both stores, at a laptop's and a phone's
// width: This week counts the stalled run and the waiting task and links them; the
// stalled filter lists the run; its Run page's tables and timeline fit a phone with no
// sideways scrolling; the operator releases the stall with the form's button; the
// unknown effect's card says what to look up.
func TestConsoleTroubleInBrowser(t *testing.T) {
	chromium.Require(t)
	forEachBackend(t, func(t *testing.T, h *harness) {
		h.addUser("ops", "ops")
		eid := h.unknownEffect("job-1")
		owner, v := h.claim("task-1")
		expect(t, h.post("/v1/runs/task-1/effects", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"action_type":"task","target":"default","payload":{"msg":"hi"}}`, owner, v)), 201, "")
		// The n8n execution that died: claimed, a few heartbeats and a queued effect
		// with long ids, then nothing.
		key := "n8n-ticket-4711-support.example.com-2026-12-02T04:00:00Z"
		owner, v = h.claim(key)
		for range 3 {
			expect(t, h.post("/v1/runs/"+key+"/heartbeat", fmt.Sprintf(`{"lease_owner":"%s","version":%d}`, owner, v)), 200, "")
		}
		expect(t, h.post("/v1/runs/"+key+"/effects", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"action_type":"task","target":"default","effect_id":"reply-to-customer-with-a-long-effect-id-0001","payload":{"msg":"hi"}}`, owner, v)), 201, "")
		h.env.Clock.Advance(11 * time.Minute)

		dir := chromium.ScreenshotDir(t)
		ctx, step := chromium.NewForms(t)
		backend := strings.ToLower(filepath.Base(t.Name()))
		read := tabReader{ctx, t, step}
		viewports := []struct {
			label string
			w, h  int64
		}{{"laptop", 1280, 800}, {"phone", 390, 844}}
		// fits photographs the page at both widths and, at each, checks that the
		// elements sel names are no wider than the page's main column.
		fits := func(name string, sels ...string) {
			t.Helper()
			for _, vp := range viewports {
				step("viewport", chromedp.Do(ctx, chromedp.EmulateViewport(vp.w, vp.h)))
				main, err := chromedp.Run(ctx, chromedp.Dimensions(chromedp.CSS("main")))
				step("measure main", err)
				for _, sel := range sels {
					box, err := chromedp.Run(ctx, chromedp.Dimensions(chromedp.CSS(sel)))
					step("measure "+sel, err)
					if box.Width > main.Width || main.Width > vp.w {
						t.Errorf("%s at %s width: %s is %dpx wide in a %dpx column (viewport %d): it scrolls sideways", name, vp.label, sel, box.Width, main.Width, vp.w)
					}
				}
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
		open := func(path string) {
			t.Helper()
			resp, err := chromedp.Run(ctx, chromedp.NavigateResponse(h.url+path))
			step("open "+path, err)
			status(resp, 200, "")
			chromium.NoScripts(ctx, t, path)
		}
		resp, err := chromedp.Run(ctx, chromedp.NavigateResponse(h.url+"/login"))
		step("sign-in page", err)
		status(resp, 200, "/login")
		step("sign in", chromedp.Do(ctx,
			chromedp.SendKeys(chromedp.CSS(`form[action="/login"] input[name="username"]`), "ops"),
			chromedp.SendKeys(chromedp.CSS(`form[action="/login"] input[name="password"]`), "correct horse battery"),
		))
		resp, err = chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(`form[action="/login"] button[type="submit"]`)))
		step("sign in", err)
		status(resp, 200, "/login")

		// This week: the stalled run and the waiting task, each a link.
		open("/console/week")
		// Stalled: the dead execution, and job-1 and task-1, whose workflows stopped
		// heartbeating while their tasks were open.
		if got := read.text("#outstanding-stalled"); got != "3 stalled runs" {
			t.Errorf("the stalled line reads %q", got)
		}
		if got := read.text("#outstanding-unsent"); !strings.HasPrefix(got, "2 approved but unsent for 10m") {
			t.Errorf("the unsent line reads %q", got)
		}
		if got := read.text("#duplicates"); !strings.Contains(got, "0 of 3 deliveries were duplicates") {
			t.Errorf("the duplicate tile reads %q", got)
		}
		fits("week", "#outstanding")
		resp, err = chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(`#outstanding-stalled`)))
		step("follow the stalled link", err)
		status(resp, 200, "/console/runs")
		if n := read.count(`#runs td b.stalled`); n != 3 || !strings.Contains(read.text("#runs"), key) {
			t.Fatalf("the stalled list marks %d runs:\n%s", n, read.text("#runs"))
		}
		fits("runs-stalled")

		// The run: its tables fit a phone; the re-drive form releases it.
		open("/console/runs?key=" + url.QueryEscape(key))
		if !strings.Contains(read.text("#stalled"), "Stalled.") {
			t.Fatalf("the run page does not say it is stalled")
		}
		fits("run-stalled", "#timeline", "#effects", "#stalled")
		step("fill the re-drive form", chromedp.Do(ctx,
			chromedp.SendKeys(chromedp.CSS(`#redrive input[name="reason"]`), "n8n was killed mid-execution"),
		))
		resp, err = chromedp.RunResponse(ctx, chromedp.Click(`//form[@id="redrive"]//button[normalize-space()="Release for redelivery"]`))
		step("release", err)
		status(resp, 200, "/console/runs")
		if got := read.text("p.notice"); !strings.Contains(got, "released") {
			t.Errorf("after the release the notice reads %q", got)
		}
		if n := read.count("#redrive"); n != 0 {
			t.Errorf("the released run still offers the re-drive")
		}
		if run := h.get("/v1/runs/" + url.PathEscape(key)); run.body["state"] != "failed_retryable" {
			t.Fatalf("after the release: %s", run.raw)
		}
		fits("run-released", "#timeline")

		// The unknown effect's card.
		open("/console/effects")
		card := read.text("#effect-" + eid)
		for _, want := range []string{"timeout · 1 attempt", "job-1/", "not shown (not in log_fields)", "In the worker's system"} {
			if !strings.Contains(card, want) {
				t.Errorf("the unknown effect's card lacks %q:\n%s", want, card)
			}
		}
		fits("effects", "#effect-"+eid, "#waiting-effects")
	})
}
