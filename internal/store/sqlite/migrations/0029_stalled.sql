-- Stalled runs: see the PostgreSQL migration. stall_alerted_version is the run's version
-- when the sweep raised its run_stalled alert (NULL: never).
ALTER TABLE workflow_runs ADD COLUMN stall_alerted_version INTEGER;
CREATE INDEX workflow_runs_stalled ON workflow_runs (lease_expires_at) WHERE state = 'processing';
