package postgres

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/airlockhq/airlock/internal/store"
)

const userColumns = `id, name, password_hash, roles, created_at, disabled_at`

func scanUser(row pgx.Row) (store.User, error) {
	var u store.User
	var roles string
	if err := row.Scan(&u.ID, &u.Name, &u.PasswordHash, &roles, &u.CreatedAt, &u.DisabledAt); err != nil {
		return store.User{}, interpret(err)
	}
	u.Roles = splitList(roles)
	return u, nil
}

func (q queries) UserList(ctx context.Context) ([]store.User, error) {
	rows, err := q.db.Query(ctx, `SELECT `+userColumns+` FROM users ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list users: %w", err)
	}
	defer rows.Close()
	var out []store.User
	for rows.Next() {
		u, err := scanUser(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, rows.Err()
}

func (q queries) UserUpdate(ctx context.Context, p store.UserUpdateParams) (store.User, error) {
	var roles *string
	if p.Roles != nil {
		r := strings.Join(p.Roles, ",")
		roles = &r
	}
	// $4: NULL leaves disabled_at; true sets it (to $5 or now) unless already set; false clears it.
	// The database's now is read first: Citus refuses a function that is not IMMUTABLE
	// inside the CASE of an UPDATE (users is a reference table there).
	disabledAt := p.DisabledAt
	if p.Disabled != nil && *p.Disabled && disabledAt == nil {
		var now time.Time
		if err := q.db.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
			return store.User{}, err
		}
		disabledAt = &now
	}
	u, err := scanUser(q.db.QueryRow(ctx, `
		UPDATE users SET roles = coalesce($2, roles), password_hash = coalesce($3, password_hash),
		  disabled_at = CASE WHEN $4::boolean IS NULL THEN disabled_at
		                     WHEN $4 THEN coalesce(disabled_at, $5::timestamptz)
		                     ELSE NULL END
		WHERE name = $1
		RETURNING `+userColumns, p.Name, roles, p.PasswordHash, p.Disabled, disabledAt))
	if err != nil {
		return store.User{}, err
	}
	if _, err := q.SessionsEndForUser(ctx, u.ID); err != nil {
		return store.User{}, err
	}
	return u, nil
}

func (q queries) UserDelete(ctx context.Context, name string) error {
	var id string
	if err := q.db.QueryRow(ctx, `DELETE FROM users WHERE name = $1 RETURNING id`, name).Scan(&id); err != nil {
		return interpret(err)
	}
	_, err := q.SessionsEndForUser(ctx, id)
	return err
}

func (q queries) SessionsEndForUser(ctx context.Context, userID string) (int64, error) {
	tag, err := q.db.Exec(ctx, `DELETE FROM sessions WHERE user_id = $1`, userID)
	if err != nil {
		return 0, fmt.Errorf("end sessions: %w", err)
	}
	return tag.RowsAffected(), nil
}

func (q queries) SecretGet(ctx context.Context, name string) ([]byte, error) {
	var v []byte
	err := q.db.QueryRow(ctx, `SELECT value FROM site_secrets WHERE name = $1`, name).Scan(&v)
	return v, interpret(err)
}

func (q queries) ThrottleGet(ctx context.Context, key string, now *time.Time) (store.Throttle, time.Time, error) {
	var at time.Time
	var k *string
	var failures *int
	var next, updated *time.Time
	err := q.db.QueryRow(ctx, `SELECT coalesce($2::timestamptz, now()), key, failures, next_at, updated_at
		FROM (SELECT 1) one LEFT JOIN signin_throttle ON key = $1`, key, now).Scan(&at, &k, &failures, &next, &updated)
	if err != nil {
		return store.Throttle{}, time.Time{}, fmt.Errorf("read sign-in throttle: %w", err)
	}
	if k == nil {
		return store.Throttle{}, at, nil
	}
	return store.Throttle{Key: *k, Failures: *failures, NextAt: *next, UpdatedAt: *updated}, at, nil
}

func (q queries) ThrottleLock(ctx context.Context, key string, now *time.Time) (store.Throttle, time.Time, error) {
	if _, err := q.db.Exec(ctx, `INSERT INTO signin_throttle (key, failures, next_at, updated_at)
		VALUES ($1, 0, coalesce($2::timestamptz, now()), coalesce($2::timestamptz, now())) ON CONFLICT (key) DO NOTHING`, key, now); err != nil {
		return store.Throttle{}, time.Time{}, fmt.Errorf("lock sign-in throttle: %w", err)
	}
	var t store.Throttle
	var at time.Time
	err := q.db.QueryRow(ctx, `SELECT coalesce($2::timestamptz, now()), key, failures, next_at, updated_at
		FROM signin_throttle WHERE key = $1 FOR UPDATE`, key, now).Scan(&at, &t.Key, &t.Failures, &t.NextAt, &t.UpdatedAt)
	if err != nil {
		return store.Throttle{}, time.Time{}, fmt.Errorf("lock sign-in throttle: %w", err)
	}
	return t, at, nil
}

func (q queries) ThrottlePut(ctx context.Context, t store.Throttle) error {
	_, err := q.db.Exec(ctx, `INSERT INTO signin_throttle (key, failures, next_at, updated_at) VALUES ($1, $2, $3, $4)
		ON CONFLICT (key) DO UPDATE SET failures = excluded.failures, next_at = excluded.next_at, updated_at = excluded.updated_at`,
		t.Key, t.Failures, t.NextAt, t.UpdatedAt)
	if err != nil {
		return fmt.Errorf("write sign-in throttle: %w", err)
	}
	return nil
}

func (q queries) ThrottleDelete(ctx context.Context, key string) error {
	_, err := q.db.Exec(ctx, `DELETE FROM signin_throttle WHERE key = $1`, key)
	return err
}
