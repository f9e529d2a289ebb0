package httpapi_test

import (
	"fmt"
	"strings"
	"testing"
)

func TestFailureRoutes(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		// Input checked by trigger source at claim: nothing stored when it fails.
		bad := h.post("/v1/runs/claim", `{"key":"z-1","trigger_source":"zendesk","payload":{"ticket":"forty-two"}}`)
		expect(t, bad, 422, "invalid_input")
		if !strings.Contains(bad.raw, `"pointer":"/ticket"`) {
			t.Fatalf("invalid_input lists no pointer: %s", bad.raw)
		}
		expect(t, h.get("/v1/runs/z-1"), 404, "run_not_found")
		expect(t, h.post("/v1/runs/claim", `{"key":"z-1","trigger_source":"zendesk","payload_hash":"abc"}`), 400, "invalid_field")
		expect(t, h.post("/v1/runs/claim", `{"key":"z-1","trigger_source":"zendesk","payload":{"ticket":42}}`), 201, "")

		owner, v := h.claim("r-1")
		lb := fmt.Sprintf(`"lease_owner":"%s","version":%d`, owner, v)
		val := h.post("/v1/runs/r-1/validate", `{`+lb+`,"action_type":"reply","output":"Here:\n`+"```json"+`\n{\"label\":\"refund\",\"text\":\"ok\"}\n`+"```"+`"}`)
		expect(t, val, 200, "")
		if val.body["valid"] != true || val.body["repaired"] != true || val.body["value"].(map[string]any)["label"] != "refund" {
			t.Fatalf("validate: %s", val.raw)
		}
		expect(t, h.post("/v1/runs/r-1/validate", `{`+lb+`,"action_type":"note","output":{}}`), 422, "no_schema")
		expect(t, h.post("/v1/runs/r-1/validate", `{`+lb+`,"action_type":"nope","output":{}}`), 422, "unknown_action_type")
		expect(t, h.post("/v1/runs/r-1/validate", `{`+lb+`,"action_type":"reply"}`), 400, "missing_field")
		q := h.post("/v1/runs/r-1/effects", `{`+lb+`,"action_type":"reply","target":"default"}`)
		expect(t, q, 201, "")
		expect(t, h.post("/v1/runs/r-1/effects", `{`+lb+`,"action_type":"reply","target":"default","effect_id":"r2","payload":{"label":"other","text":"x"}}`), 422, "not_validated")

		f := h.post("/v1/runs/r-1/failures", `{`+lb+`,"class":"rate_limited","retry_after_ms":30000,"detail":"429 from the model"}`)
		expect(t, f, 200, "")
		if f.body["decision"] != "retry" || f.body["level"] != "transport" || f.body["retry_after_ms"].(float64) < 30000 || f.body["attempts"].(float64) != 1 {
			t.Fatalf("failure: %s", f.raw)
		}
		expect(t, h.post("/v1/runs/r-1/failures", `{`+lb+`,"class":"gremlins"}`), 400, "invalid_field")
		expect(t, h.post("/v1/runs/r-1/failures", `{`+lb+`,"class":"rate_limited","retry_after_ms":-1}`), 400, "invalid_field")

		u := h.post("/v1/runs/r-1/usage", `{`+lb+`,"model_calls":2,"tokens":500}`)
		expect(t, u, 200, "")
		if u.body["model_calls"].(float64) != 2 || u.body["budget"].(map[string]any)["max_model_calls"].(float64) != 4 {
			t.Fatalf("usage: %s", u.raw)
		}
		expect(t, h.post("/v1/runs/r-1/usage", `{`+lb+`,"model_calls":3}`), 429, "budget_exhausted")
		run := h.get("/v1/runs/r-1")
		if run.body["state"] != "failed_terminal" || run.body["model_calls"].(float64) != 5 || run.body["action_type"] != "reply" {
			t.Fatalf("run after the budget: %s", run.raw)
		}

		// Replacement: operator scope, rules, links.
		expect(t, h.post("/v1/runs/r-1/replace", `{"new_key":"r-2","reason":"x"}`), 403, "forbidden")
		op := func(path, body string) response { return h.do("POST", path, h.operatorKey, "application/json", body) }
		expect(t, op("/v1/runs/r-1/replace", `{"new_key":"r-1-fix","reason":"typo"}`), 422, "invalid_replacement")
		expect(t, op("/v1/runs/z-1/replace", `{"new_key":"z-2","reason":"typo"}`), 409, "not_finished")
		// r-1 ended failed_terminal: its pending reply was cancelled with it, so nothing of
		// it leaves, and a replacement is the way to send it after all.
		effs := h.get("/v1/runs/r-1").body["effects"].([]any)
		if len(effs) != 1 || effs[0].(map[string]any)["state"] != "cancelled" {
			t.Fatalf("effects of the failed run: %v", effs)
		}
		rep := op("/v1/runs/r-1/replace", `{"new_key":"r-2","reason":"the customer wrote again"}`)
		expect(t, rep, 200, "")
		o3, v3 := h.claim("r-3")
		expect(t, h.post("/v1/runs/r-3/transition", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"to":"completed"}`, o3, v3)), 200, "")
		rep = op("/v1/runs/r-3/replace", `{"new_key":"r-4","reason":"the customer wrote again"}`)
		expect(t, rep, 200, "")
		if !strings.Contains(rep.raw, "Rerun protocol") {
			t.Fatalf("replace: %s", rep.raw)
		}
		expect(t, op("/v1/runs/r-3/replace", `{"new_key":"r-5","reason":"again"}`), 409, "already_replaced")
		expect(t, op("/v1/runs/z-1/replace", `{"new_key":"r-4","reason":"x"}`), 409, "not_finished")
		if got := h.get("/v1/runs/r-3"); got.body["replaced_by"].(map[string]any)["key"] != "r-4" {
			t.Fatalf("old run: %s", got.raw)
		}
	})
}
