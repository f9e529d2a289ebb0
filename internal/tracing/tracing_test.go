package tracing

import (
	"context"
	"net/http/httptest"
	"testing"
)

func TestModes(t *testing.T) {
	for _, mode := range []string{"off", "stdout"} {
		tr, stop, err := Setup(context.Background(), mode)
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		if (tr == nil) != (mode == "off") {
			t.Fatalf("%s: tracer %v", mode, tr)
		}
		_, end := tr.Start(httptest.NewRequest("GET", "/healthz", nil), "GET /healthz")
		end(200)
		if err := stop(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := Setup(context.Background(), "loud"); err == nil {
		t.Fatal("an unknown mode was accepted")
	}
}
