-- Each run's events form a hash chain (issue 22; store/chain.go describes it). The
-- trigger computes an event's link as it is inserted, whatever statement inserts it
-- (the claim's CTE included), and advances the run's head in event_chains: that
-- upsert locks the head row until the transaction ends, so two transactions writing
-- events of one run take turns and read each other's head (READ COMMITTED sees the
-- committed row the upsert waited for). Events from before this migration keep no link.
ALTER TABLE events ADD COLUMN chain_seq bigint, ADD COLUMN chain_hash text;

CREATE TABLE event_chains (
  run_key    text PRIMARY KEY,
  seq        bigint NOT NULL,
  head       text NOT NULL,
  started_at timestamptz NOT NULL,
  -- the last link retention deleted: the kept chain continues from it
  base_seq   bigint NOT NULL DEFAULT 0,
  base_hash  text NOT NULL DEFAULT ''
);

-- One field of the canonical content: its byte length, ':' and its bytes; '-' for NULL.
CREATE FUNCTION airlock_chain_field(v text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE WHEN v IS NULL THEN '-' ELSE octet_length(v)::text || ':' || v END
$$;

CREATE FUNCTION events_chain() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  body text := airlock_chain_field(NEW.id::text) || airlock_chain_field(NEW.run_key)
    || airlock_chain_field((extract(epoch FROM NEW.at) * 1000000)::bigint::text)
    || airlock_chain_field(NEW.kind) || airlock_chain_field(NEW.version::text)
    || airlock_chain_field(NEW.actor) || airlock_chain_field(NEW.meta::text)
    || airlock_chain_field(NEW.detail::text);
BEGIN
  INSERT INTO event_chains AS c (run_key, seq, head, started_at)
  VALUES (NEW.run_key, 1, encode(sha256(convert_to(airlock_chain_field('') || body, 'UTF8')), 'hex'), NEW.at)
  ON CONFLICT (run_key) DO UPDATE
    SET seq = c.seq + 1,
        head = encode(sha256(convert_to(airlock_chain_field(c.head) || body, 'UTF8')), 'hex')
  RETURNING c.seq, c.head INTO NEW.chain_seq, NEW.chain_hash;
  RETURN NEW;
END $$;

CREATE TRIGGER events_chain BEFORE INSERT ON events
  FOR EACH ROW EXECUTE FUNCTION events_chain();
