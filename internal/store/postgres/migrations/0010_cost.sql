-- Cost flat as data grows: no statement's cost may rise with the size of the history.
--
-- Effects by state, for /metrics and the report, without counting the table. Every
-- change of an effect's state appends a delta row (a trigger, so no code path can miss
-- it); nothing updates a shared row on the write path, so concurrent dispatchers never
-- wait on one another for a counter and never deadlock over two of them. A read adds the
-- deltas to effect_counts; a compaction (at scrape and at purge, one instance at a time
-- under an advisory lock) folds the deltas into effect_counts in one transaction, so a
-- reader sees either all of a compaction or none of it: the sum is always exact.
CREATE TABLE effect_counts (
  state text PRIMARY KEY,
  n     bigint NOT NULL
);
CREATE TABLE effect_count_deltas (
  state text NOT NULL,
  n     integer NOT NULL
);

CREATE FUNCTION effect_count_delta() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO effect_count_deltas (state, n) VALUES (NEW.state, 1);
  ELSIF TG_OP = 'DELETE' THEN
    INSERT INTO effect_count_deltas (state, n) VALUES (OLD.state, -1);
  ELSE
    INSERT INTO effect_count_deltas (state, n) VALUES (OLD.state, -1), (NEW.state, 1);
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER effects_count_insert_delete AFTER INSERT OR DELETE ON effects
  FOR EACH ROW EXECUTE FUNCTION effect_count_delta();
CREATE TRIGGER effects_count_update AFTER UPDATE OF state ON effects
  FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION effect_count_delta();

-- The migration holds effects' lock from CREATE TRIGGER to commit: no change slips
-- between this count and the trigger.
INSERT INTO effect_counts (state, n) SELECT state, count(*) FROM effects GROUP BY state;

-- The indexes below are built inside the migration's transaction, which blocks writes to
-- their table while each is built: on a large existing database, build them beforehand
-- with CREATE INDEX CONCURRENTLY under the same names (docs/architecture.md), and these
-- statements skip them.
--
-- Events by time: the report reads only its window (index-only: kind and run_key are
-- carried), and the purge finds expired events without reading the others.
CREATE INDEX IF NOT EXISTS events_at ON events (at) INCLUDE (kind, run_key);
-- The report's detail events and gate waits: one range of the index per kind.
CREATE INDEX IF NOT EXISTS events_kind_at ON events (kind, at);

-- The purge's candidates, so a purge that removes nothing reads nothing. Each is partial
-- on the column it clears: a purged row leaves its index.
CREATE INDEX IF NOT EXISTS effects_payload_at ON effects (updated_at) WHERE payload IS NOT NULL;
CREATE INDEX IF NOT EXISTS approvals_payload_at ON approvals (consumed_at) WHERE payload IS NOT NULL;
CREATE INDEX IF NOT EXISTS validations_value_at ON validations (created_at) WHERE value IS NOT NULL;
CREATE INDEX IF NOT EXISTS workflow_runs_result_at ON workflow_runs (updated_at) WHERE result IS NOT NULL;
CREATE INDEX IF NOT EXISTS sessions_expires_at ON sessions (expires_at);
