-- Work ledger (a long-running agent's resumable state): every checkpoint of a run's
-- ledger is kept; agents' own effects (planned before, confirmed after) live in the same
-- effects table, executor 'agent'.
CREATE TABLE ledgers (
  idempotency_key    text NOT NULL REFERENCES workflow_runs (idempotency_key),
  checkpoint_version integer NOT NULL,
  document           jsonb NOT NULL,
  created_at         timestamptz NOT NULL,
  PRIMARY KEY (idempotency_key, checkpoint_version)
);

ALTER TABLE effects DROP CONSTRAINT effects_executor_check;
ALTER TABLE effects ADD CONSTRAINT effects_executor_check CHECK (executor IN ('dispatcher', 'worker', 'agent'));
