-- The transactional outbox, replacing the placeholder of
-- 0001: one table for every executor, keyed by (run key, effect_id).
DROP TABLE effects;
CREATE TABLE effects (
  id               TEXT PRIMARY KEY,
  idempotency_key  TEXT NOT NULL REFERENCES workflow_runs (idempotency_key),
  effect_id        TEXT NOT NULL,
  action_type      TEXT NOT NULL,
  target           TEXT NOT NULL,
  executor         TEXT NOT NULL CHECK (executor IN ('dispatcher', 'worker')),
  payload          TEXT,
  payload_hash     TEXT NOT NULL,
  state            TEXT NOT NULL CHECK (state IN (
                     'pending', 'sending', 'planned', 'completed', 'unknown', 'failed', 'cancelled')),
  lease_owner      TEXT NOT NULL DEFAULT '',
  lease_expires_at INTEGER,
  send_started_at  INTEGER,        -- set, and committed, just before the connector is called
  provider_id      TEXT NOT NULL DEFAULT '',
  attempts         INTEGER NOT NULL DEFAULT 0,
  not_before       INTEGER NOT NULL,
  last_error_class TEXT NOT NULL DEFAULT '',
  created_at       INTEGER NOT NULL,
  updated_at       INTEGER NOT NULL,
  UNIQUE (idempotency_key, effect_id)
) STRICT;
CREATE INDEX effects_due ON effects (executor, not_before) WHERE state = 'pending';
CREATE INDEX effects_sending ON effects (lease_expires_at) WHERE state = 'sending';
CREATE INDEX effects_open ON effects (state) WHERE state IN ('unknown', 'failed');

-- The kill switch: scope 'global' or 'action:<type>'. A send needs a positive read; a
-- fresh install starts enabled, and every change is recorded with actor and reason.
CREATE TABLE kill_switch (
  scope      TEXT PRIMARY KEY,
  enabled    INTEGER NOT NULL CHECK (enabled IN (0, 1)),
  reason     TEXT NOT NULL,
  actor      TEXT NOT NULL,
  updated_at INTEGER NOT NULL
) STRICT;
INSERT INTO kill_switch (scope, enabled, reason, actor, updated_at)
VALUES ('global', 1, 'fresh install', 'airlock', CAST(unixepoch('subsec') * 1000000 AS INTEGER));
