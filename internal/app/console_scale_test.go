package app_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

// BenchmarkConsoleScale measures the console's three lists (a first page) on PostgreSQL
// holding generated history, beside an empty database, call by call in turn, and reports
// each database's mean and their ratio (history/empty; 1 is "as fast as empty"). Before
// measuring it records the statements each list sends on the big database and EXPLAINs
// them with their arguments: a sequential scan of a big table fails it. It runs only
// when AIRLOCK_CONSOLE_SCALE_RUNS is set:
//
//	AIRLOCK_CONSOLE_SCALE_RUNS=1000000 bash scripts/with-postgres.sh go test ./internal/app -run '^$' -bench ConsoleScale -benchtime 200x
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
	for _, op := range consoleLists(&now) {
		rec.mu.Lock()
		rec.on, rec.stmts = true, nil
		rec.mu.Unlock()
		if n, err := op.run(context.WithValue(ctx, opKey{}, op.name), big.st); err != nil || n == 0 {
			b.Fatalf("%s: %d rows, %v", op.name, n, err)
		}
		rec.mu.Lock()
		rec.on = false
		stmts := rec.stmts
		rec.mu.Unlock()
		if n, _ := explainNoSeqScan(b, big.st, stmts); n == 0 {
			b.Fatalf("%s: no statement recorded", op.name)
		}
		b.Run(op.name, func(b *testing.B) {
			var took [2]time.Duration
			for range b.N {
				for i, env := range []*scaleEnv{empty, big} {
					start := time.Now()
					if n, err := op.run(ctx, env.st); err != nil || n == 0 {
						b.Fatalf("%s: %d rows, %v", op.name, n, err)
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

// consoleList is one of the console's lists, read as its first page.
type consoleList struct {
	name string
	run  func(ctx context.Context, st store.Store) (int, error)
}

// consoleLists are the console's three lists; pending approvals are those unexpired at now.
func consoleLists(now *time.Time) []consoleList {
	return []consoleList{
		{"parked runs", func(ctx context.Context, st store.Store) (int, error) {
			r, err := st.RunsParked(ctx, store.Cursor{}, 51)
			return len(r), err
		}},
		{"unknown effects", func(ctx context.Context, st store.Store) (int, error) {
			r, err := st.EffectsInState(ctx, store.EffectUnknown, store.Cursor{}, 51)
			return len(r), err
		}},
		{"pending approvals", func(ctx context.Context, st store.Store) (int, error) {
			r, err := st.ApprovalsPending(ctx, store.Cursor{}, now, 100)
			return len(r), err
		}},
	}
}
