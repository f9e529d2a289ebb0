package httpapi_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apikeys"
	"github.com/airlockhq/airlock/internal/app"
	"github.com/airlockhq/airlock/internal/apptest"
	"github.com/airlockhq/airlock/internal/metrics"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// BenchmarkClaimServe claims new keys over real HTTP, one client with keep-alive, against
// the handler wired as `airlock serve` wires it (the API-key cache; logs at warn, as
// scripts/bench-cpu.sh runs serve), and reports allocs/op for the whole round trip (the
// client's share is the same in every build) and the process's CPU per claim. CPU per claim beside the raw statement is scripts/bench-cpu.sh's job; this one
// makes the process's per-request allocations visible to -benchmem and -cpuprofile:
//
//	go test ./internal/httpapi -run '^$' -bench ClaimServe -benchtime 2000x -benchmem
func BenchmarkClaimServe(b *testing.B) {
	for _, backend := range storetest.Backends {
		b.Run(backend.Name, func(b *testing.B) {
			env := apptest.NewEffectsEnv(b, backend, "")
			log := slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelWarn}))
			srv := httptest.NewUnstartedServer(nil)
			b.Cleanup(srv.Close)
			a, err := app.New(app.Options{Store: env.Store, Policy: env.Policy, Connectors: env.Conns,
				Runs: apptest.LeaseConfig, PublicURL: "http://" + srv.Listener.Addr().String(), Now: env.Clock.Now,
				Log: log, Metrics: metrics.New(), Alerts: env.Alerts, MaxBodyBytes: 1 << 20,
				APIKeys: apikeys.NewCache(time.Minute, nil)})
			if err != nil {
				b.Fatal(err)
			}
			srv.Config.Handler = a.Handler
			srv.Start()
			_, key, err := apikeys.Create(context.Background(), env.Store, "bench", []string{"runs"}, env.Clock.Now())
			if err != nil {
				b.Fatal(err)
			}
			client := srv.Client()
			claim := func(i int) {
				body := fmt.Sprintf(`{"key":"bench-%d","payload":{"bench":"bench-%d"}}`, i, i)
				req, _ := http.NewRequest("POST", srv.URL+"/v1/runs/claim", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer "+key)
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				if resp.StatusCode != http.StatusCreated {
					b.Fatalf("claim %d: %d", i, resp.StatusCode)
				}
			}
			claim(-1) // the key cache and the prepared statements
			b.ReportAllocs()
			cpu0 := processCPU(b)
			b.ResetTimer()
			for i := range b.N {
				claim(i)
			}
			b.StopTimer()
			// The process's user+sys time per claim (client, server and, on SQLite, the
			// database): steadier than ns/op on a shared machine, where the wall clock
			// waits for other work.
			b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}
