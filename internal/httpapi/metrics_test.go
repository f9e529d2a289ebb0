package httpapi_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// metricValue reads one sample from the exposition text.
func metricValue(t *testing.T, text, series string) float64 {
	t.Helper()
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` ([0-9.e+-]+)$`)
	m := re.FindStringSubmatch(text)
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestMetricsScenario scripts a scenario with known counts and checks every metric.
func TestMetricsScenario(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		// Claims: 3 new, 2 duplicates, 1 payload mismatch, 1 reclaim.
		for _, k := range []string{"m-1", "m-2"} {
			h.claim(k)
		}
		h.post("/v1/runs/claim", `{"key":"m-1","payload":{"ticket":42}}`)
		h.post("/v1/runs/claim", `{"key":"m-1","payload":{"ticket":42}}`)
		h.post("/v1/runs/claim", `{"key":"m-1","payload":{"ticket":43}}`)
		h.claim("m-3")
		h.env.Clock.Advance(6 * time.Minute)
		h.post("/v1/runs/claim", `{"key":"m-3","payload":{"ticket":42}}`) // reclaimed
		// Validations: 1 valid, 1 repaired, 1 invalid.
		owner, v := h.claim("m-4")
		lb := fmt.Sprintf(`"lease_owner":"%s","version":%d`, owner, v)
		h.post("/v1/runs/m-4/validate", `{`+lb+`,"action_type":"reply","output":{"label":"refund","text":"ok"}}`)
		h.post("/v1/runs/m-4/validate", `{`+lb+`,"action_type":"reply","output":"sure: {\"label\":\"other\",\"text\":\"x\"}"}`)
		h.post("/v1/runs/m-4/validate", `{`+lb+`,"action_type":"reply","output":{"label":"nope"}}`)
		// A retry-cap hit: transport_timeout has 3 attempts.
		owner, v = h.claim("m-5")
		for range 3 {
			h.post("/v1/runs/m-5/failures", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"class":"transport_timeout"}`, owner, v))
		}
		// One human approval decided 90 s after it was asked for; the effect is sent.
		h.addUser("lead", "support-lead")
		lead := newBrowser(t)
		h.signIn(lead, "lead")
		link := h.propose("m-6", "")
		h.env.Clock.Advance(90 * time.Second)
		if code, _, _ := lead.do("POST", link, url.Values{"decision": {"approve"}}, nil); code != 200 {
			t.Fatalf("approve: %d", code)
		}
		if _, err := h.env.Dispatcher.Tick(ctx); err != nil {
			t.Fatal(err)
		}
		// One unknown effect (a 502 from the provider), and the kill switch off.
		h.env.Provider.Reply = func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(http.StatusBadGateway) }
		owner, v = h.claim("m-7")
		h.post("/v1/runs/m-7/effects", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"action_type":"note","target":"default","payload":{"n":1}}`, owner, v))
		if _, err := h.env.Dispatcher.Tick(ctx); err != nil {
			t.Fatal(err)
		}
		expect(t, h.do("PUT", "/v1/admin/kill-switch", h.adminKy, "application/json", `{"enabled":false,"reason":"test"}`), 200, "")

		h.env.Alerts.Flush(t) // the relay raises alerts in the background
		text := h.do("GET", "/metrics", "", "", "").raw
		for series, want := range map[string]float64{
			`airlock_claims_total{outcome="claimed"}`:                                     7,
			`airlock_claims_total{outcome="duplicate"}`:                                   2,
			`airlock_claims_total{outcome="payload_mismatch"}`:                            1,
			`airlock_claims_total{outcome="reclaimed"}`:                                   1,
			`airlock_validations_total{result="valid"}`:                                   1,
			`airlock_validations_total{result="repaired"}`:                                1,
			`airlock_validations_total{result="invalid"}`:                                 1,
			`airlock_retry_cap_hits_total`:                                                1,
			`airlock_alerts_total{kind="retry_cap"}`:                                      1,
			`airlock_alerts_total{kind="effect_unknown"}`:                                 1,
			`airlock_approvals_total{decision="approve",mode="approve_before_act"}`:       1,
			`airlock_gate_wait_seconds_count{mode="approve_before_act"}`:                  1,
			`airlock_gate_wait_seconds_sum{mode="approve_before_act"}`:                    90,
			`airlock_effects{state="completed"}`:                                          1,
			`airlock_effects{state="unknown"}`:                                            1,
			`airlock_kill_switch_enabled`:                                                 0,
			`airlock_dispatch_seconds_count{outcome="sent"}`:                              1,
			`airlock_dispatch_seconds_count{outcome="ambiguous"}`:                         1,
			`airlock_http_requests_total{code="409",route="POST /v1/runs/claim"}`:         1,
			`airlock_http_requests_total{code="201",route="POST /v1/runs/{key}/effects"}`: 1,
		} {
			if got := metricValue(t, text, series); got != want {
				t.Errorf("%s = %v, want %v", series, got, want)
			}
		}
		if strings.Contains(text, "m-1") || strings.Contains(text, link) {
			t.Fatal("a key or a token became a label")
		}
	})
}
