package storetest_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

// TestConsoleScale measures the console's three lists (a first page of 51 rows) on
// PostgreSQL holding generated history, beside an empty database, and prints each
// query's plan. It runs only when AIRLOCK_CONSOLE_SCALE_RUNS is set:
//
//	AIRLOCK_CONSOLE_SCALE_RUNS=1000000 bash scripts/with-postgres.sh go test ./internal/store/storetest -run TestConsoleScale -v
func TestConsoleScale(t *testing.T) {
	if os.Getenv("AIRLOCK_CONSOLE_SCALE_RUNS") == "" {
		t.Skip("AIRLOCK_CONSOLE_SCALE_RUNS not set")
	}
	runsN := envInt(t, "AIRLOCK_CONSOLE_SCALE_RUNS", 1_000_000)
	ctx := context.Background()
	empty, big := openScale(t, 0, 0), openScale(t, runsN, runsN)
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
			t.Fatal(err)
		}
	}
	now := time.Now()
	ops := []struct {
		name, explain string
		run           func(st store.Store) (int, error)
	}{
		{"parked runs", `SELECT idempotency_key FROM workflow_runs WHERE state = 'awaiting_human' AND park_reason IN ('unknown_commit', 'input_mismatch')
			ORDER BY updated_at DESC, idempotency_key DESC LIMIT 51`,
			func(st store.Store) (int, error) {
				r, err := st.RunsParked(ctx, store.Cursor{}, 51)
				return len(r), err
			}},
		{"unknown effects", `SELECT id FROM effects WHERE state IN ('unknown', 'failed') AND state = 'unknown' ORDER BY state, updated_at, id LIMIT 51`,
			func(st store.Store) (int, error) {
				r, err := st.EffectsInState(ctx, store.EffectUnknown, store.Cursor{}, 51)
				return len(r), err
			}},
		{"pending approvals", `SELECT id FROM approvals WHERE consumed_at IS NULL AND mode <> 'review' AND expires_at > now() ORDER BY created_at DESC, id DESC LIMIT 100`,
			func(st store.Store) (int, error) {
				r, err := st.ApprovalsPending(ctx, store.Cursor{}, &now, 100)
				return len(r), err
			}},
	}
	fmt.Printf("\nconsole lists: PostgreSQL, %d finished runs / %d sent effects / %d decided approvals of history vs empty (median of 200, first page)\n", runsN, runsN, runsN/100)
	for _, op := range ops {
		var med [2]time.Duration
		for i, env := range []*scaleEnv{empty, big} {
			var ds []time.Duration
			for range 200 {
				start := time.Now()
				n, err := op.run(env.st)
				if err != nil || n == 0 {
					t.Fatalf("%s: %d rows, %v", op.name, n, err)
				}
				ds = append(ds, time.Since(start))
			}
			slices.Sort(ds)
			med[i] = ds[len(ds)/2]
		}
		var plan []string
		rows, err := big.st.Pool().Query(ctx, "EXPLAIN "+op.explain)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var line string
			_ = rows.Scan(&line)
			plan = append(plan, strings.TrimSpace(line))
		}
		rows.Close()
		fmt.Printf("%-18s empty %8.3f ms   history %8.3f ms   plan: %s\n", op.name, med[0].Seconds()*1000, med[1].Seconds()*1000, strings.Join(plan, " | "))
	}
}
