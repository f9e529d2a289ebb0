package httpapi_test

import (
	"strings"
	"testing"
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
		big := `"` + strings.Repeat("x", 300<<10) + `"`
		// Refused whole (this harness's body limit is small; airlock's own cap is 256 KiB).
		if r := h.post(base+"confirm", `{"lease_owner":"`+owner+`","receipt":"sha256:1","result":`+big+`}`); r.status < 400 {
			t.Fatalf("an oversized result: %d %s", r.status, r.raw[:100])
		}
		expect(t, h.post(base+"confirm", `{"lease_owner":"`+owner+`","receipt":"sha256:1","result":{"content":[{"type":"text","text":"wrote"}]}}`), 200, "")
		r := h.post(base+"plan", plan)
		expect(t, r, 200, "")
		if r.body["execute"] != false || r.body["receipt"] != "sha256:1" || !strings.Contains(r.raw, `"text":"wrote"`) {
			t.Fatalf("plan of a confirmed effect: %s", r.raw)
		}
	})
}
