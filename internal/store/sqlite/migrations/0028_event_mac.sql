-- writer-level: 2
--
-- Each event's MAC (issue 33; store/mac.go): computed by airlock with the audit key,
-- which the database never sees, so a row inserted or rewritten with SQL alone fails
-- `airlock audit verify`. mac_key is the key's id (keys rotate), mac the nonce and the
-- HMAC. Both stay NULL for events written without a key, and for every event from
-- before this migration: verify counts those as unkeyed. Level 2: a writer with an audit
-- key configured seals every event it writes; a binary from before this migration cannot,
-- and would leave unkeyed events in a keyed trail, so it writes nothing here.
ALTER TABLE events ADD COLUMN mac_key TEXT;
ALTER TABLE events ADD COLUMN mac TEXT;

-- The one update events allow (setting a new row's chain link) leaves the MAC as written.
DROP TRIGGER events_no_update;
CREATE TRIGGER events_no_update BEFORE UPDATE ON events
WHEN NOT (OLD.chain_seq IS NULL AND NEW.chain_seq IS NOT NULL AND NEW.chain_hash IS NOT NULL
  AND NEW.id = OLD.id AND NEW.run_key = OLD.run_key AND NEW.at = OLD.at AND NEW.kind = OLD.kind
  AND NEW.version = OLD.version AND NEW.actor = OLD.actor
  AND NEW.meta IS OLD.meta AND NEW.detail IS OLD.detail
  AND NEW.mac_key IS OLD.mac_key AND NEW.mac IS OLD.mac)
BEGIN
  SELECT RAISE(ABORT, 'events are append-only');
END;

-- A retention base now records the base link's time and, with the key, a MAC over the
-- base (store.ChainBases), set by the purge in the transaction that deletes the rows:
-- verify accepts a base only when its time was past the retention period, and only
-- under the key, so a writer who deletes a run's first events and moves the base is found.
ALTER TABLE event_chains ADD COLUMN base_at INTEGER;
ALTER TABLE event_chains ADD COLUMN base_mac_key TEXT;
ALTER TABLE event_chains ADD COLUMN base_mac TEXT;
