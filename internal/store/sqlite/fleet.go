package sqlite

import (
	"context"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

// guardLevel refuses pending migrations that raise the writer level while live
// lower-level instances are registered (store.LevelGuard). The migration's IMMEDIATE
// transaction holds the write lock: no heartbeat registers in between, and each after it
// reads the raised level.
func (s *Store) guardLevel(ctx context.Context, db dbtx, pending []store.Migration, p store.MigrateParams) error {
	var tables int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN ('writer_level', 'instances')`).Scan(&tables); err != nil {
		return fmt.Errorf("read the writer level: %w", err)
	}
	current := 0
	if tables == 2 {
		if err := db.QueryRowContext(ctx, `SELECT level FROM writer_level`).Scan(&current); err != nil {
			return fmt.Errorf("read the writer level: %w", err)
		}
	}
	return store.LevelGuard(pending, current, p, func() ([]store.Instance, error) {
		if tables != 2 {
			return nil, nil // nothing registers before 0027
		}
		now := s.now()
		if p.Now != nil {
			now = *p.Now
		}
		return listInstances(ctx, db, `WHERE last_seen >= ?`, now.Add(-store.InstanceLiveWithin).UnixMicro())
	})
}

const instanceColumns = `id, hostname, pid, version, level, role, dispatch, started_at, last_seen`

func listInstances(ctx context.Context, db dbtx, where string, args ...any) ([]store.Instance, error) {
	out, err := selectAll(ctx, db, func(r scanner) (store.Instance, error) {
		var in store.Instance
		var started, seen int64
		err := r.Scan(&in.ID, &in.Hostname, &in.PID, &in.Version, &in.Level, &in.Role, &in.Dispatch, &started, &seen)
		in.StartedAt, in.LastSeen = fromMicros(started), fromMicros(seen)
		return in, err
	}, `SELECT `+instanceColumns+` FROM instances `+where+` ORDER BY started_at DESC, id`, args...)
	if err != nil {
		return nil, fmt.Errorf("list instances: %w", err)
	}
	return out, nil
}

func (s *Store) WriterLevelGet(ctx context.Context) (int, error) {
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT level FROM writer_level`).Scan(&n); err != nil {
		return 0, fmt.Errorf("read the writer level: %w", err)
	}
	return n, nil
}

func (s *Store) InstanceHeartbeat(ctx context.Context, in store.Instance, now *time.Time) (int, error) {
	at := s.now()
	if now != nil {
		at = *now
	}
	var level int
	err := s.Transact(ctx, func(q store.Queries) error {
		db := q.(queries).db
		if _, err := db.ExecContext(ctx, `INSERT INTO instances (`+instanceColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (id) DO UPDATE SET last_seen = excluded.last_seen, level = excluded.level, dispatch = excluded.dispatch`,
			in.ID, in.Hostname, in.PID, in.Version, in.Level, in.Role, in.Dispatch, at.UnixMicro(), at.UnixMicro()); err != nil {
			return fmt.Errorf("instance heartbeat: %w", err)
		}
		if _, err := db.ExecContext(ctx, `DELETE FROM instances WHERE last_seen < ?`, at.Add(-24*time.Hour).UnixMicro()); err != nil {
			return fmt.Errorf("instance heartbeat: %w", err)
		}
		if err := db.QueryRowContext(ctx, `SELECT level FROM writer_level`).Scan(&level); err != nil {
			return fmt.Errorf("instance heartbeat: read the writer level: %w", err)
		}
		return nil
	})
	return level, err
}

func (s *Store) InstanceDeregister(ctx context.Context, id string) error {
	return s.Transact(ctx, func(q store.Queries) error {
		if _, err := q.(queries).db.ExecContext(ctx, `DELETE FROM instances WHERE id = ?`, id); err != nil {
			return fmt.Errorf("deregister instance %q: %w", id, err)
		}
		return nil
	})
}

func (s *Store) InstanceList(ctx context.Context, seenSince time.Time) ([]store.Instance, error) {
	if seenSince.IsZero() {
		return listInstances(ctx, s.db, ``)
	}
	return listInstances(ctx, s.db, `WHERE last_seen >= ?`, seenSince.UnixMicro())
}
