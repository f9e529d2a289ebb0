package scale_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/scale"
)

// BenchmarkConsoleScale measures the console's three lists and the runs list of every
// state (scale.RunLists), a first page each, on PostgreSQL holding generated history,
// beside an empty database, call by call in turn, and reports each database's mean and
// their ratio (history/empty; 1 is "as fast as empty"). Before measuring it records the
// statements each list sends on the big database and EXPLAINs them with their
// arguments: a sequential scan of a big table fails it. It runs only
// when AIRLOCK_CONSOLE_SCALE_RUNS is set:
//
//	AIRLOCK_CONSOLE_SCALE_RUNS=1000000 bash scripts/with-postgres.sh go test ./internal/scale -run '^$' -bench ConsoleScale -benchtime 200x
func BenchmarkConsoleScale(b *testing.B) {
	if os.Getenv("AIRLOCK_CONSOLE_SCALE_RUNS") == "" {
		b.Skip("AIRLOCK_CONSOLE_SCALE_RUNS not set")
	}
	runsN := envInt(b, "AIRLOCK_CONSOLE_SCALE_RUNS", 1_000_000)
	ctx := context.Background()
	rec := &sqlRecorder{seen: map[string]bool{}}
	empty, big := openScale(b, 0, 0), openScaleTraced(b, runsN, runsN, rec)
	for _, env := range []*scaleEnv{empty, big} {
		// What the lists show: 60 of each, beside the history they must not read.
		if _, err := env.st.Pool().Exec(ctx, `
			INSERT INTO workflow_runs (idempotency_key, state, payload_hash, lease_owner, version, created_at, updated_at, park_reason)
			SELECT 'parked-' || i, 'awaiting_human', md5(i::text), 'o', 2, now(), now() - i * interval '1 second', 'unknown_commit'
			FROM generate_series(1, 60) i;
			INSERT INTO effects (id, idempotency_key, effect_id, action_type, target, executor, payload_hash, state, attempts, not_before, created_at, updated_at)
			SELECT 'unk-' || i, 'parked-' || i, 'e', 'note', 'default', 'dispatcher', 'h', 'unknown', 1, now(), now(), now() - i * interval '1 second'
			FROM generate_series(1, 60) i;
			INSERT INTO approvals (id, idempotency_key, token_hash, mode, allowed_decisions, expires_at, requested_by, approver_roles,
			  approver_subjects, separation_of_duties, action_type, target, effect_id, executor, payload_hash, created_at)
			SELECT 'pend-' || i, 'parked-' || i, md5('p' || i), 'approve_before_act', 'approve,reject', now() + interval '1 day', 'x',
			  'support-lead', '', true, 'email', 'default', 'e', 'dispatcher', 'h', now() - i * interval '1 second'
			FROM generate_series(1, 60) i;
			ANALYZE`); err != nil {
			b.Fatal(err)
		}
	}
	now := time.Now()
	for _, op := range append(scale.ConsoleLists(&now), scale.RunLists(&now)...) {
		rec.mu.Lock()
		rec.on, rec.stmts = true, nil
		rec.mu.Unlock()
		if n, err := op.Run(context.WithValue(ctx, scale.OpKey{}, op.Name), big.st); err != nil || n == 0 {
			b.Fatalf("%s: %d rows, %v", op.Name, n, err)
		}
		rec.mu.Lock()
		rec.on = false
		stmts := rec.stmts
		rec.mu.Unlock()
		if n, _, _ := explainNoSeqScan(b, big.st, stmts); n == 0 {
			b.Fatalf("%s: no statement recorded", op.Name)
		}
		b.Run(op.Name, func(b *testing.B) {
			var took [2]time.Duration
			for range b.N {
				for i, env := range []*scaleEnv{empty, big} {
					start := time.Now()
					if n, err := op.Run(ctx, env.st); err != nil || n == 0 {
						b.Fatalf("%s: %d rows, %v", op.Name, n, err)
					}
					took[i] += time.Since(start)
				}
			}
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(took[0].Seconds()*1000/float64(b.N), "empty-ms/page")
			b.ReportMetric(took[1].Seconds()*1000/float64(b.N), "history-ms/page")
			b.ReportMetric(float64(took[1])/float64(took[0]), "history/empty")
		})
	}
}
