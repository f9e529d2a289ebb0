package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apikeys"
	"github.com/airlockhq/airlock/internal/approvals"
)

func TestExplainRoute(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		// A run delivered twice, drafted by a named model, with an ungated note and an
		// email a person approved, both sent.
		r := h.post("/v1/runs/claim", `{"key":"t-1","payload":{"ticket":1},"trigger_source":"helpdesk","meta":{"workflow_version":"wf-7@v3"}}`)
		expect(t, r, 201, "")
		lb := fmt.Sprintf(`"lease_owner":"%s","version":1`, r.body["lease_owner"])
		expect(t, h.post("/v1/runs/claim", `{"key":"t-1","payload":{"ticket":1}}`), 200, "")
		model := `"meta":{"model":{"provider":"local","name":"qwen2.5","revision":"q4"},"provider_category":"local"}`
		expect(t, h.post("/v1/runs/t-1/validate", `{`+lb+`,"action_type":"reply","output":{"label":"nope","text":"x"},`+model+`}`), 200, "")
		expect(t, h.post("/v1/runs/t-1/validate", `{`+lb+`,"action_type":"reply","output":{"label":"refund","text":"ok"},`+model+`}`), 200, "")
		expect(t, h.post("/v1/runs/t-1/effects", `{`+lb+`,"action_type":"note","target":"default","payload":{"note":"refund"}}`), 201, "")
		gated := h.post("/v1/runs/t-1/effects", `{`+lb+`,"action_type":"email","target":"default","payload":{"to":"ana@example.com","text":"refund"},"meta":{"requested_by":"ana"}}`)
		expect(t, gated, 202, "")
		h.env.Clock.Advance(3 * time.Minute)
		token := gated.body["approve_url"].(string)[strings.LastIndex(gated.body["approve_url"].(string), "/")+1:]
		if _, err := h.env.Approvals.Decide(context.Background(), approvals.HashToken(token), approvals.Approve, "", approvals.Person{Subject: "lead", Roles: []string{"support-lead"}}); err != nil {
			t.Fatal(err)
		}
		if _, err := h.env.Dispatcher.Tick(context.Background()); err != nil {
			t.Fatal(err)
		}

		x := h.do("GET", "/v1/runs/t-1/explain", h.readKey, "", "")
		expect(t, x, 200, "")
		p, s, a, m := x.body["processed"].(map[string]any), x.body["sent"].(map[string]any), x.body["approved"].(map[string]any), x.body["model"].(map[string]any)
		if p["claimed_by"] != "apikey:n8n" || p["state"] != "completed" || p["duplicates"].(float64) != 1 || !strings.HasPrefix(p["answer"].(string), "yes: claimed by apikey:n8n") {
			t.Fatalf("processed: %v", p)
		}
		if s["answer"] != "yes: 2 of 2 effects sent" || len(s["effects"].([]any)) != 2 {
			t.Fatalf("sent: %v", s)
		}
		for _, e := range s["effects"].([]any) {
			e := e.(map[string]any)
			if e["sent"] != true || e["provider_id"] == "" || e["sent_at"] == nil {
				t.Fatalf("effect: %v", e)
			}
		}
		ap := a["approvals"].([]any)[0].(map[string]any)
		if ap["approver"] != "lead" || ap["status"] != "approved" || ap["wait_seconds"].(float64) != 180 || ap["requested_by"] != "ana" {
			t.Fatalf("approval: %v", ap)
		}
		if !strings.HasPrefix(m["answer"].(string), "local/qwen2.5 (revision q4); workflow wf-7@v3; 2 validations: 1 valid, 1 invalid") {
			t.Fatalf("model: %v", m)
		}
		var kinds []string
		for _, st := range x.body["timeline"].([]any) {
			kinds = append(kinds, st.(map[string]any)["kind"].(string))
		}
		if !slices.Equal(kinds[:4], []string{"claimed", "duplicate", "validation", "validation"}) || kinds[len(kinds)-1] != "transition" {
			t.Fatalf("timeline: %v", kinds)
		}
		// No payload, and no lease owner (the capability to move the run), ever.
		for _, secret := range []string{"ana@example.com", r.body["lease_owner"].(string), token} {
			if strings.Contains(x.raw, secret) {
				t.Fatalf("the explanation contains %q", secret)
			}
		}
		documented(t, h, "Explanation", x.raw)

		// An auto-approved run: its rule and policy version are in the document.
		r = h.post("/v1/runs/claim", `{"key":"t-2","payload":{"ticket":2}}`)
		lb = fmt.Sprintf(`"lease_owner":"%s","version":1`, r.body["lease_owner"])
		expect(t, h.post("/v1/runs/t-2/validate", `{`+lb+`,"action_type":"triage","output":{"label":"spam"}}`), 200, "")
		classifier := h.key(apikeys.Spec{Name: "classifier", Scopes: []string{apikeys.ScopeEvaluator}})
		expect(t, h.do("POST", "/v1/runs/t-2/evidence", classifier, "application/json", `{"name":"score","value":0.97}`), 201, "")
		expect(t, h.post("/v1/runs/t-2/effects", `{`+lb+`,"action_type":"triage","target":"default"}`), 201, "")
		x = h.get("/v1/runs/t-2/explain")
		expect(t, x, 200, "")
		auto := x.body["approved"].(map[string]any)["auto_approvals"].([]any)
		if len(auto) != 1 || auto[0].(map[string]any)["policy_version"] != h.env.Policy.Version || !strings.Contains(auto[0].(map[string]any)["rule"].(string), "classifier") {
			t.Fatalf("auto-approvals: %v", auto)
		}
		documented(t, h, "Explanation", x.raw)

		expect(t, h.get("/v1/runs/nobody/explain"), 404, "run_not_found")
		expect(t, h.get("/v1/runs/a%20b/explain"), 400, "invalid_field")
		expect(t, h.do("GET", "/v1/runs/t-1/explain", "", "", ""), 401, "unauthenticated")
	})
}

