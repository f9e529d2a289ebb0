package storetest_test

import (
	"context"
	"testing"

	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// BenchmarkEventPages reads a run's 1,000 events 100 at a time, the way GET
// /v1/runs/{key}/events and explain page through a timeline.
func BenchmarkEventPages(b *testing.B) {
	ctx := context.Background()
	storetest.EachB(b, func(b *testing.B, be storetest.Backend) {
		st := be.Open(b, nil)
		err := st.Transact(ctx, func(q store.Queries) error {
			for range 1000 {
				if _, err := q.EventInsert(ctx, store.EventInsertParams{RunKey: "paged", Kind: "heartbeat"}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for range b.N {
			n := 0
			for after := int64(0); ; {
				evs, err := st.EventList(ctx, "paged", after, 100)
				if err != nil {
					b.Fatal(err)
				}
				n += len(evs)
				if len(evs) < 100 {
					break
				}
				after = evs[len(evs)-1].ID
			}
			if n != 1000 {
				b.Fatalf("paged %d events", n)
			}
		}
	})
}
