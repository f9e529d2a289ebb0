-- writer-level: 2
--
-- Each event's MAC (issue 33; store/mac.go): computed by airlock with the audit key,
-- which the database never sees, so a row inserted or rewritten with SQL alone fails
-- `airlock audit verify`. mac_key is the key's id (keys rotate), mac the nonce and the
-- HMAC. Both stay NULL for events written without a key, and for every event from
-- before this migration: verify counts those as unkeyed. Level 2: a writer with an audit
-- key configured seals every event it writes; a binary from before this migration cannot,
-- and would leave unkeyed events in a keyed trail, so it writes nothing here.
ALTER TABLE events ADD COLUMN mac_key text, ADD COLUMN mac text;

-- A retention base now records the base link's time and, with the key, a MAC over the
-- base (store.ChainBases), set by the purge in the transaction that deletes the rows:
-- verify accepts a base only when its time was past the retention period, and only
-- under the key, so a writer who deletes a run's first events and moves the base is found.
ALTER TABLE event_chains ADD COLUMN base_at timestamptz, ADD COLUMN base_mac_key text,
  ADD COLUMN base_mac text;
