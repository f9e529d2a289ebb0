package httpapi_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/airlockhq/airlock/internal/httpapi"
	"github.com/airlockhq/airlock/internal/store/storetest"
	"github.com/airlockhq/airlock/internal/tracing"
)

// Bodies used to be read loosely: "KEY" set key, the last of a repeated field won, and
// invalid UTF-8 was stored as U+FFFD.
func TestStrictJSONBodies(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		before := storetest.DumpAll(t, h.env.Store)
		for _, c := range []struct{ name, body, code string }{
			{"field name in capitals", `{"KEY":"s-1","payload":1}`, "unknown_field"},
			{"field name in mixed case", `{"key":"s-1","Payload":1}`, "unknown_field"},
			{"nested field name case", `{"key":"s-1","payload":1,"meta":{"Workflow_Version":"x"}}`, "unknown_field"},
			{"deeper nested case", `{"key":"s-1","payload":1,"meta":{"model":{"NAME":"x"}}}`, "unknown_field"},
			{"repeated field", `{"key":"s-1","key":"s-2","payload":1}`, "duplicate_field"},
			{"repeated field, escaped spelling", `{"key":"s-1","\u006bey":"s-2","payload":1}`, "duplicate_field"},
			{"repeated field in meta", `{"key":"s-1","payload":1,"meta":{"requested_by":"a","requested_by":"b"}}`, "duplicate_field"},
			{"repeated field in meta.model", `{"key":"s-1","payload":1,"meta":{"model":{"name":"a","name":"b"}}}`, "duplicate_field"},
			{"repeated field in the free-form payload", `{"key":"s-1","payload":{"to":"a","x":{"amount":1,"amount":2}}}`, "duplicate_field"},
			{"repeated field inside an array", `{"key":"s-1","payload":[{"a":1},{"b":1,"b":2}]}`, "duplicate_field"},
			{"invalid UTF-8 in meta", "{\"key\":\"s-1\",\"payload\":1,\"meta\":{\"requested_by\":\"ana\xff\"}}", "invalid_utf8"},
			{"invalid UTF-8 in the payload", "{\"key\":\"s-1\",\"payload\":{\"note\":\"\xc3\x28\"}}", "invalid_utf8"},
			{"invalid UTF-8 in a key", "{\"key\":\"s-1\",\"payload\":{\"\xed\xa0\x80\":1}}", "invalid_utf8"},
			{"lone surrogate escape in meta", `{"key":"s-1","payload":1,"meta":{"requested_by":"ana\ud800"}}`, "invalid_utf8"},
			{"lone low surrogate in the payload", `{"key":"s-1","payload":{"n":"\udc00x"}}`, "invalid_utf8"},
			{"reversed surrogate pair", `{"key":"s-1","payload":{"n":"\ude00\ud83d"}}`, "invalid_utf8"},
		} {
			r := h.post("/v1/runs/claim", c.body)
			if r.status != 400 || r.body["error"] != c.code {
				t.Errorf("%s: %d %s, want 400 %s", c.name, r.status, strings.TrimSpace(r.raw), c.code)
			}
		}
		if after := storetest.DumpAll(t, h.env.Store); after != before {
			t.Fatal("a refused body wrote to the database")
		}
		// Other routes go through the same decoder.
		owner, v := h.claim("s-3")
		expect(t, h.post("/v1/runs/s-3/heartbeat", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"Version":%d}`, owner, v, v)), 400, "unknown_field")
		expect(t, h.post("/v1/runs/s-3/heartbeat", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"version":%d}`, owner, v, v)), 400, "duplicate_field")
		expect(t, h.post("/v1/runs/s-3/effects", fmt.Sprintf(`{"lease_owner":"%s","version":%d,"action_type":"note","target":"default","payload":{"a":1,"a":1}}`, owner, v)), 400, "duplicate_field")
		expect(t, h.do("PUT", "/v1/admin/kill-switch", h.adminKy, "application/json", `{"enabled":false,"enabled":true,"reason":"x"}`), 400, "duplicate_field")
		// What is valid still is: a surrogate pair, a literal U+FFFD, exact names.
		ok := h.post("/v1/runs/claim", `{"key":"s-4","payload":{"n":"\ud83d\ude00 �"},"meta":{"requested_by":"Zoë"}}`)
		expect(t, ok, 201, "")
	})
}

