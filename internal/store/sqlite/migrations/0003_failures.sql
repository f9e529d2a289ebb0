-- Failure handling: counters and budgets on runs, validation results, attempts per
-- failure class, and replacements (the rerun protocol).
ALTER TABLE workflow_runs ADD COLUMN action_type TEXT NOT NULL DEFAULT '';
ALTER TABLE workflow_runs ADD COLUMN repairs     INTEGER NOT NULL DEFAULT 0;
ALTER TABLE workflow_runs ADD COLUMN validations INTEGER NOT NULL DEFAULT 0;
ALTER TABLE workflow_runs ADD COLUMN model_calls INTEGER NOT NULL DEFAULT 0;
ALTER TABLE workflow_runs ADD COLUMN tokens      INTEGER NOT NULL DEFAULT 0;
ALTER TABLE workflow_runs ADD COLUMN park_reason TEXT NOT NULL DEFAULT '';
ALTER TABLE workflow_runs ADD COLUMN replaced_by TEXT NOT NULL DEFAULT '';

-- One row per validation: only the validated value is kept; the raw output is a hash.
CREATE TABLE validations (
  id              INTEGER PRIMARY KEY AUTOINCREMENT,
  idempotency_key TEXT NOT NULL REFERENCES workflow_runs (idempotency_key),
  action_type     TEXT NOT NULL,
  valid           INTEGER NOT NULL CHECK (valid IN (0, 1)),
  repaired        INTEGER NOT NULL CHECK (repaired IN (0, 1)),
  output_hash     TEXT NOT NULL,
  value           TEXT,
  errors          TEXT,
  created_at      INTEGER NOT NULL
) STRICT;
CREATE INDEX validations_run ON validations (idempotency_key, action_type, id);

CREATE TABLE run_failures (
  idempotency_key TEXT NOT NULL REFERENCES workflow_runs (idempotency_key),
  class           TEXT NOT NULL,
  attempts        INTEGER NOT NULL,
  PRIMARY KEY (idempotency_key, class)
) STRICT;

CREATE TABLE replacements (
  old_key      TEXT PRIMARY KEY REFERENCES workflow_runs (idempotency_key),
  new_key      TEXT NOT NULL UNIQUE,
  reason       TEXT NOT NULL,
  actor        TEXT NOT NULL,
  provider_ids TEXT NOT NULL,
  created_at   INTEGER NOT NULL
) STRICT;
