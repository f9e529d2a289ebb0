-- Times are INTEGER microseconds since the Unix epoch (UTC), so comparisons are exact
-- and indexable. JSON columns hold text.

-- Runs: one business event per idempotency key (a workflow_runs table, plus the
-- terminal state `rejected` and the counters the weekly report reads).
CREATE TABLE workflow_runs (
  idempotency_key  TEXT PRIMARY KEY,
  state            TEXT NOT NULL CHECK (state IN (
                     'processing', 'awaiting_human', 'approved', 'completed',
                     'failed_retryable', 'failed_terminal', 'rejected')),
  payload_hash     TEXT NOT NULL,
  lease_owner      TEXT NOT NULL DEFAULT '',
  lease_started_at INTEGER,
  lease_expires_at INTEGER,
  version          INTEGER NOT NULL DEFAULT 1,
  result           TEXT,
  duplicates       INTEGER NOT NULL DEFAULT 0,
  reclaims         INTEGER NOT NULL DEFAULT 0,
  trigger_source   TEXT NOT NULL DEFAULT '',
  workflow_version TEXT NOT NULL DEFAULT '',
  created_at       INTEGER NOT NULL,
  updated_at       INTEGER NOT NULL
) STRICT;

-- Effects: a placeholder outbox, keyed by (run key, effect_id). 0002 replaces it with
-- the outbox; the runs CAS already refuses `completed` while one is open or failed.
CREATE TABLE effects (
  idempotency_key TEXT NOT NULL REFERENCES workflow_runs (idempotency_key),
  effect_id       TEXT NOT NULL,
  action_type     TEXT NOT NULL,
  target          TEXT NOT NULL,
  payload_hash    TEXT NOT NULL,
  state           TEXT NOT NULL CHECK (state IN (
                    'pending', 'sending', 'planned', 'completed', 'unknown', 'failed', 'cancelled')),
  created_at      INTEGER NOT NULL,
  updated_at      INTEGER NOT NULL,
  PRIMARY KEY (idempotency_key, effect_id)
) STRICT;

-- Events: the append-only audit timeline. Every change to a run writes one here in the
-- same transaction.
CREATE TABLE events (
  id        INTEGER PRIMARY KEY AUTOINCREMENT,
  run_key   TEXT NOT NULL,
  at        INTEGER NOT NULL,
  kind      TEXT NOT NULL,
  version   INTEGER NOT NULL DEFAULT 0,
  actor     TEXT NOT NULL DEFAULT '',
  meta      TEXT,
  detail    TEXT
) STRICT;
CREATE INDEX events_run_key_id ON events (run_key, id);
CREATE TRIGGER events_no_update BEFORE UPDATE ON events
BEGIN
  SELECT RAISE(ABORT, 'events are append-only');
END;

-- API keys: only the SHA-256 of a key is stored.
CREATE TABLE api_keys (
  id           TEXT PRIMARY KEY,
  name         TEXT NOT NULL,
  key_hash     TEXT NOT NULL UNIQUE,
  scopes       TEXT NOT NULL,
  created_at   INTEGER NOT NULL,
  revoked_at   INTEGER
) STRICT;
