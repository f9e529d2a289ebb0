-- Fewer index entries per effect and per event (issue 23; see the PostgreSQL migration).
-- The queries repeat each partial index's WHERE terms word for word: SQLite uses a partial
-- index only when the query's WHERE contains them.
--
-- The purge clears payloads of finished effects only: the index holds only those, so
-- the insert and the lease (which sets updated_at) write no entry in it.
CREATE INDEX IF NOT EXISTS effects_purge_at ON effects (updated_at)
  WHERE payload IS NOT NULL AND state IN ('completed', 'cancelled');
DROP INDEX IF EXISTS effects_payload_at;

-- The report reads the details of these kinds only (store.ReportKinds); the lifecycle's
-- events are only counted, from events_at.
CREATE INDEX IF NOT EXISTS events_report_kind_at ON events (kind, at)
  WHERE kind IN ('alert', 'approval_decided', 'effect_failed', 'effect_reconciled', 'effect_resolved', 'validation');
DROP INDEX IF EXISTS events_kind_at;
