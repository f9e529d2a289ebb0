-- Stalled runs (issue 34): a run left `processing` after its lease lapsed, with nothing
-- to complete it (its caller died mid-run: n8n killed mid-execution, an agent's crash).
-- The console counts and lists them on workflow_runs_stalled, and a sweep raises one
-- run_stalled alert per stall: stall_alerted_version is the run's version when it did
-- (NULL: never). A reclaim or any transition changes the version, so a later stall of
-- the same run alerts again.
ALTER TABLE workflow_runs ADD COLUMN stall_alerted_version bigint;
CREATE INDEX workflow_runs_stalled ON workflow_runs (lease_expires_at) WHERE state = 'processing';
