package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/airlockhq/airlock/internal/store"
)

func (q queries) RunLock(ctx context.Context, p store.RunLockParams) (store.Run, error) {
	return noMatch(scanRun(q.db.QueryRow(ctx, `
		SELECT `+runColumns+` FROM workflow_runs
		WHERE idempotency_key = $1 AND lease_owner = $2 AND version = $3 AND state = 'processing'
		  AND lease_expires_at > coalesce($4::timestamptz, now())
		FOR UPDATE`, p.Key, p.Owner, p.Version, p.Now)))
}

const effectColumns = `id, idempotency_key, effect_id, action_type, target, executor, payload,
	payload_hash, state, lease_owner, lease_expires_at, send_started_at, provider_id, attempts, not_before,
	last_error_class, created_at, updated_at`

func scanEffect(row pgx.Row) (store.Effect, error) {
	var e store.Effect
	var state string
	var payload []byte
	err := row.Scan(&e.ID, &e.RunKey, &e.EffectID, &e.ActionType, &e.Target, &e.Executor, &payload,
		&e.PayloadHash, &state, &e.LeaseOwner, &e.LeaseExpiresAt, &e.SendStartedAt, &e.ProviderID, &e.Attempts,
		&e.NotBefore, &e.LastErrorClass, &e.CreatedAt, &e.UpdatedAt)
	if err != nil {
		return store.Effect{}, interpret(err)
	}
	e.State, e.Payload = store.EffectState(state), rawOrNil(payload)
	return e, nil
}

func collectEffects(rows pgx.Rows, err error) ([]store.Effect, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Effect, error) { return scanEffect(row) })
}

func (q queries) EffectInsert(ctx context.Context, e store.Effect) (store.Effect, bool, error) {
	got, err := scanEffect(q.db.QueryRow(ctx, `
		INSERT INTO effects (id, idempotency_key, effect_id, action_type, target, executor, payload,
		  payload_hash, state, not_before, created_at, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9, coalesce($10::timestamptz, now()),
		  coalesce($11::timestamptz, now()), coalesce($11::timestamptz, now()))
		ON CONFLICT (idempotency_key, effect_id) DO NOTHING
		RETURNING `+effectColumns, e.ID, e.RunKey, e.EffectID, e.ActionType, e.Target, e.Executor,
		jsonArg(e.Payload), e.PayloadHash, string(e.State), timeArg(e.NotBefore), timeArg(e.CreatedAt)))
	if err == nil {
		return got, true, nil
	}
	if !errors.Is(err, store.ErrNotFound) {
		return store.Effect{}, false, fmt.Errorf("insert effect: %w", err)
	}
	got, err = scanEffect(q.db.QueryRow(ctx, `SELECT `+effectColumns+` FROM effects
		WHERE idempotency_key = $1 AND effect_id = $2`, e.RunKey, e.EffectID))
	if err != nil {
		return store.Effect{}, false, fmt.Errorf("read existing effect: %w", err)
	}
	return got, false, nil
}

