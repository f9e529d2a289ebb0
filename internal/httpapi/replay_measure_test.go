package httpapi_test

import (
	"fmt"
	"os"
	"testing"
	"time"
)

// TestMeasureIdempotencyKeyCost prints what an Idempotency-Key adds to a claim over HTTP
// (sequential, one client): the in-flight record, and the claim, the answer and the
// commit in one transaction. Run with AIRLOCK_MEASURE=1.
func TestMeasureIdempotencyKeyCost(t *testing.T) {
	if os.Getenv("AIRLOCK_MEASURE") == "" {
		t.Skip("set AIRLOCK_MEASURE=1 to measure")
	}
	forEachBackend(t, func(t *testing.T, h *harness) {
		const n = 400
		run := func(label string, withKey bool) {
			start := time.Now()
			for i := range n {
				idem := ""
				if withKey {
					idem = fmt.Sprintf("idem-%s-%d", label, i)
				}
				r, err := h.send(h.url, "POST", "/v1/runs/claim", h.runsKey, idem, fmt.Sprintf(`{"key":"m-%s-%d","payload":{"n":%d}}`, label, i, i))
				if err != nil || r.status != 201 {
					t.Fatalf("%v %d %s", err, r.status, r.raw)
				}
			}
			t.Logf("%s %s: %d claims, %.0f µs each", t.Name(), label, n, float64(time.Since(start).Microseconds())/n)
		}
		for round := range 4 {
			run(fmt.Sprintf("nokey%d", round), false)
			run(fmt.Sprintf("key%d", round), true)
		}
	})
}
