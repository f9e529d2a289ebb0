package httpapi_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/store/storetest"
)

// BenchmarkIdempotencyKeyCost measures what an Idempotency-Key adds to a claim over HTTP
// (sequential, one client): the in-flight record, and the claim, the answer and the
// commit in one transaction. Each iteration claims a new key without and then with an
// Idempotency-Key, so both see the same disk; it reports the mean of each and their
// ratio (key/nokey):
//
//	go test -run '^$' -bench IdempotencyKeyCost -benchtime 400x ./internal/httpapi/
func BenchmarkIdempotencyKeyCost(b *testing.B) {
	for _, backend := range storetest.Backends {
		b.Run(backend.Name, func(b *testing.B) {
			h := newHarness(b, backend)
			claim := func(i int, idem string) time.Duration {
				start := time.Now()
				r, err := h.send(h.url, "POST", "/v1/runs/claim", h.runsKey, idem, fmt.Sprintf(`{"key":"m-%s%d","payload":{"n":%d}}`, idem, i, i))
				if err != nil || r.status != 201 {
					b.Fatalf("%v %d %s", err, r.status, r.raw)
				}
				return time.Since(start)
			}
			var without, with time.Duration
			b.ResetTimer()
			for i := range b.N {
				without += claim(i, "")
				with += claim(i, fmt.Sprintf("idem-%d", i))
			}
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(float64(without.Microseconds())/float64(b.N), "nokey-µs/claim")
			b.ReportMetric(float64(with.Microseconds())/float64(b.N), "key-µs/claim")
			b.ReportMetric(float64(with)/float64(without), "key/nokey")
		})
	}
}
