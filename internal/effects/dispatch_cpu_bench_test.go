package effects_test

import (
	"context"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/airlockhq/airlock/internal/effects"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// BenchmarkDispatchCPU is BenchmarkDispatch's airlock_1 and raw_sql_http on SQLite
// measured in CPU rather than wall time: user+sys of this process — on SQLite
// the database runs in it — over the drain alone, per effect (cpu-µs/effect). Both sides
// share the in-process no-op provider, so its cost is in both. Wall-clock figures on a
// shared machine swing; CPU per effect does not.
//
//	go test ./internal/effects -run '^$' -bench DispatchCPU -benchtime 3000x
func BenchmarkDispatchCPU(b *testing.B) {
	for _, be := range storetest.Backends {
		if be.Name != "sqlite" {
			continue // PostgreSQL's CPU is the cluster's: scripts/bench-cpu.sh measures it
		}
		b.Run(be.Name+"/airlock_1", func(b *testing.B) { dispatchCPU(b, be, true) })
		b.Run(be.Name+"/raw_sql_http", func(b *testing.B) { dispatchCPU(b, be, false) })
	}
}

func dispatchCPU(b *testing.B, be storetest.Backend, airlock bool) {
	e := newDispatchEnv(b, be)
	e.seed(b, b.N)
	ctx, cancel := context.WithTimeout(context.Background(), dispatchTimeout)
	defer cancel()
	var r rawDispatch
	if !airlock {
		r = newRawDispatch(b, e.Store)
	}
	b.ResetTimer()
	cpu0 := selfCPU(b)
	if airlock {
		d := &effects.Dispatcher{Service: e.effects, BatchSize: dispatchBatch, Lease: dispatchLease, Interval: 10 * time.Millisecond}
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				n, err := d.Tick(ctx)
				if err != nil {
					b.Error(err)
					return
				}
				if n == 0 {
					return
				}
			}
		})
		wg.Wait()
	} else {
		for {
			owner := "raw:" + uuid.NewString()
			batch, err := r.lease(ctx, owner)
			if err != nil {
				b.Fatalf("raw lease: %v", err)
			}
			if len(batch) == 0 {
				break
			}
			for _, fx := range batch {
				id, err := rawPost(ctx, e.provider.client, e.provider.notesURL(), fx)
				if err != nil {
					b.Fatalf("raw send %s: %v", fx.id, err)
				}
				if err := r.complete(ctx, fx.id, id, owner); err != nil {
					b.Fatalf("raw complete: %v", err)
				}
			}
		}
	}
	cpu := selfCPU(b) - cpu0
	b.StopTimer()
	counts, err := e.Store.EffectCountByState(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	if counts[store.EffectCompleted] != b.N || len(counts) != 1 {
		b.Fatalf("effects by state after dispatch: %v, want %d completed", counts, b.N)
	}
	if got := e.provider.requests.Load(); got != int64(b.N) {
		b.Fatalf("provider got %d requests, want %d", got, b.N)
	}
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/effect")
}

func selfCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
