package web

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/approvals"
	"github.com/airlockhq/airlock/internal/store/sqlite"
)

// TestSessionOnTheDatabaseClock: sessions are compared with the database's clock, so they
// are stamped with it too. Here the database's clock runs an hour ahead of this
// instance's (as another host's may): a session just started must be live.
func TestSessionOnTheDatabaseClock(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "airlock.db"), sqlite.Options{Now: func() time.Time { return time.Now().Add(time.Hour) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	w := New(st, nil, slog.New(slog.DiscardHandler), "http://127.0.0.1:8080", nil)
	rec := httptest.NewRecorder()
	if err := w.startSession(rec, httptest.NewRequest("POST", "/login", nil), approvals.Person{Subject: "ana", Roles: []string{"support-lead"}}, ""); err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("GET", "/login", nil)
	for _, c := range rec.Result().Cookies() {
		r.AddCookie(c)
	}
	if p, _ := w.person(r); p == nil {
		t.Fatal("a session started a moment ago is already over by the database's clock")
	}

	// The approval intent is sealed and opened on the same clock.
	sealed, err := w.sealIntent(ctx, "token-hash")
	if err != nil {
		t.Fatal(err)
	}
	r = httptest.NewRequest("POST", "/login", nil)
	r.AddCookie(&http.Cookie{Name: intentCookie, Value: sealed})
	if th, ok := w.openIntent(r); !ok || th != "token-hash" {
		t.Fatalf("intent = %q, %v", th, ok)
	}
}
