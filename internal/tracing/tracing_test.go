package tracing

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
)

// traceOne sets up mode, traces one request to GET /healthz and shuts down (which
// flushes), and returns what the stdout exporter wrote.
func traceOne(t *testing.T, mode string) (traced bool, stdout string) {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "stdout")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	saved := os.Stdout
	os.Stdout = f // Setup hands os.Stdout to the stdout exporter
	defer func() { os.Stdout = saved }()
	tr, stop, err := Setup(context.Background(), mode)
	if err != nil {
		t.Fatalf("%s: %v", mode, err)
	}
	_, end := tr.Start(httptest.NewRequest("GET", "/healthz?secret=1", nil), "GET /healthz")
	end(200)
	if err := stop(context.Background()); err != nil {
		t.Fatalf("%s: shutdown: %v", mode, err)
	}
	out, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	return tr != nil, string(out)
}

// Each mode exports the span of a traced request where it says, and off exports none.
func TestModes(t *testing.T) {
	if traced, out := traceOne(t, Off); traced || out != "" {
		t.Fatalf("off: traced %v, wrote %q", traced, out)
	}
	traced, out := traceOne(t, Stdout)
	if !traced || !strings.Contains(out, `"Name":"GET /healthz"`) || !strings.Contains(out, `"http.route"`) {
		t.Fatalf("stdout: traced %v, no span of GET /healthz written: %q", traced, out)
	}
	if strings.Contains(out, "secret") {
		t.Fatalf("stdout: the span carries the query: %s", out)
	}

	// OTLP over HTTP to a collector named by the standard variable.
	var mu sync.Mutex
	var got [][]byte
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/v1/traces" {
			mu.Lock()
			got = append(got, body)
			mu.Unlock()
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer collector.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	if traced, out := traceOne(t, OTLP); !traced || out != "" {
		t.Fatalf("otlp: traced %v, wrote to stdout %q", traced, out)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || !bytes.Contains(got[0], []byte("GET /healthz")) {
		t.Fatalf("otlp: %d exports to the collector; want one carrying the span", len(got))
	}

	if _, _, err := Setup(context.Background(), "loud"); err == nil {
		t.Fatal("an unknown mode was accepted")
	}
}
