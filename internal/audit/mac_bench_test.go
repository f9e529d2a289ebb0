package audit_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/postgres"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// BenchmarkClaimSealed measures a claim (a new run and its claimed event) without and
// with the audit key: the MAC itself, and on PostgreSQL the transaction the keyed claim
// runs as instead of one statement.
func BenchmarkClaimSealed(b *testing.B) {
	key, err := store.NewAuditKey()
	if err != nil {
		b.Fatal(err)
	}
	for _, keyed := range []bool{false, true} {
		backends := storetest.Backends
		name := "unkeyed"
		if keyed {
			backends, name = storetest.KeyedBackends(key), "keyed"
		}
		for _, be := range backends {
			b.Run(be.Name+"/"+name, func(b *testing.B) {
				if be.Name == "postgres" {
					storetest.PostgresURL(b)
				}
				st := be.Open(b, nil)
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					if _, err := st.Claim(ctx, store.ClaimParams{RunClaimParams: store.RunClaimParams{Key: fmt.Sprintf("b-%d", i),
						PayloadHash: "h", Owner: "o", Lease: time.Minute}, Actor: "apikey:bench", AlertAfter: 3}); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkChainFirstKeyed measures the look-up verify runs once per invocation to learn
// where the keyed trail begins: it walks the events from the first id to the first one
// with a MAC, so it costs in proportion to the history written before the audit key was
// set (200,000 unkeyed events of 1,000 runs here, then one keyed event). There is no
// index on events.mac; a partial one would need a migration.
func BenchmarkChainFirstKeyed(b *testing.B) {
	key, err := store.NewAuditKey()
	if err != nil {
		b.Fatal(err)
	}
	const unkeyed = 200_000
	for _, be := range storetest.KeyedBackends(key) {
		b.Run(be.Name, func(b *testing.B) {
			if be.Name == "postgres" {
				storetest.PostgresURL(b)
			}
			st := be.Open(b, nil)
			// Written around the store (no MAC), as events from before the key look.
			if _, ok := st.(*postgres.Store); ok {
				storetest.ExecRaw(b, st, `INSERT INTO events (run_key, at, kind) SELECT 'r-' || (g % 1000), now(), 'note' FROM generate_series(1, $1) g`, unkeyed)
				storetest.ExecRaw(b, st, `ANALYZE events`)
			} else {
				storetest.ExecRaw(b, st, `WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ?)
					INSERT INTO events (run_key, at, kind) SELECT 'r-' || (n % 1000), ?, 'note' FROM g`, unkeyed, time.Now().UnixMicro())
				storetest.ExecRaw(b, st, `ANALYZE`)
			}
			ev, err := st.EventInsert(ctx, store.EventInsertParams{RunKey: "keyed", Kind: "note", Actor: "a"})
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for b.Loop() {
				if id, err := st.ChainFirstKeyed(ctx); err != nil || id != ev.ID {
					b.Fatalf("first keyed %d, want %d: %v", id, ev.ID, err)
				}
			}
		})
	}
}