// JSON answers carry X-Content-Type-Options: nosniff.
func TestJSONNosniff(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		for _, r := range []response{
			h.post("/v1/runs/claim", `{"key":"n-1","payload":1}`),
			h.post("/v1/runs/claim", `{"key":`),
			h.get("/v1/runs/nope"),
			h.do("GET", "/v1/runs/n-1", "", "", ""),
			h.do("GET", "/no/such/route", "", "", ""),
			h.do("DELETE", "/v1/runs/claim", "", "", ""),
			h.do("GET", "/healthz", "", "", ""),
			h.do("GET", "/openapi.json", "", "", ""),
			h.do("GET", "/v1/ledger.schema.json", "", "", ""),
			h.do("GET", "/metrics", "", "", ""),
		} {
			if r.header.Get("X-Content-Type-Options") != "nosniff" {
				t.Errorf("%d %s: X-Content-Type-Options %q", r.status, strings.TrimSpace(r.raw)[:min(60, len(strings.TrimSpace(r.raw)))], r.header.Get("X-Content-Type-Options"))
			}
		}
	})
}

// rawGet sends path exactly as given (no client-side cleaning) and returns the status.
func rawGet(t *testing.T, base, method, path string) int {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", method, path, strings.TrimPrefix(base, "http://"))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// //approve/T, /x/../approve/T and /Approve/T used to be traced with the raw token in
// url.path.
func TestTracingDecidedByRoute(t *testing.T) {
	forEachBackend(t, func(t *testing.T, h *harness) {
		exp := tracetest.NewInMemoryExporter()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
		defer tp.Shutdown(context.Background())
		base := h.another(func(d *httpapi.Deps) { d.Tracer = tracing.New(tp) })
		token := strings.TrimPrefix(h.propose("trace-1", ""), h.url+"/approve/")
		for _, p := range []string{"/approve/", "//approve/", "/x/../approve/", "/./approve/", "/Approve/", "/APPROVE/", "/approve//", "/v1/runs/../../approve/",
			"/v1/runs/trace-1/../../../approve/", "/login/oidc/callback?state=", "/approve/continue?t=", "/v1/nothing/", "/v1/runs/trace-1?x="} {
			for _, m := range []string{"GET", "POST"} {
				rawGet(t, base, m, p+token)
			}
		}
		rawGet(t, base, "GET", "/v1/runs/trace-1/../trace-1?t="+token)
		rawGet(t, base, "GET", "/healthz?t="+token)
		spans := exp.GetSpans()
		var names []string
		for _, s := range spans {
			names = append(names, s.Name)
			all := s.Name
			for _, a := range s.Attributes {
				all += " " + string(a.Key) + "=" + a.Value.String()
			}
			for _, e := range s.Events {
				all += " " + e.Name
			}
			if strings.Contains(all, token) || strings.Contains(strings.ToLower(all), "approve") || strings.Contains(all, "url.path") {
				t.Fatalf("span %q", all)
			}
		}
		// The API's own routes are traced, by their pattern.
		if len(spans) == 0 || !strings.Contains(strings.Join(names, ","), "GET /healthz") {
			t.Fatalf("spans: %v", names)
		}
		exp.Reset()
		r, _ := http.Post(base+"/v1/runs/claim", "application/json", strings.NewReader(`{}`))
		r.Body.Close()
		if spans := exp.GetSpans(); len(spans) != 1 || spans[0].Name != "POST /v1/runs/claim" {
			t.Fatalf("claim span: %v", spans)
		}
	})
}
