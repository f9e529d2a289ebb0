-- Gates that rest on who is asking, not on what a client says: API keys may name the
-- person they act for and (worker keys) the action types they may claim; approvals keep
-- every normalised identity of their requester (none of them may decide); evidence for
-- approve_by_exception is recorded by evaluator keys, never taken from an effect request.
ALTER TABLE api_keys ADD COLUMN on_behalf_of TEXT NOT NULL DEFAULT '';
ALTER TABLE api_keys ADD COLUMN types TEXT NOT NULL DEFAULT '';

ALTER TABLE approvals ADD COLUMN requesters TEXT NOT NULL DEFAULT '';

CREATE TABLE evidence (
  id              INTEGER PRIMARY KEY AUTOINCREMENT,
  idempotency_key TEXT NOT NULL REFERENCES workflow_runs (idempotency_key),
  source          TEXT NOT NULL,   -- the evaluator key's name
  name            TEXT NOT NULL,
  value           TEXT NOT NULL,   -- JSON
  recorded_by     TEXT NOT NULL,
  created_at      INTEGER NOT NULL
) STRICT;
CREATE INDEX evidence_run ON evidence (idempotency_key, id);
