// Package tracing makes OpenTelemetry tracing available and keeps it off by default. When
// on, requests to the API's routes become server spans named by the route they matched
// ("POST /v1/runs/claim"). Whether a request is traced is decided by that route, never by
// the raw path, which a client can spell many ways (//approve/T, /x/../approve/T,
// /Approve/T): the caller passes only routes from its own table, and a span carries the
// route pattern, the method and the status — never the path, its query, or a header.
package tracing

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Modes of AIRLOCK_TRACING.
const (
	Off    = "off"
	Stdout = "stdout" // spans as JSON on stdout (debugging)
	OTLP   = "otlp"   // OTLP over HTTP; the standard OTEL_EXPORTER_OTLP_* variables configure it
)

// Tracer starts the spans of matched routes. A nil Tracer traces nothing.
type Tracer struct {
	t trace.Tracer
}

// New traces through tp.
func New(tp trace.TracerProvider) *Tracer {
	return &Tracer{t: tp.Tracer("github.com/airlockhq/airlock")}
}

// Setup installs a tracer provider for mode and returns its Tracer (nil when off) and a
// shutdown function that flushes spans.
func Setup(ctx context.Context, mode string) (*Tracer, func(context.Context) error, error) {
	var exp sdktrace.SpanExporter
	var err error
	switch mode {
	case Off, "":
		return nil, func(context.Context) error { return nil }, nil
	case Stdout:
		exp, err = stdouttrace.New(stdouttrace.WithWriter(os.Stdout))
	case OTLP:
		exp, err = otlptracehttp.New(ctx)
	default:
		return nil, nil, fmt.Errorf("unknown tracing mode %q", mode)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("tracing exporter: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	return New(tp), tp.Shutdown, nil
}

// Start begins the server span of a request that matched route, a registered pattern
// such as "POST /v1/runs/{key}/heartbeat"; end records the status and ends it.
func (t *Tracer) Start(r *http.Request, route string) (ctx context.Context, end func(status int)) {
	if t == nil {
		return r.Context(), func(int) {}
	}
	method, pattern, ok := strings.Cut(route, " ")
	if !ok {
		method, pattern = r.Method, route
	}
	// W3C trace context whatever the process's global propagator: a caller's traceparent
	// (an agent, the MCP gateway) makes this span part of its trace.
	ctx = propagation.TraceContext{}.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, span := t.t.Start(ctx, method+" "+pattern, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("http.request.method", method), attribute.String("http.route", pattern)))
	return ctx, func(status int) {
		span.SetAttributes(attribute.Int("http.response.status_code", status))
		if status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(status))
		}
		span.End()
	}
}
