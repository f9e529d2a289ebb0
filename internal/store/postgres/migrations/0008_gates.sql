-- Gates that rest on who is asking, not on what a client says: API keys may name the
-- person they act for and (worker keys) the action types they may claim; approvals keep
-- every normalised identity of their requester (none of them may decide); evidence for
-- approve_by_exception is recorded by evaluator keys, never taken from an effect request.
ALTER TABLE api_keys ADD COLUMN on_behalf_of text NOT NULL DEFAULT '';
ALTER TABLE api_keys ADD COLUMN types text NOT NULL DEFAULT '';

ALTER TABLE approvals ADD COLUMN requesters text NOT NULL DEFAULT '';

CREATE TABLE evidence (
  id              bigserial PRIMARY KEY,
  idempotency_key text NOT NULL REFERENCES workflow_runs (idempotency_key),
  source          text NOT NULL,   -- the evaluator key's name
  name            text NOT NULL,
  value           jsonb NOT NULL,
  recorded_by     text NOT NULL,
  created_at      timestamptz NOT NULL
);
CREATE INDEX evidence_run ON evidence (idempotency_key, id);
