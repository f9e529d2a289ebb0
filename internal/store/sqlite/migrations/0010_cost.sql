-- Cost flat as data grows: no statement's cost may rise with the size of the history.
-- See the PostgreSQL migration for the why; SQLite has one writer at a time, so its
-- counters are updated in place by the triggers.
CREATE TABLE effect_counts (
  state TEXT PRIMARY KEY,
  n     INTEGER NOT NULL
) STRICT;
INSERT INTO effect_counts (state, n) SELECT state, count(*) FROM effects GROUP BY state;

CREATE TRIGGER effects_count_insert AFTER INSERT ON effects BEGIN
  INSERT INTO effect_counts (state, n) VALUES (NEW.state, 1)
    ON CONFLICT (state) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER effects_count_delete AFTER DELETE ON effects BEGIN
  UPDATE effect_counts SET n = n - 1 WHERE state = OLD.state;
END;
CREATE TRIGGER effects_count_update AFTER UPDATE OF state ON effects
  WHEN OLD.state IS NOT NEW.state BEGIN
  UPDATE effect_counts SET n = n - 1 WHERE state = OLD.state;
  INSERT INTO effect_counts (state, n) VALUES (NEW.state, 1)
    ON CONFLICT (state) DO UPDATE SET n = n + 1;
END;

-- Events by time (the report's window, the purge) and by kind (the report's details);
-- SQLite's indexes end with the rowid, which is the event id.
CREATE INDEX IF NOT EXISTS events_at ON events (at, kind, run_key);
CREATE INDEX IF NOT EXISTS events_kind_at ON events (kind, at);

CREATE INDEX IF NOT EXISTS effects_payload_at ON effects (updated_at) WHERE payload IS NOT NULL;
CREATE INDEX IF NOT EXISTS approvals_payload_at ON approvals (consumed_at) WHERE payload IS NOT NULL;
CREATE INDEX IF NOT EXISTS validations_value_at ON validations (created_at) WHERE value IS NOT NULL;
CREATE INDEX IF NOT EXISTS workflow_runs_result_at ON workflow_runs (updated_at) WHERE result IS NOT NULL;
CREATE INDEX IF NOT EXISTS sessions_expires_at ON sessions (expires_at);
