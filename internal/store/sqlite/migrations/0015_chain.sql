-- Each run's events form a hash chain (issue 22; store/chain.go describes it). SQLite
-- has no SHA-256 in SQL: airlock_chain_hash is store.ChainHash, registered on every
-- connection airlock opens (sqlite.go), so only airlock can insert an event. A trigger
-- cannot change NEW here, so the link is written by an update of the new row, the one
-- update the append-only trigger lets through: setting a missing link, nothing else.
-- SQLite has one writer at a time, so two writers of one run never read the same head.
-- Events from before this migration keep no link.
ALTER TABLE events ADD COLUMN chain_seq INTEGER;
ALTER TABLE events ADD COLUMN chain_hash TEXT;

CREATE TABLE event_chains (
  run_key    TEXT PRIMARY KEY,
  seq        INTEGER NOT NULL,
  head       TEXT NOT NULL,
  started_at INTEGER NOT NULL,
  base_seq   INTEGER NOT NULL DEFAULT 0,
  base_hash  TEXT NOT NULL DEFAULT ''
) STRICT;

DROP TRIGGER events_no_update;
CREATE TRIGGER events_no_update BEFORE UPDATE ON events
WHEN NOT (OLD.chain_seq IS NULL AND NEW.chain_seq IS NOT NULL AND NEW.chain_hash IS NOT NULL
  AND NEW.id = OLD.id AND NEW.run_key = OLD.run_key AND NEW.at = OLD.at AND NEW.kind = OLD.kind
  AND NEW.version = OLD.version AND NEW.actor = OLD.actor
  AND NEW.meta IS OLD.meta AND NEW.detail IS OLD.detail)
BEGIN
  SELECT RAISE(ABORT, 'events are append-only');
END;

CREATE TRIGGER events_chain AFTER INSERT ON events
BEGIN
  INSERT INTO event_chains (run_key, seq, head, started_at)
  VALUES (NEW.run_key, 1, airlock_chain_hash('', NEW.id, NEW.run_key, NEW.at, NEW.kind,
    NEW.version, NEW.actor, NEW.meta, NEW.detail), NEW.at)
  ON CONFLICT (run_key) DO UPDATE
    SET seq = seq + 1,
        head = airlock_chain_hash(head, NEW.id, NEW.run_key, NEW.at, NEW.kind,
          NEW.version, NEW.actor, NEW.meta, NEW.detail);
  UPDATE events
  SET chain_seq = (SELECT seq FROM event_chains WHERE run_key = NEW.run_key),
      chain_hash = (SELECT head FROM event_chains WHERE run_key = NEW.run_key)
  WHERE id = NEW.id;
END;
