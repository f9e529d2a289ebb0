-- Failure handling: counters and budgets on runs, validation results, attempts per
-- failure class, and replacements (the rerun protocol).
ALTER TABLE workflow_runs
  ADD COLUMN action_type text NOT NULL DEFAULT '',
  ADD COLUMN repairs     integer NOT NULL DEFAULT 0,
  ADD COLUMN validations integer NOT NULL DEFAULT 0,
  ADD COLUMN model_calls integer NOT NULL DEFAULT 0,
  ADD COLUMN tokens      bigint NOT NULL DEFAULT 0,
  ADD COLUMN park_reason text NOT NULL DEFAULT '',
  ADD COLUMN replaced_by text NOT NULL DEFAULT '';

-- One row per validation: only the validated value is kept; the raw output is a hash.
CREATE TABLE validations (
  id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  idempotency_key text NOT NULL REFERENCES workflow_runs (idempotency_key),
  action_type     text NOT NULL,
  valid           boolean NOT NULL,
  repaired        boolean NOT NULL,
  output_hash     text NOT NULL,
  value           jsonb,
  errors          jsonb,
  created_at      timestamptz NOT NULL
);
CREATE INDEX validations_run ON validations (idempotency_key, action_type, id);

CREATE TABLE run_failures (
  idempotency_key text NOT NULL REFERENCES workflow_runs (idempotency_key),
  class           text NOT NULL,
  attempts        integer NOT NULL,
  PRIMARY KEY (idempotency_key, class)
);

CREATE TABLE replacements (
  old_key      text PRIMARY KEY REFERENCES workflow_runs (idempotency_key),
  new_key      text NOT NULL UNIQUE,
  reason       text NOT NULL,
  actor        text NOT NULL,
  provider_ids jsonb NOT NULL,
  created_at   timestamptz NOT NULL
);
