package mcpgw_test

import (
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/airlockhq/airlock/internal/tracing"
)

// collector is an in-process OTLP/HTTP trace collector: what airlock's otlp mode exports to.
type collector struct {
	mu    sync.Mutex
	spans []span
}

type span struct {
	name, traceID, spanID, parentID string
	attrs                           map[string]string
}

func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(r.Body)
	var req coltrace.ExportTraceServiceRequest
	if err != nil || r.URL.Path != "/v1/traces" || proto.Unmarshal(b, &req) != nil {
		http.Error(w, "bad export", http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				attrs := map[string]string{}
				for _, a := range s.Attributes {
					attrs[a.Key] = a.Value.GetStringValue()
				}
				c.spans = append(c.spans, span{name: s.Name, traceID: hex.EncodeToString(s.TraceId), spanID: hex.EncodeToString(s.SpanId),
					parentID: hex.EncodeToString(s.ParentSpanId), attrs: attrs})
			}
		}
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	_, _ = w.Write(out)
}

func (c *collector) find(name string) []span {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []span
	for _, s := range c.spans {
		if s.name == name {
			out = append(out, s)
		}
	}
	return out
}

// One trace from the agent through airlock to the provider: the traceparent an agent puts
// in a call's _meta is the parent of the gateway's span "tools/call {tool}"
// (mcp.method.name), the gateway's calls to airlock carry it (airlock's API spans are in
// the same trace), and the upstream receives it in its own call's _meta. Checked against
// an in-process OTLP collector; a call without a traceparent starts a trace of its own.
func TestTraceContextGoesAgentToAirlockToUpstream(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		col := &collector{}
		srv := httptest.NewServer(col)
		defer srv.Close()
		ctx := context.Background()
		exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(srv.URL+"/v1/traces"))
		if err != nil {
			t.Fatal(err)
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp))
		defer tp.Shutdown(ctx)
		e.tracer = tracing.New(tp)
		e.startAirlock()
		e.startAgent()

		const traceID, agentSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
		callTraced := func(tool string, args map[string]any) *mcp.CallToolResult {
			t.Helper()
			r, err := e.agent.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args,
				Meta: mcp.Meta{"traceparent": "00-" + traceID + "-" + agentSpan + "-01"}})
			if err != nil || r.IsError {
				t.Fatalf("%s: %v %q", tool, err, text(r))
			}
			return r
		}
		callTraced("write_note", map[string]any{"text": "traced"})
		callTraced("read_note", map[string]any{"id": 3})
		e.mustOK("find_notes", map[string]any{"text": "untraced"})
		if err := tp.ForceFlush(ctx); err != nil {
			t.Fatal(err)
		}

		for _, tool := range []string{"write_note", "read_note"} {
			s := col.find("tools/call " + tool)
			if len(s) != 1 {
				t.Fatalf("spans named tools/call %s: %d, want 1", tool, len(s))
			}
			if s[0].traceID != traceID || s[0].parentID != agentSpan {
				t.Errorf("%s: span in trace %s under %s, want trace %s under the agent's span %s", tool, s[0].traceID, s[0].parentID, traceID, agentSpan)
			}
			if s[0].attrs["mcp.method.name"] != "tools/call" || s[0].attrs["gen_ai.tool.name"] != tool {
				t.Errorf("%s: attributes %v", tool, s[0].attrs)
			}
		}
		gw := col.find("tools/call write_note")[0]
		plan := col.find("POST /v1/runs/{key}/ledger/effects/{effect_id}/plan")
		confirm := col.find("POST /v1/runs/{key}/ledger/effects/{effect_id}/confirm")
		if len(plan) != 1 || len(confirm) != 1 {
			var names []string
			for _, s := range col.spans {
				names = append(names, s.name)
			}
			t.Fatalf("airlock's plan and confirm spans: %d, %d; spans: %v", len(plan), len(confirm), names)
		}
		for _, s := range []span{plan[0], confirm[0]} {
			if s.traceID != traceID || s.parentID != gw.spanID {
				t.Errorf("%s: in trace %s under %s, want the gateway's span %s in trace %s", s.name, s.traceID, s.parentID, gw.spanID, traceID)
			}
		}
		e.up.mu.Lock()
		got := append([]string(nil), e.up.traceparents...)
		e.up.mu.Unlock()
		if len(got) != 3 {
			t.Fatalf("the upstream got %d traceparents, want 3: %v", len(got), got)
		}
		for i, tool := range []string{"write_note", "read_note", "find_notes"} {
			s := col.find("tools/call " + tool)[0]
			want := "00-" + s.traceID + "-" + s.spanID + "-01"
			if got[i] != want {
				t.Errorf("%s: upstream got traceparent %q, want %q (the gateway's span)", tool, got[i], want)
			}
		}
		if s := col.find("tools/call find_notes"); len(s) != 1 || s[0].traceID == traceID || s[0].parentID != "" {
			t.Errorf("an untraced call: %+v", s)
		}
		for _, s := range col.spans {
			for k, v := range s.attrs {
				if strings.Contains(v, "traced") && k != "gen_ai.tool.name" {
					t.Errorf("span %s carries the arguments in %s: %q", s.name, k, v)
				}
			}
		}
	})
}
