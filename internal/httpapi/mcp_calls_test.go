package httpapi_test

import (
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/httpapi"
)

// The MCP gateway's two additions to the ledger API: a confirmation may carry the
// result (bounded), and a tool call is recorded as an event without a lease.
func TestLedgerToolCallsAndConfirmedResult(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		expect(t, h.post("/v1/runs/nobody/ledger/calls", `{"tool":"read_file","class":"read","decision":"passed"}`), 404, "run_not_found")
		owner, _ := h.claim("agent-1")
		expect(t, h.post("/v1/runs/agent-1/ledger/calls", `{"tool":"read_file","class":"maybe","decision":"passed"}`), 400, "invalid_field")
		expect(t, h.post("/v1/runs/agent-1/ledger/calls", `{"tool":"read_file","class":"read"}`), 400, "missing_field")
		expect(t, h.post("/v1/runs/agent-1/ledger/calls", `{"tool":"read_file","class":"read","decision":"passed","arguments":{"x":1}}`), 400, "")
		expect(t, h.post("/v1/runs/agent-1/ledger/calls", `{"tool":"write_file","class":"effect","decision":"executed","effect_id":"mcp.write_file.1","input_hash":"h1"}`), 201, "")
		evs := h.get("/v1/runs/agent-1/events")
		if !strings.Contains(evs.raw, `"tool_call"`) || !strings.Contains(evs.raw, `"decision":"executed"`) {
			t.Fatalf("no tool_call event: %s", evs.raw)
		}

		base := "/v1/runs/agent-1/ledger/effects/mcp.write_file.1/"
		plan := `{"lease_owner":"` + owner + `","action":"create_internal_draft","target":"internal-docs","input_hash":"h1"}`
		expect(t, h.post(base+"plan", plan), 200, "")
		// The result cap is 256 KiB of JSON, under a body limit of 1 MiB (the server's
		// default; this harness's own is 4 KiB, which would answer first): one byte over
		// is refused by the cap, naming the field, and confirms nothing.
		roomy := h.another(func(d *httpapi.Deps) { d.MaxBodyBytes = 1 << 20 })
		result := func(n int) string { return `"` + strings.Repeat("x", n-2) + `"` } // n bytes of JSON
		confirm := func(receipt, result string) response {
			return h.doAt(roomy, "POST", base+"confirm", h.runsKey, "application/json",
				`{"lease_owner":"`+owner+`","receipt":"`+receipt+`","result":`+result+`}`)
		}
		r := confirm("sha256:1", result(256<<10+1))
		expect(t, r, 400, "invalid_field")
		if msg, _ := r.body["message"].(string); !strings.HasPrefix(msg, "result: at most 262144 bytes") {
			t.Fatalf("an oversized result: %s", r.raw)
		}
		expect(t, h.post(base+"confirm", `{"lease_owner":"`+owner+`","receipt":"sha256:1","result":{"content":[{"type":"text","text":"wrote"}]}}`), 200, "")
		r = h.post(base+"plan", plan)
		expect(t, r, 200, "")
		if r.body["execute"] != false || r.body["receipt"] != "sha256:1" || !strings.Contains(r.raw, `"text":"wrote"`) {
			t.Fatalf("plan of a confirmed effect: %s", r.raw)
		}
		// A result of exactly 256 KiB is kept.
		base = "/v1/runs/agent-1/ledger/effects/mcp.write_file.2/"
		expect(t, h.post(base+"plan", strings.Replace(plan, "h1", "h2", 1)), 200, "")
		expect(t, confirm("sha256:2", result(256<<10)), 200, "")
	})
}
