package httpapi_test

import (
	"fmt"
	"testing"
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
