-- The runs list (GET /v1/runs, issue 22): newest first, keyset pages on (created_at,
-- key), optionally of one state; a key prefix is a range of the key in byte order.
CREATE INDEX IF NOT EXISTS workflow_runs_created ON workflow_runs (created_at, idempotency_key);
CREATE INDEX IF NOT EXISTS workflow_runs_state_created ON workflow_runs (state, created_at, idempotency_key);
CREATE INDEX IF NOT EXISTS workflow_runs_key_bytes ON workflow_runs (idempotency_key COLLATE "C");
-- "runs with an effect of this action type" looks each run's effects up by its key
-- (the primary key); approvals by approvals_run.
