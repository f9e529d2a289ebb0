// Package tracing makes OpenTelemetry tracing available and keeps it off by default. When
// on, HTTP requests become spans named by method; approval and sign-in pages are never
// traced, because their paths can carry a token.
package tracing

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Modes of AIRLOCK_TRACING.
const (
	Off    = "off"
	Stdout = "stdout" // spans as JSON on stdout (debugging)
	OTLP   = "otlp"   // OTLP over HTTP; the standard OTEL_EXPORTER_OTLP_* variables configure it
)

// Setup installs a tracer provider for mode and returns the handler wrapper and a shutdown
// function that flushes spans.
func Setup(ctx context.Context, mode string) (wrap func(http.Handler) http.Handler, shutdown func(context.Context) error, err error) {
	none := func(h http.Handler) http.Handler { return h }
	var exp sdktrace.SpanExporter
	switch mode {
	case Off, "":
		return none, func(context.Context) error { return nil }, nil
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
	wrap = func(h http.Handler) http.Handler {
		return otelhttp.NewHandler(h, "airlock",
			otelhttp.WithFilter(func(r *http.Request) bool { return Traced(r.URL.Path) }),
			otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return "HTTP " + r.Method }))
	}
	return wrap, tp.Shutdown, nil
}

// Traced reports whether a path may appear in a trace: not the pages whose paths can hold
// an approval token.
func Traced(path string) bool {
	return !strings.HasPrefix(path, "/approve/") && !strings.HasPrefix(path, "/login")
}
