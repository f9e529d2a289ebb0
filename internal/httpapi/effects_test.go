package httpapi_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

func TestEffectsFlow(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		owner, v := h.claim("order-7")
		lb := fmt.Sprintf(`"lease_owner":"%s","version":%d`, owner, v)
		q := h.post("/v1/runs/order-7/effects", `{`+lb+`,"action_type":"note","target":"default","payload":{"text":"Refund approved"}}`)
		expect(t, q, 201, "")
		eff := q.body["effect"].(map[string]any)
		if eff["state"] != "pending" || q.body["version"].(float64) != float64(v) || q.body["created"] != true {
			t.Fatalf("queue: %s", q.raw)
		}
		if strings.Contains(q.raw, "Refund approved") {
			t.Fatal("the payload is echoed back to every reader")
		}
		// The same request again: the stored effect, 200.
		again := h.post("/v1/runs/order-7/effects", `{`+lb+`,"action_type":"note","target":"default","payload":{"text":"Refund approved"}}`)
		expect(t, again, 200, "")
		if again.body["effect"].(map[string]any)["id"] != eff["id"] {
			t.Fatalf("requeue made a second effect: %s", again.raw)
		}
		// The run cannot complete while the effect is open.
		expect(t, h.post("/v1/runs/order-7/transition", `{`+lb+`,"to":"completed"}`), 409, "effects_open")
		if _, err := h.env.Dispatcher.Tick(context.Background()); err != nil {
			t.Fatal(err)
		}
		run := h.get("/v1/runs/order-7")
		effs := run.body["effects"].([]any)
		if len(effs) != 1 || effs[0].(map[string]any)["state"] != "completed" || effs[0].(map[string]any)["provider_id"] == "" {
			t.Fatalf("run effects: %s", run.raw)
		}
		expect(t, h.post("/v1/runs/order-7/transition", `{`+lb+`,"to":"completed"}`), 200, "")

		// Refusals, each with its code; none writes an effect.
		o2, v2 := h.claim("order-8")
		lb2 := fmt.Sprintf(`"lease_owner":"%s","version":%d`, o2, v2)
		h.post("/v1/runs/order-8/effects", `{`+lb2+`,"action_type":"note","target":"default","effect_id":"n1","payload":{"a":1}}`)
		for _, c := range []struct {
			body, code string
			status     int
		}{
			{`"action_type":"wire_money","target":"default","payload":{}`, "unknown_action_type", 422},
			{`"action_type":"note","target":"https://attacker.example/","payload":{}`, "invalid_target", 422},
			{`"action_type":"note","target":"default","effect_id":"n1","payload":{"a":2}`, "effect_mismatch", 409},
			{`"action_type":"note","target":"default","effect_id":"a/b","payload":{}`, "invalid_field", 400},
			{`"action_type":"note","target":"default"`, "missing_field", 400},
			{`"action_type":"note","target":"default","payload":{},"url":"http://x"`, "unknown_field", 400},
		} {
			expect(t, h.post("/v1/runs/order-8/effects", `{`+lb2+`,`+c.body+`}`), c.status, c.code)
		}
		expect(t, h.post("/v1/runs/order-8/effects", `{"lease_owner":"x","version":1,"action_type":"note","target":"default","payload":{}}`), 409, "lease_lost")
		if n := len(h.get("/v1/runs/order-8").body["effects"].([]any)); n != 1 {
			t.Fatalf("refused requests stored effects: %d", n)
		}
	})
}

