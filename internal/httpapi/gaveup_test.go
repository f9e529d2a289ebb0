package httpapi_test

import (
	"fmt"
	"testing"
)

// Every way a run ends without its answer reaches a person (issue 34, 6): a client that
// gives up says so with an alert, a failure airlock never retries alerts, and an edited
// redelivery (payload_mismatch) alerts. Each alert is an event on the key and counts on
// airlock_alerts_total{kind}.
func TestGiveUpPathsAlert(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		alerts := func(key string) []map[string]any {
			t.Helper()
			var out []map[string]any
			for _, e := range h.get("/v1/runs/" + key + "/events").body["events"].([]any) {
				ev := e.(map[string]any)
				if ev["kind"] == "alert" {
					out = append(out, ev["detail"].(map[string]any))
				}
			}
			return out
		}

		// A client's failed_terminal with an alert reason.
		owner, v := h.claim("g-1")
		lb := fmt.Sprintf(`"lease_owner":"%s","version":%d`, owner, v)
		// Only failed_terminal raises one; a refused request writes nothing.
		expect(t, h.post("/v1/runs/g-1/transition", `{`+lb+`,"to":"completed","alert":"no"}`), 400, "invalid_field")
		expect(t, h.post("/v1/runs/g-1/transition", `{`+lb+`,"to":"failed_retryable","alert":"no"}`), 400, "invalid_field")
		expect(t, h.post("/v1/runs/g-1/transition", `{`+lb+`,"to":"failed_terminal","alert":"bad\u0000"}`), 400, "")
		if got := alerts("g-1"); len(got) != 0 {
			t.Fatalf("a refused transition wrote alerts: %v", got)
		}
		tr := h.post("/v1/runs/g-1/transition", `{`+lb+`,"to":"failed_terminal","result":{"reason":"invalid_model_output"},"alert":"invalid model output after 2 repairs"}`)
		expect(t, tr, 200, "")
		if tr.body["state"] != "failed_terminal" {
			t.Fatalf("transition: %s", tr.raw)
		}
		got := alerts("g-1")
		if len(got) != 1 || got[0]["alert"] != "workflow_gave_up" || got[0]["reason"] != "invalid model output after 2 repairs" {
			t.Fatalf("alerts of g-1 = %v, want one workflow_gave_up with the reason", got)
		}
		// Without an alert a failed_terminal stays silent, as before: the client chose.
		o2, v2 := h.claim("g-2")
		expect(t, h.post("/v1/runs/g-2/transition", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"to":"failed_terminal"}`, o2, v2)), 200, "")
		if got := alerts("g-2"); len(got) != 0 {
			t.Fatalf("alerts of g-2 = %v, want none", got)
		}

		// A failure the table never retries (client_error) ends the run with an alert.
		o3, v3 := h.claim("g-3")
		f := h.post("/v1/runs/g-3/failures", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"class":"client_error","detail":"model HTTP 400"}`, o3, v3))
		expect(t, f, 200, "")
		if f.body["decision"] != "terminal" || f.body["reason"] != "never" {
			t.Fatalf("failure: %s", f.raw)
		}
		got = alerts("g-3")
		if len(got) != 1 || got[0]["alert"] != "failure_not_retried" || got[0]["class"] != "client_error" {
			t.Fatalf("alerts of g-3 = %v, want one failure_not_retried", got)
		}

		// An edited redelivery: the claim is refused and a person hears of it.
		expect(t, h.post("/v1/runs/claim", `{"key":"g-4","payload":{"ticket_id":4,"text":"refund"}}`), 201, "")
		expect(t, h.post("/v1/runs/claim", `{"key":"g-4","payload":{"ticket_id":4,"text":"refund"}}`), 200, "")
		if got := alerts("g-4"); len(got) != 0 {
			t.Fatalf("a duplicate alerted: %v", got)
		}
		expect(t, h.post("/v1/runs/claim", `{"key":"g-4","payload":{"ticket_id":4,"text":"refund, and cancel"}}`), 409, "payload_mismatch")
		got = alerts("g-4")
		if len(got) != 1 || got[0]["alert"] != "payload_mismatch" || got[0]["state"] != "processing" || got[0]["payload_hash"] == "" {
			t.Fatalf("alerts of g-4 = %v, want one payload_mismatch", got)
		}

		h.env.Alerts.Flush(t) // the relay raises alerts in the background
		text := h.do("GET", "/metrics", "", "", "").raw
		for _, kind := range []string{"workflow_gave_up", "failure_not_retried", "payload_mismatch"} {
			if got := metricValue(t, text, `airlock_alerts_total{kind="`+kind+`"}`); got != 1 {
				t.Errorf("airlock_alerts_total{kind=%q} = %v, want 1", kind, got)
			}
		}
	})
}
