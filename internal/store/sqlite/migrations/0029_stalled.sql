-- Stalled runs: see the PostgreSQL migration. stall_alerted_version is the run's version
-- when the sweep raised its run_stalled alert (NULL: never).
ALTER TABLE workflow_runs ADD COLUMN stall_alerted_version INTEGER;
-- No index of its own: see the PostgreSQL migration.
