package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// airlock healthcheck is for container health checks (the image has no shell or curl):
// exit 0 when /readyz (with --live: /healthz) answers 200, 1 otherwise.
func TestHealthcheckCommand(t *testing.T) {
	s := startServe(t, []string{"AIRLOCK_DATABASE_URL=" + filepath.Join(t.TempDir(), "a.db")})
	addr := strings.TrimPrefix(s.URL, "http://")
	if out, stderr, err := airlock(t, []string{"AIRLOCK_LISTEN=" + addr}, "healthcheck"); err != nil {
		t.Fatalf("healthcheck of a ready server: %v %s %s", err, out, stderr)
	}
	// A wildcard listen address is checked on loopback.
	port := addr[strings.LastIndexByte(addr, ':')+1:]
	if _, stderr, err := airlock(t, []string{"AIRLOCK_LISTEN=0.0.0.0:" + port}, "healthcheck"); err != nil {
		t.Fatalf("healthcheck via 0.0.0.0: %v %s", err, stderr)
	}
	// --live asks /healthz (the image's HEALTHCHECK: it must not fail while the database
	// restarts).
	if out, stderr, err := airlock(t, []string{"AIRLOCK_LISTEN=" + addr}, "healthcheck", "--live"); err != nil || strings.TrimSpace(out) != "alive" {
		t.Fatalf("healthcheck --live of a running server: %v %s %s", err, out, stderr)
	}
	nothing := []string{fmt.Sprintf("AIRLOCK_LISTEN=127.0.0.1:%d", freePort(t))}
	_, stderr, err := airlock(t, nothing, "healthcheck")
	if err == nil || !strings.Contains(stderr, "not ready") {
		t.Fatalf("healthcheck of nothing: %v %s", err, stderr)
	}
	if _, stderr, err := airlock(t, nothing, "healthcheck", "--live"); err == nil || !strings.Contains(stderr, "not alive") {
		t.Fatalf("healthcheck --live of nothing: %v %s", err, stderr)
	}
}
