package httpapi_test

import (
	"fmt"
	"testing"
)

// A client checks its key without touching a run: n8n's credential test fails on any
// status but 2xx, and every other route a runs key may call answers 404 for a key that
// never ran.
func TestWhoami(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		for _, c := range []struct{ key, name, scopes string }{
			{h.runsKey, "n8n", "[runs]"}, {h.readKey, "dashboard", "[read]"}, {h.workerKey, "worker", "[worker]"},
		} {
			r := h.do("GET", "/v1/whoami", c.key, "", "")
			expect(t, r, 200, "")
			if r.body["name"] != c.name || fmt.Sprint(r.body["scopes"]) != c.scopes {
				t.Fatalf("whoami = %s; want %s %s", r.raw, c.name, c.scopes)
			}
			if _, ok := r.body["id"]; ok {
				t.Fatalf("whoami shows the key's id: %s", r.raw)
			}
		}
		expect(t, h.do("GET", "/v1/whoami", "", "", ""), 401, "unauthenticated")
		expect(t, h.do("GET", "/v1/whoami", h.revokedKey, "", ""), 401, "unauthenticated")
		expect(t, h.do("GET", "/v1/whoami", "not-a-key", "", ""), 401, "unauthenticated")
		expect(t, h.do("POST", "/v1/whoami", h.runsKey, "application/json", "{}"), 405, "method_not_allowed")
	})
}
