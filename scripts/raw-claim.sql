\set n random(1, 1000000000000)
INSERT INTO workflow_runs (
  idempotency_key, state, payload_hash, lease_owner, lease_expires_at, created_at, updated_at
)
VALUES ('pgbench-' || :client_id || '-' || :n, 'processing',
  '9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08', gen_random_uuid()::text,
  now() + interval '5 minutes', now(), now())
ON CONFLICT (idempotency_key) DO UPDATE
SET lease_owner = EXCLUDED.lease_owner,
    lease_expires_at = EXCLUDED.lease_expires_at,
    state = 'processing',
    version = workflow_runs.version + 1,
    updated_at = now()
WHERE workflow_runs.payload_hash = EXCLUDED.payload_hash
  AND (workflow_runs.state = 'failed_retryable'
       OR (workflow_runs.state = 'processing'
           AND workflow_runs.lease_expires_at < now()))
RETURNING idempotency_key, lease_owner, version;
