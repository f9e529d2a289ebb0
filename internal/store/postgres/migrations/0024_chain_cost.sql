-- The events_chain trigger (0015_chain.sql) at less CPU per event, with the same links
-- (issue 23). airlock_chain_field(v) is an SQL function PostgreSQL inlines, and its body
-- names v three times (IS NULL, octet_length, the bytes): 0015 passed it NEW.meta::text,
-- NEW.detail::text and the epoch arithmetic, so each of those was computed three times
-- per event, jsonb's text output included; with the upsert, that was half the trigger's
-- CPU (pgbench, docs/benchmarks.md). Each is now computed once, into a variable. The
-- canonical content, and so every link, is unchanged: links written by 0015's function
-- and by this one verify as one chain (store.ChainHash; TestChainAcrossTheMigration).
CREATE OR REPLACE FUNCTION events_chain() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  at_us  text := (extract(epoch FROM NEW.at) * 1000000)::bigint::text;
  meta   text := NEW.meta::text;
  detail text := NEW.detail::text;
  body   text := airlock_chain_field(NEW.id::text) || airlock_chain_field(NEW.run_key)
    || airlock_chain_field(at_us) || airlock_chain_field(NEW.kind)
    || airlock_chain_field(NEW.version::text) || airlock_chain_field(NEW.actor)
    || airlock_chain_field(meta) || airlock_chain_field(detail);
BEGIN
  -- '0:' is airlock_chain_field(''), the first link's predecessor.
  INSERT INTO event_chains AS c (run_key, seq, head, started_at)
  VALUES (NEW.run_key, 1, encode(sha256(convert_to('0:' || body, 'UTF8')), 'hex'), NEW.at)
  ON CONFLICT (run_key) DO UPDATE
    SET seq = c.seq + 1,
        head = encode(sha256(convert_to(airlock_chain_field(c.head) || body, 'UTF8')), 'hex')
  RETURNING c.seq, c.head INTO NEW.chain_seq, NEW.chain_hash;
  RETURN NEW;
END $$;
