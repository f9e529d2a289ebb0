-- The events_chain trigger at fewer WAL records per event (issue 38), with the same
-- links. 0032's upsert (INSERT … ON CONFLICT DO UPDATE) writes, for a run's first event,
-- a speculative insert and its confirmation record, and for every later event a row-lock
-- record before the head's update: ON CONFLICT locks the conflicting row, then updates it.
-- The head is now updated first — a plain UPDATE, which takes the same row lock without a
-- record of its own — and inserted only when the run has none yet, by a plain INSERT: one
-- WAL record fewer per event (claim 14 → 13, queue 15 → 14, an effect's dispatch 24 → 23;
-- TestIndexEntriesPerOperation). Two first events of one run racing (rare: a run's first
-- event is normally its claim's, which the run's own insert orders) meet at event_chains'
-- primary key: the loser's INSERT fails inside the block, which is rolled back, and it
-- updates the row the winner committed, as the upsert did. The block's subtransaction is only entered for a
-- run's first event. Same row lock, same order, same links (TestChainAcrossTheMigration
-- writes with 0015's, 0024's and this function in turn); nothing an older binary writes
-- changes (the chain is the database's): no writer level.
--
-- On a Citus coordinator the placement pinned this function's search_path
-- (internal/store/postgres/citus.go), and CREATE OR REPLACE drops a function's SET
-- clauses: the settings are read before and set again after.
SELECT set_config('airlock.events_chain_config',
  coalesce((SELECT array_to_string(proconfig, E'\n') FROM pg_proc WHERE oid = to_regprocedure('events_chain()')), ''), false);

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
  UPDATE event_chains AS c SET seq = c.seq + 1, head = airlock_chain_next(c.head, body)
  WHERE c.run_key = NEW.run_key
  RETURNING c.seq, c.head INTO NEW.chain_seq, NEW.chain_hash;
  IF NOT FOUND THEN
    BEGIN
      -- '0:' is airlock_chain_field(''), the first link's predecessor.
      INSERT INTO event_chains (run_key, seq, head, started_at)
      VALUES (NEW.run_key, 1, encode(sha256(convert_to('0:' || body, 'UTF8')), 'hex'), NEW.at)
      RETURNING seq, head INTO NEW.chain_seq, NEW.chain_hash;
    EXCEPTION WHEN unique_violation THEN
      UPDATE event_chains AS c SET seq = c.seq + 1, head = airlock_chain_next(c.head, body)
      WHERE c.run_key = NEW.run_key
      RETURNING c.seq, c.head INTO NEW.chain_seq, NEW.chain_hash;
    END;
  END IF;
  RETURN NEW;
END $$;

DO $$
DECLARE c text;
BEGIN
  FOREACH c IN ARRAY coalesce(string_to_array(nullif(current_setting('airlock.events_chain_config', true), ''), E'\n'), '{}'::text[]) LOOP
    -- proconfig holds "name=value", the value in the form SET accepts.
    EXECUTE 'ALTER FUNCTION events_chain() SET ' || quote_ident(split_part(c, '=', 1)) || ' = ' || substr(c, strpos(c, '=') + 1);
  END LOOP;
  PERFORM set_config('airlock.events_chain_config', '', false);
END $$;
