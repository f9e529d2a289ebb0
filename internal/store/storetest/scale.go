package storetest

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Scale is how much history GenerateScale writes: finished runs (each with one sent
// effect), their events, a validation per 10 runs and an approval per 100. It is history
// as retention leaves it: payloads and results already purged, every event older than
// a week (outside the report's default window) and younger than 390 days (inside the
// default 400-day retention).
type Scale struct {
	Runs   int
	Events int
	// End is the time of the newest generated run; its events follow it by seconds.
	End time.Time
}

// genKinds are the generated events' kinds, in turn: mostly the lifecycle, some of the
// kinds the report reads one by one.
const genKinds = `ARRAY['claimed', 'effect_queued', 'effect_completed', 'transition', 'duplicate',
	'heartbeat', 'claimed', 'effect_queued', 'effect_completed', 'validation', 'transition', 'alert',
	'approval_requested', 'approval_decided', 'effect_failed', 'effect_reconciled']`

// GenerateScale writes s into the PostgreSQL database of pool, in SQL (generate_series),
// then VACUUM ANALYZEs it. It loads with session_replication_role = replica, which skips
// the foreign keys and the effect counters' trigger (it adds its effects to the counters
// itself): it needs a superuser, as the test server's is. Progress goes to logf.
func GenerateScale(ctx context.Context, pool *pgxpool.Pool, s Scale, logf func(format string, args ...any)) error {
	r, e := s.Runs, s.Events
	runTime := func(i string) string { // run i's time: spread over the 380 days before End
		return fmt.Sprintf(`($1::timestamptz - (%d - %s)::float8 / %d * interval '380 days')`, r, i, r)
	}
	steps := []struct{ what, sql string }{
		{"runs", fmt.Sprintf(`INSERT INTO workflow_runs (idempotency_key, state, payload_hash, lease_owner, version,
			created_at, updated_at, action_type)
			SELECT 'gen-' || i, 'completed', md5(i::text), 'gen-owner', 3, %[1]s, %[1]s, 'note'
			FROM generate_series(1, %[2]d) i`, runTime("i"), r)},
		{"effects", fmt.Sprintf(`INSERT INTO effects (id, idempotency_key, effect_id, action_type, target, executor,
			payload_hash, state, provider_id, attempts, not_before, created_at, updated_at)
			SELECT 'gen-e-' || i, 'gen-' || i, 'note-gen', 'note', 'default', 'dispatcher', md5(i::text),
			  'completed', 'p-' || i, 1, %[1]s, %[1]s, %[1]s
			FROM generate_series(1, %[2]d) i`, runTime("i"), r)},
		{"effect counters", fmt.Sprintf(`INSERT INTO effect_counts AS c (state, n) VALUES ('completed', %d)
			ON CONFLICT (state) DO UPDATE SET n = c.n + EXCLUDED.n`, r)},
		{"validations", fmt.Sprintf(`INSERT INTO validations (idempotency_key, action_type, valid, repaired, output_hash, created_at)
			SELECT 'gen-' || i, 'note', true, false, md5(i::text), %[1]s
			FROM generate_series(1, %[2]d, 10) i`, runTime("i"), r)},
		{"approvals", fmt.Sprintf(`INSERT INTO approvals (id, idempotency_key, token_hash, mode, allowed_decisions, expires_at,
			consumed_at, decision, approver_subject, requested_by, approver_roles, approver_subjects,
			separation_of_duties, action_type, target, effect_id, executor, payload_hash, created_at)
			SELECT 'gen-a-' || i, 'gen-' || i, md5('a' || i), 'approve_before_act', 'approve,reject', %[1]s + interval '1 hour',
			  %[1]s, 'approve', 'lead', 'apikey:gen', 'support-lead', '', true, 'note', 'default', 'note-gen',
			  'dispatcher', md5(i::text), %[1]s
			FROM generate_series(1, %[2]d, 100) i`, runTime("i"), r)},
		{"events", fmt.Sprintf(`INSERT INTO events (run_key, at, kind, version, actor, detail)
			SELECT 'gen-' || (j %% %[2]d + 1), %[1]s + (j / %[2]d) * interval '1 second',
			  (%[3]s)[1 + (j / %[2]d) %% 16], 1, 'gen', '{"valid": true, "alert": "lease_reclaims"}'::jsonb
			FROM generate_series(0, %[4]d - 1) j`, runTime(fmt.Sprintf("(j %% %d + 1)", r)), r, genKinds, e)},
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	// Bulk load: no triggers or foreign keys (session_replication_role), and the tables'
	// secondary indexes dropped for the load and built again after it, which is many
	// times faster than maintaining them row by row.
	for _, set := range []string{`SET session_replication_role = replica`, `SET maintenance_work_mem = '256MB'`} {
		if _, err := conn.Exec(ctx, set); err != nil {
			return fmt.Errorf("generate: %w", err)
		}
	}
	defer func() { _, _ = conn.Exec(context.Background(), `RESET session_replication_role`) }()
	rows, err := conn.Query(ctx, `SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid) FROM pg_index i
		WHERE i.indrelid = ANY(ARRAY['workflow_runs', 'effects', 'validations', 'approvals', 'events']::regclass[])
		  AND NOT EXISTS (SELECT FROM pg_constraint c WHERE c.conindid = i.indexrelid)`)
	if err != nil {
		return fmt.Errorf("generate: %w", err)
	}
	var names, defs []string
	for rows.Next() {
		var name, def string
		if err := rows.Scan(&name, &def); err != nil {
			return err
		}
		names, defs = append(names, name), append(defs, def)
	}
	rows.Close()
	for _, name := range names {
		if _, err := conn.Exec(ctx, `DROP INDEX `+name); err != nil {
			return fmt.Errorf("generate: %w", err)
		}
	}
	for _, st := range steps {
		start := time.Now()
		var args []any
		if strings.Contains(st.sql, "$1") {
			args = append(args, s.End)
		}
		if _, err := conn.Exec(ctx, st.sql, args...); err != nil {
			return fmt.Errorf("generate %s: %w", st.what, err)
		}
		logf("generated %s in %v", st.what, time.Since(start).Round(time.Millisecond))
	}
	start := time.Now()
	for _, def := range defs {
		if _, err := conn.Exec(ctx, def); err != nil {
			return fmt.Errorf("generate: %s: %w", def, err)
		}
	}
	logf("built %d indexes in %v", len(defs), time.Since(start).Round(time.Millisecond))
	start = time.Now()
	if _, err := conn.Exec(ctx, `VACUUM ANALYZE workflow_runs, effects, effect_counts, validations, approvals, events`); err != nil {
		return fmt.Errorf("vacuum analyze: %w", err)
	}
	logf("vacuum analyze in %v", time.Since(start).Round(time.Millisecond))
	return nil
}
