-- The effect counters count only the states an effect can stay in for good: completed,
-- failed, cancelled (and planned, an agent's intent, which may never be confirmed). The
-- others — pending, sending, unknown — are counted at a scrape from the partial indexes
-- that hold exactly their rows (effects_due, effects_sending, effects_unknown_due), which
-- the dispatcher and the reconciler read anyway (issue 38).
--
-- Before, every statement that changed an effect's state appended one delta row per state
-- it changed, and the next scrape's compaction deleted it: a queue wrote one (pending), a
-- lease two (pending, sending), an outcome two (sending, completed) — ten WAL records of
-- an effect's life when each statement carries one effect (TestIndexEntriesPerOperation),
-- about 1.8 per effect at 32 in flight. Now a queue and a lease write none and an outcome
-- one (completed, failed or cancelled). The counts stay exact (read in one snapshot); what
-- changes is a scrape's cost: it follows the effects that are open — a backlog of 100,000
-- pending costs 12–60 ms to count (docs/benchmarks.md) — instead of being the same at
-- any size. History (settled effects) still costs a scrape nothing.
--
-- The trigger functions keep their names and triggers. On a Citus coordinator the
-- placement pinned their search_path (internal/store/postgres/citus.go), which CREATE OR
-- REPLACE drops: each function's settings are read before and set again after (as 0035
-- does for the chain's). Delta rows and totals of the states now counted from the indexes
-- are removed (a writer of the old functions that commits after this migration can still
-- leave a few: the read and the compaction ignore those states). No writer level: the
-- triggers are the database's; an older instance's /metrics reads the old totals of the
-- open states (stale) until it is replaced.
SELECT set_config('airlock.count_functions_config', coalesce((
  SELECT string_agg(p.oid::regprocedure::text || E'\t' || c, E'\n')
  FROM pg_proc p CROSS JOIN LATERAL unnest(p.proconfig) AS c
  WHERE p.oid IN (to_regprocedure('effect_count_inserted()'), to_regprocedure('effect_count_deleted()'),
                  to_regprocedure('effect_count_updated()'))), ''), false);

CREATE OR REPLACE FUNCTION effect_count_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE d record;
BEGIN
  FOR d IN SELECT min(idempotency_key) AS k, state, count(*)::integer AS n FROM new_rows
    WHERE state IN ('completed', 'failed', 'cancelled', 'planned') GROUP BY state LOOP
    INSERT INTO effect_count_deltas (run_key, state, n) VALUES (d.k, d.state, d.n);
  END LOOP;
  RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION effect_count_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE d record;
BEGIN
  FOR d IN SELECT min(idempotency_key) AS k, state, -count(*)::integer AS n FROM old_rows
    WHERE state IN ('completed', 'failed', 'cancelled', 'planned') GROUP BY state LOOP
    INSERT INTO effect_count_deltas (run_key, state, n) VALUES (d.k, d.state, d.n);
  END LOOP;
  RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION effect_count_updated() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE d record;
BEGIN
  FOR d IN SELECT min(k) AS k, state, sum(n)::integer AS n FROM (
      SELECT idempotency_key AS k, state, 1 AS n FROM new_rows
      WHERE state IN ('completed', 'failed', 'cancelled', 'planned')
      UNION ALL
      SELECT idempotency_key, state, -1 FROM old_rows
      WHERE state IN ('completed', 'failed', 'cancelled', 'planned')) x
    GROUP BY state HAVING sum(n) <> 0 LOOP
    INSERT INTO effect_count_deltas (run_key, state, n) VALUES (d.k, d.state, d.n);
  END LOOP;
  RETURN NULL;
END $$;

DO $$
DECLARE
  l text;
  c text;
BEGIN
  FOREACH l IN ARRAY coalesce(string_to_array(nullif(current_setting('airlock.count_functions_config', true), ''), E'\n'), '{}'::text[]) LOOP
    c := split_part(l, E'\t', 2);
    EXECUTE 'ALTER FUNCTION ' || split_part(l, E'\t', 1) || ' SET ' || quote_ident(split_part(c, '=', 1)) || ' = ' || substr(c, strpos(c, '=') + 1);
  END LOOP;
  PERFORM set_config('airlock.count_functions_config', '', false);
END $$;

DELETE FROM effect_count_deltas WHERE state NOT IN ('completed', 'failed', 'cancelled', 'planned');
DELETE FROM effect_counts WHERE state NOT IN ('completed', 'failed', 'cancelled', 'planned');
