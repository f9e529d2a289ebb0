-- writer-level: 3
--
-- A run's chain head in the run's own row (issue 38). Until now every run's head was a
-- row of event_chains: a claim wrote the run's row, its `claimed` event and, through the
-- events_chain trigger, a second table's row and primary-key entry (two WAL records of
-- the claim's thirteen), and the trigger's two statements (an UPDATE that found nothing,
-- then an INSERT in a subtransaction) were a fifth of PostgreSQL's CPU per claim
-- (perf, docs/benchmarks.md). Now:
--
-- * workflow_runs carries the head (chain_seq, chain_head, chain_started_at) and the
--   retention base (chain_base_*; NULL: none), as event_chains did for the run.
-- * The claim statement writes a new run's first link itself: it takes the event's id
--   from the sequence, hashes the event's canonical content as the trigger does (the
--   same SQL functions) and inserts the run with its head and the event with its link,
--   in the one statement. The trigger leaves an event that arrives linked alone; a link
--   it did not compute is checked like every other by `airlock audit verify`, which
--   recomputes each link and names an event written around the head.
-- * Every other event advances its run's head in the run's row (an update of columns no
--   index holds: HOT), or, for a key whose head is in event_chains, there: the heads of
--   runs chained before this migration stay where they are (nothing is rewritten), and
--   keys with no run (the system's "") keep theirs in event_chains. A key's head is in
--   exactly one place: the run's row takes a first link only while event_chains has
--   none for the key.
--
-- Writer level 3: a binary of level 2 reads heads and moves retention bases only in
-- event_chains; beside this schema its purge would delete a run's events without moving
-- the run's base (verify would then report the deletion as tampering).
ALTER TABLE workflow_runs
  ADD COLUMN chain_seq bigint,
  ADD COLUMN chain_head text,
  ADD COLUMN chain_started_at timestamptz,
  ADD COLUMN chain_base_seq bigint,
  ADD COLUMN chain_base_hash text,
  ADD COLUMN chain_base_at timestamptz,
  ADD COLUMN chain_base_mac_key text,
  ADD COLUMN chain_base_mac text;

-- Room on each page for the head's updates to stay HOT (new pages only; no rewrite).
ALTER TABLE workflow_runs SET (fillfactor = 85);

-- On a Citus coordinator the placement pinned this function's search_path
-- (internal/store/postgres/citus.go), and CREATE OR REPLACE drops a function's SET
-- clauses: the settings are read before and set again after (as 0034).
SELECT set_config('airlock.events_chain_config',
  coalesce((SELECT array_to_string(proconfig, E'\n') FROM pg_proc WHERE oid = to_regprocedure('events_chain()')), ''), false);

CREATE OR REPLACE FUNCTION events_chain() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  at_us  text;
  meta   text;
  detail text;
  body   text;
  first  text;
BEGIN
  IF NEW.chain_seq IS NOT NULL THEN
    RETURN NEW; -- linked by the statement that wrote it (a new run's claim)
  END IF;
  -- Each value computed once, into a variable (0024): PostgreSQL inlines
  -- airlock_chain_field only when its argument is that cheap.
  at_us := (extract(epoch FROM NEW.at) * 1000000)::bigint::text;
  meta := NEW.meta::text;
  detail := NEW.detail::text;
  body := airlock_chain_field(NEW.id::text) || airlock_chain_field(NEW.run_key)
    || airlock_chain_field(at_us) || airlock_chain_field(NEW.kind)
    || airlock_chain_field(NEW.version::text) || airlock_chain_field(NEW.actor)
    || airlock_chain_field(meta) || airlock_chain_field(detail);
  LOOP
    UPDATE workflow_runs AS r SET chain_seq = r.chain_seq + 1, chain_head = airlock_chain_next(r.chain_head, body)
    WHERE r.idempotency_key = NEW.run_key AND r.chain_seq IS NOT NULL
    RETURNING r.chain_seq, r.chain_head INTO NEW.chain_seq, NEW.chain_hash;
    EXIT WHEN FOUND;
    UPDATE event_chains AS c SET seq = c.seq + 1, head = airlock_chain_next(c.head, body)
    WHERE c.run_key = NEW.run_key
    RETURNING c.seq, c.head INTO NEW.chain_seq, NEW.chain_hash;
    EXIT WHEN FOUND;
    -- The key's first link. '0:' is airlock_chain_field(''), its predecessor.
    first := encode(sha256(convert_to('0:' || body, 'UTF8')), 'hex');
    UPDATE workflow_runs AS r SET chain_seq = 1, chain_head = first, chain_started_at = NEW.at
    WHERE r.idempotency_key = NEW.run_key AND r.chain_seq IS NULL
    RETURNING r.chain_seq, r.chain_head INTO NEW.chain_seq, NEW.chain_hash;
    EXIT WHEN FOUND;
    -- No run of this key, or one whose first link another writer just took (then round
    -- again: the first UPDATE finds it).
    IF NOT EXISTS (SELECT FROM workflow_runs r WHERE r.idempotency_key = NEW.run_key) THEN
      BEGIN
        INSERT INTO event_chains (run_key, seq, head, started_at)
        VALUES (NEW.run_key, 1, first, NEW.at)
        RETURNING seq, head INTO NEW.chain_seq, NEW.chain_hash;
        EXIT;
      EXCEPTION WHEN unique_violation THEN
        NULL; -- a racing first event of the key committed its row: round again
      END;
    END IF;
  END LOOP;
  RETURN NEW;
END $$;

DO $$
DECLARE c text;
BEGIN
  FOREACH c IN ARRAY coalesce(string_to_array(nullif(current_setting('airlock.events_chain_config', true), ''), E'\n'), '{}'::text[]) LOOP
    EXECUTE 'ALTER FUNCTION events_chain() SET ' || quote_ident(split_part(c, '=', 1)) || ' = ' || substr(c, strpos(c, '=') + 1);
  END LOOP;
  PERFORM set_config('airlock.events_chain_config', '', false);
END $$;
