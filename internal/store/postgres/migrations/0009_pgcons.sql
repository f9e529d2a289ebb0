-- Events record the transaction that wrote them. Identity values are taken when a row is
-- inserted, not when its transaction commits: a reader paging by id alone could pass an
-- id whose transaction commits later and skip that event for good. EventList returns only
-- events of transactions older than the oldest one still in flight, ordered by
-- (transaction, id), so a page never passes an event that can still appear.
-- Existing rows get 0: they all committed long ago and sort first, by id.
ALTER TABLE events ADD COLUMN xid xid8 NOT NULL DEFAULT '0';
ALTER TABLE events ALTER COLUMN xid SET DEFAULT pg_current_xact_id();
CREATE INDEX events_run_key_xid_id ON events (run_key, xid, id);
DROP INDEX events_run_key_id;
