package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/airlockhq/airlock/internal/store"
)

// guardLevel refuses pending migrations that raise the writer level while live
// lower-level instances are registered (store.LevelGuard). Before the refusal is decided
// it locks instances against heartbeats (SHARE: their upserts wait until the migration
// commits, then read the raised level), so no instance registers unseen in between.
func guardLevel(ctx context.Context, db dbtx, pending []store.Migration, p store.MigrateParams) error {
	var hasLevel bool
	if err := db.QueryRow(ctx, `SELECT to_regclass('writer_level') IS NOT NULL AND to_regclass('instances') IS NOT NULL`).Scan(&hasLevel); err != nil {
		return fmt.Errorf("read the writer level: %w", err)
	}
	current := 0
	if hasLevel {
		if _, err := db.Exec(ctx, `LOCK TABLE instances IN SHARE MODE`); err != nil {
			return fmt.Errorf("lock instances: %w", err)
		}
		if err := db.QueryRow(ctx, `SELECT level FROM writer_level`).Scan(&current); err != nil {
			return fmt.Errorf("read the writer level: %w", err)
		}
	}
	return store.LevelGuard(pending, current, p, func() ([]store.Instance, error) {
		if !hasLevel {
			return nil, nil // nothing registers before 0027
		}
		return listInstances(ctx, db, `WHERE last_seen >= coalesce($1::timestamptz, now()) - $2::bigint * interval '1 microsecond'`,
			p.Now, store.InstanceLiveWithin.Microseconds())
	})
}

const instanceColumns = `id, hostname, pid, version, level, role, dispatch, started_at, last_seen`

func listInstances(ctx context.Context, db dbtx, where string, args ...any) ([]store.Instance, error) {
	rows, err := db.Query(ctx, `SELECT `+instanceColumns+` FROM instances `+where+` ORDER BY started_at DESC, id`, args...)
	if err != nil {
		return nil, fmt.Errorf("list instances: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Instance, error) {
		var in store.Instance
		err := r.Scan(&in.ID, &in.Hostname, &in.PID, &in.Version, &in.Level, &in.Role, &in.Dispatch, &in.StartedAt, &in.LastSeen)
		return in, err
	})
	if err != nil {
		return nil, fmt.Errorf("list instances: %w", err)
	}
	return out, nil
}

func (s *Store) WriterLevelGet(ctx context.Context) (int, error) {
	var n int
	if err := s.db.QueryRow(ctx, `SELECT level FROM writer_level`).Scan(&n); err != nil {
		return 0, fmt.Errorf("read the writer level: %w", err)
	}
	return n, nil
}

func (s *Store) InstanceHeartbeat(ctx context.Context, in store.Instance, now *time.Time) (int, error) {
	var level int
	err := s.Transact(ctx, func(q store.Queries) error {
		db := q.(queries).db
		// The upsert first: while a level-raising migration holds instances locked it
		// waits, and the level read after it sees the migration's commit.
		if _, err := db.Exec(ctx, `INSERT INTO instances (`+instanceColumns+`)
			VALUES ($1, $2, $3, $4, $5, $6, $7, coalesce($8::timestamptz, now()), coalesce($8::timestamptz, now()))
			ON CONFLICT (id) DO UPDATE SET last_seen = EXCLUDED.last_seen, level = EXCLUDED.level, dispatch = EXCLUDED.dispatch`,
			in.ID, in.Hostname, in.PID, in.Version, in.Level, in.Role, in.Dispatch, now); err != nil {
			return fmt.Errorf("instance heartbeat: %w", err)
		}
		if _, err := db.Exec(ctx, `DELETE FROM instances WHERE last_seen < coalesce($1::timestamptz, now()) - interval '1 day'`, now); err != nil {
			return fmt.Errorf("instance heartbeat: %w", err)
		}
		if err := db.QueryRow(ctx, `SELECT level FROM writer_level`).Scan(&level); err != nil {
			return fmt.Errorf("instance heartbeat: read the writer level: %w", err)
		}
		return nil
	})
	return level, err
}

func (s *Store) InstanceDeregister(ctx context.Context, id string) error {
	if _, err := s.db.Exec(ctx, `DELETE FROM instances WHERE id = $1`, id); err != nil {
		return fmt.Errorf("deregister instance %q: %w", id, err)
	}
	return nil
}

func (s *Store) InstanceList(ctx context.Context, seenSince time.Time) ([]store.Instance, error) {
	if seenSince.IsZero() {
		return listInstances(ctx, s.db, ``)
	}
	return listInstances(ctx, s.db, `WHERE last_seen >= $1`, seenSince)
}
