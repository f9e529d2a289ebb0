package httpapi_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/store/storetest"
)

// A NUL character (\u0000) in a payload, result, validate output, ledger
// or lease_owner gave 500 on PostgreSQL (SQLite stored it). The decoder refuses it for
// every body, at any depth and in object keys, naming the field, so no store sees it.
func TestNULRefusedNamingTheField(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		owner, v := h.claim("nul-1")
		before := storetest.DumpAll(t, h.env.Store)
		lease := fmt.Sprintf(`"lease_owner":%q,"version":%d`, owner, v)
		for _, c := range []struct{ name, method, path, body, field string }{
			{"payload value", "POST", "/v1/runs/claim", `{"key":"nul-2","payload":{"note":"a\u0000b"}}`, `"payload.note"`},
			{"payload, deep in an array", "POST", "/v1/runs/claim", `{"key":"nul-2","payload":{"items":[1,{"x":["ok","\u0000"]}]}}`, `"payload.items[1].x[1]"`},
			{"payload object key", "POST", "/v1/runs/claim", `{"key":"nul-2","payload":{"a\u0000":1}}`, `"payload.a\x00"`},
			{"payload that is a string", "POST", "/v1/runs/claim", `{"key":"nul-2","payload":"\u0000"}`, `"payload"`},
			{"meta", "POST", "/v1/runs/claim", `{"key":"nul-2","payload":1,"meta":{"requested_by":"\u0000"}}`, `"meta.requested_by"`},
			{"lease_owner", "POST", "/v1/runs/nul-1/heartbeat", fmt.Sprintf(`{"lease_owner":"%s\u0000","version":%d}`, owner, v), `"lease_owner"`},
			{"transition result", "POST", "/v1/runs/nul-1/transition", `{` + lease + `,"to":"completed","result":{"id":"x\u0000"}}`, `"result.id"`},
			{"validate output", "POST", "/v1/runs/nul-1/validate", `{` + lease + `,"action_type":"note","output":"{\"a\":\"\u0000\"}"}`, `"output"`},
			{"ledger", "PUT", "/v1/runs/nul-1/ledger", `{"lease_owner":"` + owner + `","ledger":{"goal":"\u0000"}}`, `"ledger.goal"`},
			{"effect payload", "POST", "/v1/runs/nul-1/effects", `{` + lease + `,"action_type":"note","target":"default","payload":{"t":"\u0000"}}`, `"payload.t"`},
			{"failure detail", "POST", "/v1/runs/nul-1/failures", `{` + lease + `,"class":"timeout","detail":"\u0000"}`, `"detail"`},
		} {
			r := h.do(c.method, c.path, h.runsKey, "application/json", c.body)
			msg, _ := r.body["message"].(string)
			if r.status != 400 || r.body["error"] != "nul_character" || !strings.Contains(msg, c.field) {
				t.Errorf("%s: %d %s; want 400 nul_character naming %s", c.name, r.status, strings.TrimSpace(r.raw), c.field)
			}
		}
		if after := storetest.DumpAll(t, h.env.Store); after != before {
			t.Fatal("a refused body wrote to the database")
		}
		// An escaped backslash before u0000 is text, not NUL; other control escapes are
		// still accepted where free-form JSON is.
		expect(t, h.post("/v1/runs/claim", `{"key":"nul-3","payload":{"n":"\\u0000 \u0001"}}`), 201, "")
	})
}
