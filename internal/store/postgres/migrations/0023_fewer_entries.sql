-- Fewer index entries per claim and per effect (issue 23; docs/benchmarks.md, "Index
-- entries per claim and per effect"). Every row version an insert or a non-HOT update
-- writes is an entry in each index whose predicate it satisfies, whichever columns
-- changed: the effect's lease and outcome are non-HOT (they change state), so each wrote
-- into every effects index that holds pending and sending rows.
--
-- Like 0010's, these indexes are built inside the migration's transaction, which blocks
-- writes to their table while each is built: on a large database, build them beforehand
-- with CREATE INDEX CONCURRENTLY under the same names (docs/architecture.md), and these
-- statements skip them. The old indexes are dropped after.

-- The purge clears payloads of finished effects only: the index holds only those, so the
-- insert, the lease and the begin-mark write no entry in it (before: every row version).
CREATE INDEX IF NOT EXISTS effects_purge_at ON effects (updated_at)
  WHERE payload IS NOT NULL AND state IN ('completed', 'cancelled');
DROP INDEX IF EXISTS effects_payload_at;

-- "Runs with an effect of this action type" looks each run's effects up by its key: the
-- unique key carries the type, so that lookup stays index-only and effects_action_run
-- (one more entry per row version) goes. The new index becomes the unique constraint
-- (ON CONFLICT (idempotency_key, effect_id) infers it as it did the old one).
CREATE UNIQUE INDEX IF NOT EXISTS effects_run_effect ON effects (idempotency_key, effect_id) INCLUDE (action_type);
ALTER TABLE effects DROP CONSTRAINT IF EXISTS effects_idempotency_key_effect_id_key;
ALTER TABLE effects ADD CONSTRAINT effects_run_effect UNIQUE USING INDEX effects_run_effect;
DROP INDEX IF EXISTS effects_action_run;

-- The report reads the details of these kinds only (audit.detailKinds and the gate
-- waits' approval_decided); the lifecycle's events (claimed, effect_queued,
-- effect_completed, …) are only counted, from events_at. The store repeats this list
-- word for word in its query, so that even a generic plan can use the index.
CREATE INDEX IF NOT EXISTS events_report_kind_at ON events (kind, at)
  WHERE kind IN ('alert', 'approval_decided', 'effect_failed', 'effect_reconciled', 'effect_resolved', 'validation');
DROP INDEX IF EXISTS events_kind_at;
