package audit_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/store"
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
