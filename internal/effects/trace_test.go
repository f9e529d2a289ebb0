package effects_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/store/storetest"
	"github.com/airlockhq/airlock/internal/tracing"
)

// An effect queued in a traced request is sent in that trace: it keeps the request's
// traceparent (migration 0030), the dispatcher's "send {type}" span is a child of it, and
// the provider receives the send span's context in its traceparent header — one trace
// from the agent through airlock to the provider. An effect queued untraced is sent with
// a trace of its own, and never with another effect's.
func TestDispatchCarriesTheQueuingTrace(t *testing.T) {
	for _, b := range storetest.Backends {
		t.Run(b.Name, func(t *testing.T) {
			e := apptest.NewEffectsEnv(t, b, "")
			var mu sync.Mutex
			got := map[string]string{} // traceparent header by payload
			e.Provider.SetReply(func(w http.ResponseWriter, r *http.Request, _ int) {
				var body struct{ N int }
				_ = json.NewDecoder(r.Body).Decode(&body)
				mu.Lock()
				got[fmt.Sprint(body.N)] = r.Header.Get("traceparent")
				mu.Unlock()
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, `{"id":"p-%d"}`, body.N)
			})
			exp := tracetest.NewInMemoryExporter()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
			e.Dispatcher.Tracer = tracing.New(tp)

			const traceID, agentSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
			queue := func(ctx context.Context, key string, n int) {
				t.Helper()
				r := e.ClaimRun(t, key)
				eff, _, _, err := e.Effects.Queue(ctx, effects.QueueRequest{Key: key, Owner: r.LeaseOwner, Version: r.Version,
					ActionType: "note", Target: "default", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, n)), Actor: "test"})
				if err != nil {
					t.Fatal(err)
				}
				want := ""
				if n == 1 {
					want = "00-" + traceID + "-" + agentSpan + "-01"
				}
				if eff.TraceParent != want {
					t.Fatalf("effect %d keeps traceparent %q, want %q", n, eff.TraceParent, want)
				}
			}
			queue(tracing.WithParent(context.Background(), "00-"+traceID+"-"+agentSpan+"-01"), "tr-1", 1)
			queue(context.Background(), "tr-2", 2)
			e.Tick(t)
			if err := tp.ForceFlush(context.Background()); err != nil {
				t.Fatal(err)
			}
			spans := map[string]sdktrace.ReadOnlySpan{}
			for _, s := range exp.GetSpans().Snapshots() {
				if s.Name() == "send note" {
					var body string
					for _, a := range s.Attributes() {
						if a.Key == "airlock.outcome" {
							body = a.Value.AsString()
						}
					}
					if body != "sent" {
						t.Errorf("send span outcome %q", body)
					}
					spans[s.SpanContext().TraceID().String()] = s
				}
			}
			traced, ok := spans[traceID]
			if !ok || traced.Parent().SpanID().String() != agentSpan {
				t.Fatalf("no send span under the queuing request's span: %v", spans)
			}
			mu.Lock()
			defer mu.Unlock()
			if want := "00-" + traceID + "-" + traced.SpanContext().SpanID().String() + "-01"; got["1"] != want {
				t.Errorf("the provider got traceparent %q, want %q (the send span, in the agent's trace)", got["1"], want)
			}
			if got["2"] == "" || strings.Contains(got["2"], traceID) {
				t.Errorf("the untraced effect was sent with traceparent %q", got["2"])
			}
		})
	}
}
