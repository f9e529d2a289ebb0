package httpapi_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/app"
	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// TestUsageBounds: usage figures past what one report can carry are refused with a
// field error, never a 500 and never a total that overflows past the budget.
func TestUsageBounds(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		owner, v := h.claim("u-1")
		lb := fmt.Sprintf(`"lease_owner":"%s","version":%d`, owner, v)
		for _, body := range []string{
			`"model_calls":2147483648`,
			`"model_calls":1000001`,
			`"tokens":9223372036854775807`,
			`"tokens":1000000000001`,
		} {
			expect(t, h.post("/v1/runs/u-1/usage", `{`+lb+`,`+body+`}`), 400, "invalid_field")
		}
		expect(t, h.post("/v1/runs/u-1/usage", `{`+lb+`,"model_calls":1,"tokens":1000000000000}`), 200, "")
	})
}

// TestDurationBounds: every duration the API takes is bounded before it becomes a
// time.Duration: 18446744075 seconds used to wrap to a one-second lease, and a worker
// lease of 1e9 seconds ran to 2058.
func TestDurationBounds(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		for _, secs := range []string{"18446744075", "9223372037", "3601", "1000000000"} {
			expect(t, h.post("/v1/runs/claim", `{"key":"d-1","payload":{"n":1},"lease_seconds":`+secs+`}`), 400, "invalid_field")
		}
		owner, v := h.claim("d-1")
		lb := fmt.Sprintf(`"lease_owner":"%s","version":%d`, owner, v)
		expect(t, h.post("/v1/runs/d-1/heartbeat", `{`+lb+`,"lease_seconds":18446744075}`), 400, "invalid_field")
		expect(t, h.post("/v1/runs/d-1/effects", `{`+lb+`,"action_type":"task","target":"slack","payload":{"msg":"hi"}}`), 201, "")
		for _, secs := range []string{"1000000000", "18446744075", "3601"} {
			expect(t, h.do("POST", "/v1/effects/claim", h.workerKey, "application/json", `{"types":["task"],"lease_seconds":`+secs+`}`), 400, "invalid_field")
		}
		c := h.do("POST", "/v1/effects/claim", h.workerKey, "application/json", `{"types":["task"],"lease_seconds":3600}`)
		expect(t, c, 200, "")
		id, lo := c.body["id"].(string), c.body["lease_owner"].(string)
		for _, ms := range []string{"-1", "9223372036854775807", "3600001"} {
			expect(t, h.do("POST", "/v1/effects/"+id+"/fail", h.workerKey, "application/json",
				`{"lease_owner":"`+lo+`","retryable":true,"retry_after_ms":`+ms+`}`), 400, "invalid_field")
		}
		expect(t, h.do("POST", "/v1/effects/"+id+"/fail", h.workerKey, "application/json",
			`{"lease_owner":"`+lo+`","retryable":true,"retry_after_ms":3600000}`), 200, "")
	})
}

// TestWorkerClaimDefaultLeaseIsCapped: a worker claim without lease_seconds got 5 minutes
// even where AIRLOCK_LEASE_MAX is lower; the default is capped by it.
func TestWorkerClaimDefaultLeaseIsCapped(t *testing.T) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			h := newHarnessWith(t, b, func(_ *apptest.EffectsEnv, o *app.Options) {
				o.Runs.DefaultLease, o.Runs.MaxLease = 30*time.Second, time.Minute
			})
			owner, v := h.claim("w-1")
			expect(t, h.post("/v1/runs/w-1/effects", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"action_type":"task","target":"slack","payload":{"msg":"hi"}}`, owner, v)), 201, "")
			c := h.do("POST", "/v1/effects/claim", h.workerKey, "application/json", `{"types":["task"]}`)
			expect(t, c, 200, "")
			until, err := time.Parse(time.RFC3339Nano, c.body["lease_expires_at"].(string))
			if err != nil {
				t.Fatal(err)
			}
			if got := until.Sub(h.env.Clock.Now()); got != time.Minute {
				t.Errorf("a worker claim without lease_seconds got a lease of %v; AIRLOCK_LEASE_MAX is 1m", got)
			}
		})
	}
}
