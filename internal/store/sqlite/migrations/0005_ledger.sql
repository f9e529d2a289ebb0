-- Work ledger (a long-running agent's resumable state): every checkpoint of a run's
-- ledger is kept; agents' own effects (planned before, confirmed after) live in the same
-- effects table, executor 'agent'.
CREATE TABLE ledgers (
  idempotency_key    TEXT NOT NULL REFERENCES workflow_runs (idempotency_key),
  checkpoint_version INTEGER NOT NULL,
  document           TEXT NOT NULL,
  created_at         INTEGER NOT NULL,
  PRIMARY KEY (idempotency_key, checkpoint_version)
) STRICT;

-- SQLite cannot alter a CHECK constraint: rebuild effects with 'agent' allowed.
CREATE TABLE effects_new (
  id               TEXT PRIMARY KEY,
  idempotency_key  TEXT NOT NULL REFERENCES workflow_runs (idempotency_key),
  effect_id        TEXT NOT NULL,
  action_type      TEXT NOT NULL,
  target           TEXT NOT NULL,
  executor         TEXT NOT NULL CHECK (executor IN ('dispatcher', 'worker', 'agent')),
  payload          TEXT,
  payload_hash     TEXT NOT NULL,
  state            TEXT NOT NULL CHECK (state IN (
                     'pending', 'sending', 'planned', 'completed', 'unknown', 'failed', 'cancelled')),
  lease_owner      TEXT NOT NULL DEFAULT '',
  lease_expires_at INTEGER,
  send_started_at  INTEGER,
  provider_id      TEXT NOT NULL DEFAULT '',
  attempts         INTEGER NOT NULL DEFAULT 0,
  not_before       INTEGER NOT NULL,
  last_error_class TEXT NOT NULL DEFAULT '',
  created_at       INTEGER NOT NULL,
  updated_at       INTEGER NOT NULL,
  UNIQUE (idempotency_key, effect_id)
) STRICT;
INSERT INTO effects_new SELECT * FROM effects;
DROP TABLE effects;
ALTER TABLE effects_new RENAME TO effects;
CREATE INDEX effects_due ON effects (executor, not_before) WHERE state = 'pending';
CREATE INDEX effects_sending ON effects (lease_expires_at) WHERE state = 'sending';
CREATE INDEX effects_open ON effects (state) WHERE state IN ('unknown', 'failed');
