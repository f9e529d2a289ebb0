package httpapi_test

import (
	"runtime"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/httpapi"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// The strict decoder used to recurse without a depth limit and build a path
// string per level, so memory grew with the square of the nesting: 60,000 "[" sent to
// POST /v1/effects/{id}/cancel (any key) ended the process out of memory; 30 KB took
// ~2 GB. Nesting past 64 levels is now refused with 400 nesting_too_deep, naming where,
// and the request allocates a bounded amount however deep the body goes.
func TestDeepNestingRefusedInBoundedMemory(t *testing.T) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) { // not parallel: the test measures allocation
			h := newHarness(t, b)
			base := h.another(func(d *httpapi.Deps) { d.MaxBodyBytes = 1 << 20 })
			owner, _ := h.claim("deep-1")
			before := storetest.DumpAll(t, h.env.Store)
			// 10,000 levels: enough to show the square (hundreds of MB before), small enough
			// not to take the test machine down when it fails.
			deep := strings.Repeat("[", 10_000) + strings.Repeat("]", 10_000)
			for _, c := range []struct{ name, method, path, key, body, where string }{
				{"cancel, unclosed", "POST", "/v1/effects/x/cancel", h.readKey, strings.Repeat("[", 10_000), `"[0]`},
				{"cancel, closed", "POST", "/v1/effects/x/cancel", h.readKey, deep, `"[0]`},
				{"claim payload", "POST", "/v1/runs/claim", h.runsKey, `{"key":"deep-2","payload":` + deep + `}`, `"payload[0]`},
				{"ledger", "PUT", "/v1/runs/deep-1/ledger", h.runsKey, `{"lease_owner":"` + owner + `","ledger":{"a":` + strings.Repeat(`{"a":`, 10_000) + `1` + strings.Repeat("}", 10_001) + `}`, `"ledger.a.a.a`},
			} {
				var m0, m1 runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&m0)
				r := h.doAt(base, c.method, c.path, c.key, "application/json", c.body)
				runtime.ReadMemStats(&m1)
				msg, _ := r.body["message"].(string)
				if r.status != 400 || r.body["error"] != "nesting_too_deep" || !strings.Contains(msg, c.where) || !strings.Contains(msg, "64") {
					t.Errorf("%s: %d %.300s; want 400 nesting_too_deep naming %s", c.name, r.status, r.raw, c.where)
				}
				// The client and server share this process: both are counted. The body is
				// 10–60 KB; a few MB is the bound, against hundreds before.
				if alloc := m1.TotalAlloc - m0.TotalAlloc; alloc > 16<<20 {
					t.Errorf("%s: the request allocated %d MB", c.name, alloc>>20)
				}
			}
			if after := storetest.DumpAll(t, h.env.Store); after != before {
				t.Fatal("a refused body wrote to the database")
			}
			// 64 levels in all (the body's object is the first) are still accepted.
			ok := `{"key":"deep-3","payload":` + strings.Repeat("[", 63) + strings.Repeat("]", 63) + `}`
			expect(t, h.doAt(base, "POST", "/v1/runs/claim", h.runsKey, "application/json", ok), 201, "")
			tooDeep := `{"key":"deep-4","payload":` + strings.Repeat("[", 64) + strings.Repeat("]", 64) + `}`
			expect(t, h.doAt(base, "POST", "/v1/runs/claim", h.runsKey, "application/json", tooDeep), 400, "nesting_too_deep")
		})
	}
}
