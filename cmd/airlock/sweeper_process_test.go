package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// With no dispatcher in any instance, an external worker's lapsed lease still ends: every
// instance sweeps (issue: worker leases were swept only by a dispatcher).
func TestWorkerLeaseSweptWithoutDispatcher(t *testing.T) {
	for backend, env := range databases(t) {
		t.Run(backend, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "policy.yaml")
			doc := "actions:\n  task:\n    connector: worker\n    gate: none\n" +
				"dispatch: {disabled: true, interval: 50ms}\n"
			if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
				t.Fatal(err)
			}
			env := append(slices.Clone(env), "AIRLOCK_CONFIG="+path)
			apiKey := setupDB(t, env)
			raw, stderr, err := airlock(t, env, "apikey", "create", "--name", "w", "--scope", "worker")
			if err != nil {
				t.Fatalf("apikey create: %v\n%s", err, stderr)
			}
			workerKey := strings.TrimSpace(raw)
			srv := startServe(t, env)

			c, err := postClaim(srv.URL, apiKey, "run-1")
			if err != nil || !c.Claimed {
				t.Fatalf("claim: %+v %v", c, err)
			}
			body := `{"lease_owner":"` + c.Owner + `","version":1,"action_type":"task","target":"default","payload":{"n":1}}`
			if _, err := apiJSON("POST", srv.URL+"/v1/runs/run-1/effects", apiKey, body, nil); err != nil {
				t.Fatal(err)
			}
			var got struct {
				IdempotencyKey string `json:"idempotency_key"`
			}
			if _, err := apiJSON("POST", srv.URL+"/v1/effects/claim", workerKey, `{"types":["task"],"lease_seconds":1}`, &got); err != nil {
				t.Fatal(err)
			}
			// The worker dies with the lease. Nothing dispatches here; the sweep must end it.
			deadline := time.Now().Add(15 * time.Second)
			for {
				e, err := runEffect(srv.URL, apiKey, "run-1")
				if err != nil {
					t.Fatal(err)
				}
				if e.State == "unknown" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("worker lease not swept: effect still %s\n%s", e.State, srv.Logs())
				}
				time.Sleep(50 * time.Millisecond)
			}
			if want := fmt.Sprintf("run-1/%s", strings.TrimPrefix(got.IdempotencyKey, "run-1/")); got.IdempotencyKey != want || !strings.HasPrefix(got.IdempotencyKey, "run-1/") {
				t.Fatalf("worker idempotency key %q does not name the run", got.IdempotencyKey)
			}
		})
	}
}
