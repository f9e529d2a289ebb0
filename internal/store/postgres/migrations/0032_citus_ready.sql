-- Schema changes for Citus that hold on one PostgreSQL too (issue 36); the placement
-- itself (distributed, reference tables) is done by the migrator on a Citus coordinator
-- only (internal/store/postgres/citus.go).
--
-- The effect counters' deltas carry a run key, so that on Citus the table can
-- be distributed beside effects: the effects triggers fire on the worker that holds the
-- shard they changed, and what they insert must land on that worker. Each statement still
-- inserts one row per state it changed (0018), now with the smallest run key among the
-- rows it counted: every row a shard's statement changed is in that shard, so the delta
-- hashes to the same shard. On one PostgreSQL the key is only carried along; rows written
-- before this migration have ''.
ALTER TABLE effect_count_deltas ADD COLUMN run_key text NOT NULL DEFAULT '';

-- The sums are read from the transition tables into a loop and inserted one row per state
-- with its values: Citus cannot plan an INSERT … SELECT of a distributed table that reads
-- a trigger's transition table (its worker's executor does not see the tuplestore), while
-- an INSERT of values goes to the one shard of its key. A statement still inserts one row
-- per state it changed.
CREATE OR REPLACE FUNCTION effect_count_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE d record;
BEGIN
  FOR d IN SELECT min(idempotency_key) AS k, state, count(*)::integer AS n FROM new_rows GROUP BY state LOOP
    INSERT INTO effect_count_deltas (run_key, state, n) VALUES (d.k, d.state, d.n);
  END LOOP;
  RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION effect_count_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE d record;
BEGIN
  FOR d IN SELECT min(idempotency_key) AS k, state, -count(*)::integer AS n FROM old_rows GROUP BY state LOOP
    INSERT INTO effect_count_deltas (run_key, state, n) VALUES (d.k, d.state, d.n);
  END LOOP;
  RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION effect_count_updated() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE d record;
BEGIN
  FOR d IN SELECT min(k) AS k, state, sum(n)::integer AS n FROM (
      SELECT idempotency_key AS k, state, 1 AS n FROM new_rows
      UNION ALL
      SELECT idempotency_key, state, -1 FROM old_rows) x
    GROUP BY state HAVING sum(n) <> 0 LOOP
    INSERT INTO effect_count_deltas (run_key, state, n) VALUES (d.k, d.state, d.n);
  END LOOP;
  RETURN NULL;
END $$;

-- The hash chain's next head, as an IMMUTABLE function: Citus refuses a function that is
-- not in an INSERT's DO UPDATE SET on a distributed table (event_chains), and convert_to
-- is STABLE. It is immutable in fact: the text's UTF-8 bytes do not depend on settings.
-- The links are unchanged (0024's expression, moved).
CREATE FUNCTION airlock_chain_next(head text, body text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
  SELECT encode(sha256(convert_to(airlock_chain_field(head) || body, 'UTF8')), 'hex')
$$;
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
    SET seq = c.seq + 1, head = airlock_chain_next(c.head, body)
  RETURNING c.seq, c.head INTO NEW.chain_seq, NEW.chain_hash;
  RETURN NEW;
END $$;

-- airlock_now(t): t, or the database's clock when t is NULL — what the statements wrote as
-- coalesce($n::timestamptz, now()). Citus refuses a non-IMMUTABLE function inside
-- COALESCE or CASE in an UPDATE or DELETE of a distributed table; a STABLE function call
-- of its own it evaluates once, on the coordinator, before routing the statement. On one
-- PostgreSQL this SQL function is inlined (the plans are those of the coalesce); on Citus
-- the migrator replaces it with a PL/pgSQL body of the same meaning, which is not inlined
-- (internal/store/postgres/citus.go).
CREATE FUNCTION airlock_now(t timestamptz) RETURNS timestamptz LANGUAGE sql STABLE AS $$
  SELECT coalesce(t, now())
$$;

-- airlock_add_us(t, us): t plus us microseconds, IMMUTABLE (timestamptz + interval is
-- STABLE, for intervals of days and months; one of microseconds does not depend on the
-- time zone). Citus refuses a STABLE function of a column in an UPDATE's SET (the
-- heartbeat's cap: lease_started_at + lifetime). Inlined on one PostgreSQL.
CREATE FUNCTION airlock_add_us(t timestamptz, us bigint) RETURNS timestamptz LANGUAGE sql IMMUTABLE AS $$
  SELECT ((t AT TIME ZONE 'UTC') + us * interval '1 microsecond') AT TIME ZONE 'UTC'
$$;