// documented checks a response against its schema in openapi.json: every field it has is
// documented with the right type, and every required field is there.
func documented(t *testing.T, h *harness, schema, raw string) {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal([]byte(h.do("GET", "/openapi.json", "", "", "").raw), &doc); err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal([]byte(raw), &v); err != nil {
		t.Fatal(err)
	}
	schemas := doc["components"].(map[string]any)["schemas"].(map[string]any)
	var walk func(path string, v any, s map[string]any)
	walk = func(path string, v any, s map[string]any) {
		if ref, ok := s["$ref"].(string); ok {
			s = schemas[strings.TrimPrefix(ref, "#/components/schemas/")].(map[string]any)
		}
		types := []string{}
		switch ty := s["type"].(type) {
		case string:
			types = append(types, ty)
		case []any:
			for _, x := range ty {
				types = append(types, x.(string))
			}
		}
		var kind string
		switch v.(type) {
		case map[string]any:
			kind = "object"
		case []any:
			kind = "array"
		case string:
			kind = "string"
		case float64:
			kind = "number"
		case bool:
			kind = "boolean"
		case nil:
			kind = "null"
		}
		if len(types) > 0 && !slices.Contains(types, kind) && !(kind == "number" && slices.Contains(types, "integer")) {
			t.Errorf("%s is %s, documented as %v", path, kind, types)
			return
		}
		if enum, ok := s["enum"].([]any); ok && !slices.Contains(enum, v) {
			t.Errorf("%s = %v is not in its enum %v", path, v, enum)
		}
		switch v := v.(type) {
		case map[string]any:
			props, _ := s["properties"].(map[string]any)
			for k, fv := range v {
				ps, ok := props[k].(map[string]any)
				if !ok {
					t.Errorf("%s.%s is not documented", path, k)
					continue
				}
				walk(path+"."+k, fv, ps)
			}
			req, _ := s["required"].([]any)
			for _, k := range req {
				if _, ok := v[k.(string)]; !ok {
					t.Errorf("%s lacks the required %s", path, k)
				}
			}
		case []any:
			items, _ := s["items"].(map[string]any)
			for i, x := range v {
				walk(fmt.Sprintf("%s[%d]", path, i), x, items)
			}
		}
	}
	walk(schema, v, map[string]any{"$ref": "#/components/schemas/" + schema})
}
