package postgres_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/store/postgres"
	"github.com/airlockhq/airlock/internal/store/storetest"
)

// BenchmarkOutcomeStatement times EffectUpdateManyLocked for a group of g effects of
// runs claimed by the claim statement (heads in their rows), perRun effects per run, one
// event per effect. Setup (claims, effects, leases) is outside the timer.
func BenchmarkOutcomeStatement(b *testing.B) {
	for _, c := range []struct{ g, perRun int }{{1, 1}, {32, 1}, {32, 8}} {
		b.Run(fmt.Sprintf("group=%d/perRun=%d", c.g, c.perRun), func(b *testing.B) {
			st := storetest.OpenPostgres(b, nil).(*postgres.Store)
			ctx := context.Background()
			type group struct {
				ps  []store.EffectUpdateParams
				evs [][]store.EventInsertParams
			}
			groups := make([]group, b.N)
			for i := range b.N {
				owner := fmt.Sprintf("o%d", i)
				for r := range c.g / c.perRun {
					key := fmt.Sprintf("b%d-%d", i, r)
					if _, err := st.Claim(ctx, store.ClaimParams{RunClaimParams: store.RunClaimParams{Key: key, PayloadHash: "h",
						Owner: "client", Lease: time.Hour}, Actor: "api", AlertAfter: 100}); err != nil {
						b.Fatal(err)
					}
					for k := range c.perRun {
						id := fmt.Sprintf("%s-%d", key, k)
						if _, _, err := st.EffectInsert(ctx, store.Effect{ID: id, RunKey: key, EffectID: id,
							ActionType: "t", Target: "x", Executor: store.ExecutorDispatcher, Payload: json.RawMessage(`{}`), PayloadHash: "h",
							State: store.EffectPending}); err != nil {
							b.Fatal(err)
						}
						pid := "p-" + id
						groups[i].ps = append(groups[i].ps, store.EffectUpdateParams{ID: id, From: []store.EffectState{store.EffectSending},
							Owner: owner, To: store.EffectCompleted, ProviderID: &pid})
						groups[i].evs = append(groups[i].evs, []store.EventInsertParams{{RunKey: key, Kind: "effect_completed", Actor: "airlock",
							Detail: json.RawMessage(`{"effect_id": "` + id + `", "provider_id": "` + pid + `", "state": "completed"}`)}})
					}
				}
				err := st.Transact(ctx, func(q store.Queries) error {
					got, err := q.EffectLease(ctx, store.EffectLeaseParams{Executor: store.ExecutorDispatcher, Caps: map[string]int{"t": c.g},
						Owner: owner, Lease: time.Hour, Limit: c.g})
					if err == nil && len(got) != c.g {
						err = fmt.Errorf("leased %d", len(got))
					}
					return err
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			if _, err := st.Pool().Exec(ctx, `VACUUM ANALYZE workflow_runs, effects, events`); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := range b.N {
				_, applied, err := st.EffectUpdateManyLocked(ctx, groups[i].ps, groups[i].evs)
				if err != nil || !applied[len(applied)-1] {
					b.Fatal(applied, err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*c.g), "µs/effect")
		})
	}
}
