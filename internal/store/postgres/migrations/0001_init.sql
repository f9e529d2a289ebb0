-- Runs: one business event per idempotency key (a workflow_runs table, plus the
-- terminal state `rejected` and the counters the weekly report reads).
CREATE TABLE workflow_runs (
  idempotency_key  text PRIMARY KEY,
  state            text NOT NULL CHECK (state IN (
                     'processing', 'awaiting_human', 'approved', 'completed',
                     'failed_retryable', 'failed_terminal', 'rejected')),
  payload_hash     text NOT NULL,
  lease_owner      text NOT NULL DEFAULT '',
  lease_started_at timestamptz,
  lease_expires_at timestamptz,
  version          bigint NOT NULL DEFAULT 1,
  result           jsonb,
  duplicates       bigint NOT NULL DEFAULT 0,
  reclaims         bigint NOT NULL DEFAULT 0,
  trigger_source   text NOT NULL DEFAULT '',
  workflow_version text NOT NULL DEFAULT '',
  created_at       timestamptz NOT NULL,
  updated_at       timestamptz NOT NULL
);

-- Effects: a placeholder outbox, keyed by (run key, effect_id). 0002 replaces it with
-- the outbox; the runs CAS already refuses `completed` while one is open or failed.
CREATE TABLE effects (
  idempotency_key text NOT NULL REFERENCES workflow_runs (idempotency_key),
  effect_id       text NOT NULL,
  action_type     text NOT NULL,
  target          text NOT NULL,
  payload_hash    text NOT NULL,
  state           text NOT NULL CHECK (state IN (
                    'pending', 'sending', 'planned', 'completed', 'unknown', 'failed', 'cancelled')),
  created_at      timestamptz NOT NULL,
  updated_at      timestamptz NOT NULL,
  PRIMARY KEY (idempotency_key, effect_id)
);

-- Events: the append-only audit timeline. Every change to a run writes one here in the
-- same transaction.
CREATE TABLE events (
  id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  run_key   text NOT NULL,
  at        timestamptz NOT NULL,
  kind      text NOT NULL,
  version   bigint NOT NULL DEFAULT 0,
  actor     text NOT NULL DEFAULT '',
  meta      jsonb,
  detail    jsonb
);
CREATE INDEX events_run_key_id ON events (run_key, id);

CREATE FUNCTION events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'events are append-only';
END $$;
CREATE TRIGGER events_no_update BEFORE UPDATE ON events
  FOR EACH ROW EXECUTE FUNCTION events_append_only();

-- API keys: only the SHA-256 of a key is stored.
CREATE TABLE api_keys (
  id           text PRIMARY KEY,
  name         text NOT NULL,
  key_hash     text NOT NULL UNIQUE,
  scopes       text NOT NULL,
  created_at   timestamptz NOT NULL,
  revoked_at   timestamptz
);
