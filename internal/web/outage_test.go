package web_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/app"
	"github.com/airlockhq/airlock/internal/metrics"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/storetest"
	"github.com/airlockhq/airlock/internal/web"
)

// sessionsDown is a store whose sessions cannot be read: every page that asks who is
// signed in meets the outage.
type sessionsDown struct{ store.Store }

func (sessionsDown) SessionTouch(context.Context, string, time.Duration, *time.Time) (store.Session, error) {
	return store.Session{}, store.Unavailable(errors.New("dial tcp 127.0.0.1:5432: connect: connection refused"))
}

// Pages answer an outage with 503 and a page that says to try again (with Retry-After),
// not a 500, and do not take a signed-in person for signed out (a redirect to sign in).
func TestPagesSayTryAgainDuringAnOutage(t *testing.T) {
	h := newHarness(t, storetest.Backends[0])
	// A second instance over the same database, whose store (the API's and the pages')
	// cannot read sessions.
	d := h.deps
	d.Store, d.Metrics = sessionsDown{d.Store}, metrics.New()
	pages := web.New(d.Store, d.Approvals, slog.New(slog.NewJSONHandler(h.logs, nil)), h.url, h.env.Clock.Now)
	srv := httptest.NewServer(app.Mount(d, pages))
	t.Cleanup(srv.Close)
	base := srv.URL
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, path := range []string{"/console", "/console/effects", "/login", "/approve/some-token", "/approve/continue"} {
		req, _ := http.NewRequest("GET", base+path, nil)
		req.AddCookie(&http.Cookie{Name: "airlock_session", Value: "a-session"})
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), "Try again") ||
			strings.Contains(string(body), "127.0.0.1") {
			t.Errorf("GET %s during an outage: %d Retry-After=%q\n%s", path, resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
	}
	// Without a session nothing is asked: the sign-in page shows.
	resp, err := http.Get(base + "/login")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET /login without a session: %d", resp.StatusCode)
	}
}
