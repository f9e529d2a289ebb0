// Package chromium drives a headless Chromium (Debian's chromium package) for the tests
// of airlock's pages: in internal/web, and in internal/httpapi where an integration's
// flow ends on a page. Without the browser a test is skipped, except under CI=true,
// where it fails.
package chromium

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"

	"github.com/airlockhq/airlock/internal/apptest"
)

// Path is the browser the test drives (Debian's `apt-get install chromium`).
const Path = "/usr/bin/chromium"

// browserBudget bounds one whole browser session: start, every page, shutdown.
const browserBudget = 60 * time.Second

// Require skips the test without a browser, except under CI, where it must run.
func Require(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(Path); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is missing: under CI the browser tests must run (apt-get install -y chromium)", Path)
		}
		t.Skipf("%s is missing; apt-get install -y chromium to run the browser tests", Path)
	}
}

// NewForms is New with JavaScript off (the pages are server-rendered
// forms: everything a person does there must work without scripts) and a step function
// that ends the test at the first step that failed, naming it.
func NewForms(t *testing.T) (context.Context, func(name string, err error)) {
	t.Helper()
	ctx := New(t)
	step := func(name string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	_, err := chromedp.Call(ctx, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: true})
	step("disable JavaScript", err)
	return ctx, step
}

// New starts a headless Chromium with a fresh profile and returns the context of
// one tab. Everything it does shares one deadline; the browser is stopped (and waited
// for) before the test's temporary directories are removed.
func New(t *testing.T) context.Context {
	t.Helper()
	profile := t.TempDir() // registered first, so removed after the browser has exited
	output := &apptest.SyncBuffer{}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(Path),
		chromedp.Headless,
		chromedp.NoSandbox, // root in containers and CI
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(profile),
		chromedp.CombinedOutput(output),
	)
	ctx, cancelTimeout := context.WithTimeout(context.Background(), browserBudget)
	ctx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	ctx, cancelTab := chromedp.NewContext(ctx)
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc() // also waits for the browser process to exit
		cancelTimeout()
		if t.Failed() {
			t.Logf("chromium output:\n%s", output.String())
		}
	})
	// Start the browser and open the tab now, on the tab's own context: the first run
	// binds the tab's lifetime to the context it gets.
	started := time.Now()
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v\n%s", err, output.String())
	}
	t.Logf("chromium started in %v", time.Since(started).Round(time.Millisecond))
	return ctx
}

// NoScripts fails unless the current page has no <script> element.
func NoScripts(ctx context.Context, t *testing.T, page string) {
	t.Helper()
	nodes, err := chromedp.Run(ctx, chromedp.Nodes(chromedp.CSSAll("script"), chromedp.AtLeast(0)))
	if err != nil {
		t.Fatalf("%s: look for scripts: %v", page, err)
	}
	if len(nodes) != 0 {
		t.Fatalf("%s has %d <script> elements; the pages must work without JavaScript", page, len(nodes))
	}
}

// ScreenshotDir keeps the console's screenshots: AIRLOCK_SCREENSHOTS names a directory
// to look at them afterwards; otherwise a temporary one.
func ScreenshotDir(t *testing.T) string {
	if d := os.Getenv("AIRLOCK_SCREENSHOTS"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	return t.TempDir()
}