func TestWorkerAndOperatorRoutes(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		owner, v := h.claim("job-1")
		lb := fmt.Sprintf(`"lease_owner":"%s","version":%d`, owner, v)
		expect(t, h.post("/v1/runs/job-1/effects", `{`+lb+`,"action_type":"task","target":"slack","payload":{"msg":"hi"}}`), 201, "")

		expect(t, h.do("POST", "/v1/effects/claim", h.runsKey, "application/json", `{"types":["task"]}`), 403, "forbidden")
		c := h.do("POST", "/v1/effects/claim", h.workerKey, "application/json", `{"types":["task"],"lease_seconds":60}`)
		expect(t, c, 200, "")
		id, lo := c.body["id"].(string), c.body["lease_owner"].(string)
		if c.body["payload"].(map[string]any)["msg"] != "hi" || c.body["idempotency_key"] == "" {
			t.Fatalf("claim: %s", c.raw)
		}
		if r := h.do("POST", "/v1/effects/claim", h.workerKey, "application/json", `{"types":["task"]}`); r.status != 204 {
			t.Fatalf("nothing to claim: %d %s", r.status, r.raw)
		}
		expect(t, h.do("POST", "/v1/effects/claim", h.workerKey, "application/json", `{"types":["note"]}`), 422, "unknown_action_type")
		expect(t, h.do("POST", "/v1/effects/"+id+"/complete", h.workerKey, "application/json", `{"lease_owner":"nope"}`), 409, "lease_lost")
		unknown := h.do("POST", "/v1/effects/"+id+"/unknown", h.workerKey, "application/json", `{"lease_owner":"`+lo+`","class":"timeout"}`)
		expect(t, unknown, 200, "")

		// An operator resolves the unknown effect.
		expect(t, h.do("POST", "/v1/effects/"+id+"/resolve", h.workerKey, "application/json", `{"outcome":"sent","provider_id":"p-1","note":"x"}`), 403, "forbidden")
		expect(t, h.do("POST", "/v1/effects/"+id+"/resolve", h.operatorKey, "application/json", `{"outcome":"maybe","note":"x"}`), 400, "invalid_field")
		// A decision names the version it was taken on: one the effect has left is refused.
		expect(t, h.do("POST", "/v1/effects/"+id+"/resolve", h.operatorKey, "application/json", `{"outcome":"not_sent","note":"x","version":1}`), 409, "effect_changed")
		expect(t, h.do("POST", "/v1/effects/"+id+"/resolve", h.operatorKey, "application/json", `{"outcome":"not_sent","note":"x","version":"2"}`), 400, "wrong_type")
		seen := unknown.body["version"].(float64)
		r := h.do("POST", "/v1/effects/"+id+"/resolve", h.operatorKey, "application/json",
			fmt.Sprintf(`{"outcome":"sent","provider_id":"ts-1","note":"seen in the channel","version":%d}`, int(seen)))
		expect(t, r, 200, "")
		if r.body["state"] != "completed" || r.body["provider_id"] != "ts-1" {
			t.Fatalf("resolve: %s", r.raw)
		}
		expect(t, h.do("POST", "/v1/effects/"+id+"/resolve", h.operatorKey, "application/json", `{"outcome":"sent","provider_id":"p-1","note":"again"}`), 409, "not_resolvable")
		expect(t, h.do("POST", "/v1/effects/nope/resolve", h.operatorKey, "application/json", `{"outcome":"sent","provider_id":"p-1","note":"x"}`), 404, "effect_not_found")
	})
}

func TestKillSwitchRoutes(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		// Every key may read the kill switch, a runs key too (as the README says); only
		// admin keys change it.
		for _, k := range []string{h.runsKey, h.readKey, h.workerKey, h.operatorKey} {
			r := h.do("GET", "/v1/admin/kill-switch", k, "", "")
			if expect(t, r, 200, ""); r.body["enabled"] != true {
				t.Fatalf("read with a non-admin key: %s", r.raw)
			}
			expect(t, h.do("PUT", "/v1/admin/kill-switch", k, "application/json", `{"enabled":false,"reason":"x"}`), 403, "forbidden")
		}
		g := h.do("GET", "/v1/admin/kill-switch", h.adminKy, "", "")
		expect(t, g, 200, "")
		if g.body["enabled"] != true {
			t.Fatalf("fresh install: %s", g.raw)
		}
		expect(t, h.do("PUT", "/v1/admin/kill-switch", h.adminKy, "application/json", `{"enabled":false}`), 400, "invalid_field")
		p := h.do("PUT", "/v1/admin/kill-switch", h.adminKy, "application/json", `{"enabled":false,"reason":"bad model release"}`)
		expect(t, p, 200, "")
		if p.body["enabled"] != false || !strings.Contains(p.raw, `"actor":"apikey:ops"`) {
			t.Fatalf("disable: %s", p.raw)
		}
		owner, v := h.claim("job-2")
		lb := fmt.Sprintf(`"lease_owner":"%s","version":%d`, owner, v)
		expect(t, h.post("/v1/runs/job-2/effects", `{`+lb+`,"action_type":"task","target":"t","payload":{}}`), 201, "")
		expect(t, h.do("POST", "/v1/effects/claim", h.workerKey, "application/json", `{"types":["task"]}`), 423, "actions_disabled")
		expect(t, h.do("PUT", "/v1/admin/kill-switch", h.adminKy, "application/json", `{"scope":"action:nope","enabled":false,"reason":"x"}`), 422, "unknown_action_type")
	})
}

// Derived effect ids repeat across runs: a worker must get the provider key
// (<run key>/<effect id>), or a provider that dedupes on it drops the second run's write.
func TestWorkerIdempotencyKeyNamesTheRun(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		seen := map[string]string{}
		for _, key := range []string{"cust-a", "cust-b"} {
			owner, v := h.claim(key)
			lb := fmt.Sprintf(`"lease_owner":"%s","version":%d`, owner, v)
			q := h.post("/v1/runs/"+key+"/effects", `{`+lb+`,"action_type":"task","target":"slack","payload":{"msg":"hi"}}`)
			expect(t, q, 201, "")
			c := h.do("POST", "/v1/effects/claim", h.workerKey, "application/json", `{"types":["task"],"lease_seconds":60}`)
			expect(t, c, 200, "")
			ik, _ := c.body["idempotency_key"].(string)
			if want := key + "/" + c.body["effect_id"].(string); ik != want {
				t.Fatalf("idempotency_key %q, want %q", ik, want)
			}
			seen[ik] = key
		}
		if len(seen) != 2 {
			t.Fatalf("two runs' effects share an idempotency key: %v", seen)
		}
	})
}
