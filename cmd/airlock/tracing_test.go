package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apptest"
)

// With tracing on, airlock used to trace //approve/T, /x/../approve/T and /Approve/T
// with the raw token in url.path. The spans airlock serve writes (stdout mode)
// must hold no token and no path, only the API's route patterns.
func TestServeTracingNeverRecordsPaths(t *testing.T) {
	env := []string{"AIRLOCK_DATABASE_URL=" + t.TempDir() + "/airlock.db", "AIRLOCK_TRACING=stdout", "AIRLOCK_LISTEN=127.0.0.1:0"}
	cmd := exec.Command(binary, "serve")
	cmd.Env = slices.Concat(os.Environ(), env)
	var stdout apptest.LockedBuffer
	cmd.Stdout = &stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var line struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "airlock serving" {
				addr <- line.Addr
			}
		}
	}()
	var host string
	select {
	case host = <-addr:
	case <-time.After(60 * time.Second):
		t.Fatal("airlock serve did not start")
	}
	const token = "T0KEN-5ecret-a1b2c3d4e5f6g7h8i9j0k1l2m3n4o5p6q7r"
	send := func(method, path string) {
		conn, err := net.Dial("tcp", host)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: %s\r\nOrigin: http://%s\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", method, path, host, host)
		if resp, err := http.ReadResponse(bufio.NewReader(conn), nil); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	for _, p := range []string{"//approve/", "/x/../approve/", "/Approve/", "/approve/", "/APPROVE/", "/./approve/", "/v1/runs/../../approve/",
		"/login/oidc/callback?code=", "/v1/runs/k/../../../approve/", "/v1/nothing/"} {
		send("GET", p+token)
		send("POST", p+token)
	}
	send("GET", "/healthz?t="+token)
	send("POST", "/v1/runs/claim")
	_ = cmd.Process.Signal(syscall.SIGTERM) // flushes the spans
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("airlock serve did not stop")
	}
	out := stdout.String()
	if strings.Contains(out, token) || strings.Contains(out, "url.path") || strings.Contains(strings.ToLower(out), "approve") {
		t.Fatalf("a span records the path or the token:\n%s", out)
	}
	if !strings.Contains(out, `"GET /healthz"`) || !strings.Contains(out, `"POST /v1/runs/claim"`) {
		t.Fatalf("the API's routes were not traced by their pattern:\n%s", out)
	}
}
