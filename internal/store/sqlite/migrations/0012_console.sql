-- The operator console's lists: each is a keyset page read through a partial
-- index that holds only the rows the list shows, in the list's order, so a page costs
-- the same with millions of finished runs, sent effects or decided approvals behind it.
-- The queries repeat each index's WHERE terms word for word: SQLite uses a partial index
-- only when the query's WHERE contains them.
CREATE INDEX IF NOT EXISTS approvals_pending ON approvals (created_at, id) WHERE consumed_at IS NULL;
CREATE INDEX IF NOT EXISTS effects_attention ON effects (state, updated_at, id) WHERE state IN ('unknown', 'failed');
CREATE INDEX IF NOT EXISTS workflow_runs_parked ON workflow_runs (updated_at, idempotency_key)
  WHERE state = 'awaiting_human' AND park_reason IN ('unknown_commit', 'input_mismatch');
