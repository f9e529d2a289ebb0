package tracing

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestModes(t *testing.T) {
	for _, mode := range []string{"off", "stdout"} {
		wrap, stop, err := Setup(context.Background(), mode)
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		h := wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) }))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
		if rec.Code != 204 {
			t.Fatalf("%s: %d", mode, rec.Code)
		}
		if err := stop(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := Setup(context.Background(), "loud"); err == nil {
		t.Fatal("an unknown mode was accepted")
	}
}

func TestTokenPathsAreNeverTraced(t *testing.T) {
	for path, want := range map[string]bool{"/v1/runs/k/claim": true, "/approve/secret-token": false, "/approve/continue": false, "/login/oidc/callback": false} {
		if Traced(path) != want {
			t.Errorf("%s traced=%v", path, !want)
		}
	}
}
