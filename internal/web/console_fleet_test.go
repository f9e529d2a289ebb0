package web_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/store"
)

// TestConsoleShowsFleet: the kill switch page lists the registered instances with their
// version, level and dispatch, and flags one below the database's writer level.
func TestConsoleShowsFleet(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		for _, in := range []store.Instance{
			{ID: "web-1-aaaa", Hostname: "web-1", PID: 7, Version: "v9.9.9", Level: store.WriterLevel, Role: "serve", Dispatch: true},
			{ID: "old-2-bbbb", Hostname: "old-2", PID: 8, Version: "v0.0.1-old", Level: store.WriterLevel - 1, Role: "purge"},
		} {
			if _, err := h.env.Store.InstanceHeartbeat(context.Background(), in, nil); err != nil {
				t.Fatal(err)
			}
		}
		h.addUser("ops", "ops")
		ops := newBrowser(t)
		if code, _, _ := h.signIn(ops, "ops"); code != 200 {
			t.Fatalf("sign in: %d", code)
		}
		code, page, _ := ops.do("GET", h.url+"/console/kill-switch", nil, nil)
		if code != 200 {
			t.Fatalf("kill switch page: %d", code)
		}
		_, fleet, _ := strings.Cut(page, `<table id="fleet">`)
		for _, want := range []string{fmt.Sprintf("web-1-aaaa</td><td>serve</td><td>v9.9.9</td><td>%d</td><td>on</td>", store.WriterLevel), ">live<",
			fmt.Sprintf("old-2-bbbb</td><td>purge</td><td>v0.0.1-old</td><td>%d</td><td>off</td>", store.WriterLevel-1),
			fmt.Sprintf("below level %d: writes nothing", store.WriterLevel)} {
			if !strings.Contains(fleet, want) {
				t.Fatalf("the fleet table lacks %q:\n%s", want, fleet)
			}
		}
	})
}
