-- The runs list (GET /v1/runs, issue 22): newest first, keyset pages on (created_at,
-- key), optionally of one state. A key prefix is a range of the primary key (BINARY:
-- byte order).
CREATE INDEX IF NOT EXISTS workflow_runs_created ON workflow_runs (created_at, idempotency_key);
CREATE INDEX IF NOT EXISTS workflow_runs_state_created ON workflow_runs (state, created_at, idempotency_key);
-- "Runs with an effect or an approval of this action type": either each run's rows are
-- looked up by its key, or the type's rows are read from these (never all effects).
CREATE INDEX IF NOT EXISTS effects_action_run ON effects (action_type, idempotency_key);
CREATE INDEX IF NOT EXISTS approvals_action_run ON approvals (action_type, idempotency_key);