// timeArg passes the zero time as NULL so the database clock fills it in.
func timeArg(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func (q queries) EffectGet(ctx context.Context, id string) (store.Effect, error) {
	return scanEffect(q.db.QueryRow(ctx, `SELECT `+effectColumns+` FROM effects WHERE id = $1`, id))
}

func (q queries) EffectList(ctx context.Context, p store.EffectListParams) ([]store.Effect, error) {
	states := make([]string, len(p.States))
	for i, s := range p.States {
		states[i] = string(s)
	}
	return collectEffects(q.db.Query(ctx, `SELECT `+effectColumns+` FROM effects
		WHERE ($1 = '' OR idempotency_key = $1) AND (cardinality($2::text[]) = 0 OR state = ANY($2))
		ORDER BY created_at, id LIMIT $3`, p.RunKey, states, p.Limit))
}

func (q queries) EffectLease(ctx context.Context, p store.EffectLeaseParams) ([]store.Effect, error) {
	return collectEffects(q.db.Query(ctx, `
		WITH due AS (
		  SELECT id FROM effects
		  WHERE state = 'pending' AND executor = $1 AND not_before <= coalesce($6::timestamptz, now())
		    AND ($2::text[] IS NULL OR action_type = ANY($2))
		  ORDER BY not_before
		  LIMIT $5
		  FOR UPDATE SKIP LOCKED
		)
		UPDATE effects e
		SET state = 'sending', lease_owner = $3, attempts = e.attempts + 1, send_started_at = NULL,
		    lease_expires_at = coalesce($6::timestamptz, now()) + $4::bigint * interval '1 microsecond',
		    updated_at = coalesce($6::timestamptz, now())
		FROM due WHERE e.id = due.id
		RETURNING `+prefixed("e.", effectColumns), p.Executor, p.Types, p.Owner, micros(p.Lease), p.Limit, p.Now))
}

func (q queries) EffectUpdate(ctx context.Context, p store.EffectUpdateParams) (store.Effect, error) {
	from := make([]string, len(p.From))
	for i, s := range p.From {
		from[i] = string(s)
	}
	e, err := scanEffect(q.db.QueryRow(ctx, `
		UPDATE effects
		SET state = $3,
		    provider_id = coalesce($5, provider_id),
		    not_before = coalesce($6, not_before),
		    last_error_class = coalesce($7, last_error_class),
		    attempts = attempts - CASE WHEN $8 THEN 1 ELSE 0 END,
		    lease_owner = CASE WHEN $3 = 'sending' THEN lease_owner ELSE '' END,
		    lease_expires_at = CASE WHEN $3 = 'sending' THEN lease_expires_at ELSE NULL END,
		    send_started_at = CASE WHEN $3 <> 'sending' THEN NULL
		                           WHEN $10 THEN coalesce($9::timestamptz, now()) ELSE send_started_at END,
		    updated_at = coalesce($9::timestamptz, now())
		WHERE id = $1 AND state = ANY($2) AND ($4 = '' OR lease_owner = $4)
		RETURNING `+effectColumns, p.ID, from, string(p.To), p.Owner, p.ProviderID, p.NotBefore,
		p.ErrorClass, p.ReleaseAttempt, p.Now, p.Started))
	if errors.Is(err, store.ErrNotFound) {
		return store.Effect{}, store.ErrNoMatch
	}
	return e, err
}

func (q queries) EffectExpiredLeases(ctx context.Context, now *time.Time, limit int) ([]store.Effect, error) {
	return collectEffects(q.db.Query(ctx, `SELECT `+effectColumns+` FROM effects
		WHERE state = 'sending' AND lease_expires_at <= coalesce($1::timestamptz, now())
		ORDER BY lease_expires_at LIMIT $2`, now, limit))
}

func (q queries) EffectCountByState(ctx context.Context) (map[store.EffectState]int, error) {
	rows, err := q.db.Query(ctx, `SELECT state, count(*) FROM effects GROUP BY state`)
	if err != nil {
		return nil, fmt.Errorf("count effects: %w", err)
	}
	out := map[store.EffectState]int{}
	var state string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&state, &n}, func() error {
		out[store.EffectState(state)] = n
		return nil
	})
	return out, err
}

func (q queries) KillSwitchList(ctx context.Context) ([]store.KillSwitch, error) {
	rows, err := q.db.Query(ctx, `SELECT scope, enabled, reason, actor, updated_at FROM kill_switch ORDER BY scope`)
	if err != nil {
		return nil, fmt.Errorf("read kill switch: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.KillSwitch, error) {
		var k store.KillSwitch
		err := row.Scan(&k.Scope, &k.Enabled, &k.Reason, &k.Actor, &k.UpdatedAt)
		return k, err
	})
}

func (q queries) KillSwitchSet(ctx context.Context, k store.KillSwitch) error {
	_, err := q.db.Exec(ctx, `
		INSERT INTO kill_switch (scope, enabled, reason, actor, updated_at)
		VALUES ($1, $2, $3, $4, coalesce($5::timestamptz, now()))
		ON CONFLICT (scope) DO UPDATE SET enabled = EXCLUDED.enabled, reason = EXCLUDED.reason,
		  actor = EXCLUDED.actor, updated_at = EXCLUDED.updated_at`,
		k.Scope, k.Enabled, k.Reason, k.Actor, timeArg(k.UpdatedAt))
	if err != nil {
		return fmt.Errorf("set kill switch: %w", err)
	}
	return nil
}

// prefixed qualifies a column list with a table alias.
func prefixed(alias, cols string) string {
	parts := strings.Split(cols, ",")
	for i, c := range parts {
		parts[i] = alias + strings.TrimSpace(c)
	}
	return strings.Join(parts, ", ")
}
