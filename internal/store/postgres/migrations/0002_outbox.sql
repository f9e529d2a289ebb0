-- The transactional outbox, replacing the placeholder of
-- 0001: one table for every executor, keyed by (run key, effect_id).
DROP TABLE effects;
CREATE TABLE effects (
  id               text PRIMARY KEY,
  idempotency_key  text NOT NULL REFERENCES workflow_runs (idempotency_key),
  effect_id        text NOT NULL,
  action_type      text NOT NULL,
  target           text NOT NULL,
  executor         text NOT NULL CHECK (executor IN ('dispatcher', 'worker')),
  payload          jsonb,
  payload_hash     text NOT NULL,
  state            text NOT NULL CHECK (state IN (
                     'pending', 'sending', 'planned', 'completed', 'unknown', 'failed', 'cancelled')),
  lease_owner      text NOT NULL DEFAULT '',
  lease_expires_at timestamptz,
  send_started_at  timestamptz,        -- set, and committed, just before the connector is called
  provider_id      text NOT NULL DEFAULT '',
  attempts         integer NOT NULL DEFAULT 0,
  not_before       timestamptz NOT NULL,
  last_error_class text NOT NULL DEFAULT '',
  created_at       timestamptz NOT NULL,
  updated_at       timestamptz NOT NULL,
  UNIQUE (idempotency_key, effect_id)
);
-- The dispatcher's lease query reads only due pending rows: without this index it scans
-- the whole table under FOR UPDATE SKIP LOCKED.
CREATE INDEX effects_due ON effects (executor, not_before) WHERE state = 'pending';
CREATE INDEX effects_sending ON effects (lease_expires_at) WHERE state = 'sending';
CREATE INDEX effects_open ON effects (state) WHERE state IN ('unknown', 'failed');

-- The kill switch: scope 'global' or 'action:<type>'. A send needs a positive read; a
-- fresh install starts enabled, and every change is recorded with actor and reason.
CREATE TABLE kill_switch (
  scope      text PRIMARY KEY,
  enabled    boolean NOT NULL,
  reason     text NOT NULL,
  actor      text NOT NULL,
  updated_at timestamptz NOT NULL
);
INSERT INTO kill_switch (scope, enabled, reason, actor, updated_at)
VALUES ('global', true, 'fresh install', 'airlock', now());
