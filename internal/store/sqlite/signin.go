package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/store"
)

const userColumns = `id, name, password_hash, roles, created_at, disabled_at`

func scanUser(row scanner) (store.User, error) {
	var u store.User
	var roles string
	var created int64
	var disabled sql.NullInt64
	if err := row.Scan(&u.ID, &u.Name, &u.PasswordHash, &roles, &created, &disabled); err != nil {
		return store.User{}, interpret(err)
	}
	u.Roles, u.CreatedAt, u.DisabledAt = splitList(roles), fromMicros(created), optTime(disabled)
	return u, nil
}

func (q queries) UserList(ctx context.Context) ([]store.User, error) {
	return selectAll(ctx, q.db, scanUser, `SELECT `+userColumns+` FROM users ORDER BY name`)
}

func (q queries) UserUpdate(ctx context.Context, p store.UserUpdateParams) (store.User, error) {
	var roles *string
	if p.Roles != nil {
		r := strings.Join(p.Roles, ",")
		roles = &r
	}
	var disabled *int64
	if p.Disabled != nil {
		v := int64(0)
		if *p.Disabled {
			v = 1
		}
		disabled = &v
	}
	// ?4: NULL leaves disabled_at; 1 sets it (to ?5) unless already set; 0 clears it.
	u, err := scanUser(q.db.QueryRowContext(ctx, `
		UPDATE users SET roles = coalesce(?2, roles), password_hash = coalesce(?3, password_hash),
		  disabled_at = CASE WHEN ?4 IS NULL THEN disabled_at WHEN ?4 = 1 THEN coalesce(disabled_at, ?5) ELSE NULL END
		WHERE name = ?1
		RETURNING `+userColumns, p.Name, roles, p.PasswordHash, disabled, q.at(p.DisabledAt)))
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
	if err := q.db.QueryRowContext(ctx, `DELETE FROM users WHERE name = ? RETURNING id`, name).Scan(&id); err != nil {
		return interpret(err)
	}
	_, err := q.SessionsEndForUser(ctx, id)
	return err
}

func (q queries) SessionsEndForUser(ctx context.Context, userID string) (int64, error) {
	res, err := q.db.ExecContext(ctx, `DELETE FROM sessions WHERE user_id = ?`, userID)
	if err != nil {
		return 0, fmt.Errorf("end sessions: %w", err)
	}
	return res.RowsAffected()
}

func (q queries) SecretGet(ctx context.Context, name string) ([]byte, error) {
	var v []byte
	err := q.db.QueryRowContext(ctx, `SELECT value FROM site_secrets WHERE name = ?`, name).Scan(&v)
	return v, interpret(err)
}

func scanThrottle(row scanner) (store.Throttle, error) {
	var t store.Throttle
	var next, updated int64
	if err := row.Scan(&t.Key, &t.Failures, &next, &updated); err != nil {
		return store.Throttle{}, err
	}
	t.NextAt, t.UpdatedAt = fromMicros(next), fromMicros(updated)
	return t, nil
}

func (q queries) ThrottleGet(ctx context.Context, key string, now *time.Time) (store.Throttle, time.Time, error) {
	at := fromMicros(q.at(now))
	t, err := scanThrottle(q.db.QueryRowContext(ctx, `SELECT key, failures, next_at, updated_at FROM signin_throttle WHERE key = ?`, key))
	if errors.Is(err, sql.ErrNoRows) {
		return store.Throttle{}, at, nil
	}
	if err != nil {
		return store.Throttle{}, time.Time{}, fmt.Errorf("read sign-in throttle: %w", err)
	}
	return t, at, nil
}

// ThrottleLock: Transact's transactions begin IMMEDIATE, so the write lock is already held.
func (q queries) ThrottleLock(ctx context.Context, key string, now *time.Time) (store.Throttle, time.Time, error) {
	at := q.at(now)
	t, err := scanThrottle(q.db.QueryRowContext(ctx, `INSERT INTO signin_throttle (key, failures, next_at, updated_at) VALUES (?1, 0, ?2, ?2)
		ON CONFLICT (key) DO UPDATE SET key = excluded.key RETURNING key, failures, next_at, updated_at`, key, at))
	if err != nil {
		return store.Throttle{}, time.Time{}, fmt.Errorf("lock sign-in throttle: %w", err)
	}
	return t, fromMicros(at), nil
}

func (q queries) ThrottlePut(ctx context.Context, t store.Throttle) error {
	_, err := q.db.ExecContext(ctx, `INSERT INTO signin_throttle (key, failures, next_at, updated_at) VALUES (?, ?, ?, ?)
		ON CONFLICT (key) DO UPDATE SET failures = excluded.failures, next_at = excluded.next_at, updated_at = excluded.updated_at`,
		t.Key, t.Failures, t.NextAt.UnixMicro(), t.UpdatedAt.UnixMicro())
	if err != nil {
		return fmt.Errorf("write sign-in throttle: %w", err)
	}
	return nil
}

func (q queries) ThrottleDelete(ctx context.Context, key string) error {
	_, err := q.db.ExecContext(ctx, `DELETE FROM signin_throttle WHERE key = ?`, key)
	return err
}
