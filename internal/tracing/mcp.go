package tracing

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// MCP tool calls follow OpenTelemetry's MCP conventions: the span of a call is named
// "tools/call {tool}" with mcp.method.name, its parent is the trace context the client
// put in the request's params._meta (traceparent, tracestate), and the gateway passes
// its own span's context on to the upstream the same way. Never the arguments.

// metaCarrier reads and writes the trace context in an MCP _meta object.
type metaCarrier map[string]any

func (m metaCarrier) Get(key string) string {
	s, _ := m[key].(string)
	return s
}

func (m metaCarrier) Set(key, value string) { m[key] = value }

func (m metaCarrier) Keys() []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}

// MCPToolCall begins the span of a tools/call of tool whose request carried meta (its
// params._meta, may be nil); end records whether the call answered an error (a refusal
// or a tool error) and the gateway's decision, and ends it.
func (t *Tracer) MCPToolCall(ctx context.Context, meta map[string]any, tool string) (context.Context, func(isError bool, decision string)) {
	if t == nil {
		return ctx, func(bool, string) {}
	}
	if meta != nil {
		ctx = propagation.TraceContext{}.Extract(ctx, metaCarrier(meta))
	}
	ctx, span := t.t.Start(ctx, "tools/call "+tool, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("mcp.method.name", "tools/call"), attribute.String("gen_ai.tool.name", tool),
			attribute.String("gen_ai.operation.name", "execute_tool")))
	return ctx, func(isError bool, decision string) {
		if decision != "" {
			span.SetAttributes(attribute.String("airlock.decision", decision))
		}
		if isError {
			span.SetStatus(codes.Error, decision)
		}
		span.End()
	}
}

// InjectMeta writes ctx's trace context into an MCP _meta object (traceparent,
// tracestate), for the request the gateway sends upstream; meta must not be nil.
func InjectMeta(ctx context.Context, meta map[string]any) {
	propagation.TraceContext{}.Inject(ctx, metaCarrier(meta))
}

// Transport sends each request with its context's trace context in a traceparent header
// (W3C), so the spans of the server it calls join the caller's trace. base nil:
// http.DefaultTransport.
func Transport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return roundTripper{base}
}

type roundTripper struct{ base http.RoundTripper }

func (rt roundTripper) RoundTrip(r *http.Request) (*http.Response, error) {
	if !trace.SpanContextFromContext(r.Context()).IsValid() {
		return rt.base.RoundTrip(r)
	}
	r = r.Clone(r.Context()) // a RoundTripper must not change the caller's request
	propagation.TraceContext{}.Inject(r.Context(), propagation.HeaderCarrier(r.Header))
	return rt.base.RoundTrip(r)
}

// Parent is the W3C traceparent of ctx's span ("" without one): what an effect queued in
// this request keeps, so its dispatch joins the trace.
func Parent(ctx context.Context) string {
	m := map[string]any{}
	InjectMeta(ctx, m)
	s, _ := m["traceparent"].(string)
	return s
}

// WithParent returns ctx with the remote span context of traceparent ("" or invalid:
// ctx unchanged).
func WithParent(ctx context.Context, traceparent string) context.Context {
	if traceparent == "" {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, metaCarrier{"traceparent": traceparent})
}

// Dispatch begins the client span of an effect's send (named "send {action type}", a
// child of the span that queued it when ctx carries one); end records the outcome. A nil
// Tracer starts none, and ctx keeps the queuing request's trace for the connector.
func (t *Tracer) Dispatch(ctx context.Context, actionType string) (context.Context, func(outcome string)) {
	if t == nil {
		return ctx, func(string) {}
	}
	ctx, span := t.t.Start(ctx, "send "+actionType, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("airlock.action_type", actionType)))
	return ctx, func(outcome string) {
		span.SetAttributes(attribute.String("airlock.outcome", outcome))
		span.End()
	}
}

// InjectHeader writes ctx's trace context into an outgoing request's headers.
func InjectHeader(ctx context.Context, h http.Header) {
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(h))
}
