-- The effect counters at the cost of a statement, not of a row (issue 23).
--
-- 0010_cost.sql's triggers ran a PL/pgSQL function and inserted two delta rows for every
-- row whose state changed: a lease or a group of outcomes of N effects cost N calls and
-- 2N rows. These fire once per statement and insert one delta row per state the
-- statement changed, summed from its transition tables: (rows now in a state) − (rows
-- that were in it). A statement that changes no state (a begin-mark, a reconciliation
-- check) inserts nothing. The sums are those of the row triggers, so the counts stay
-- exact. PostgreSQL allows transition tables only for a trigger of one event, without a
-- column list: three triggers.
DROP TRIGGER effects_count_insert_delete ON effects;
DROP TRIGGER effects_count_update ON effects;
DROP FUNCTION effect_count_delta();

CREATE FUNCTION effect_count_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO effect_count_deltas (state, n) SELECT state, count(*) FROM new_rows GROUP BY state;
  RETURN NULL;
END $$;
CREATE FUNCTION effect_count_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO effect_count_deltas (state, n) SELECT state, -count(*) FROM old_rows GROUP BY state;
  RETURN NULL;
END $$;
CREATE FUNCTION effect_count_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO effect_count_deltas (state, n)
  SELECT state, sum(n) FROM (
    SELECT state, 1 AS n FROM new_rows
    UNION ALL
    SELECT state, -1 FROM old_rows) d
  GROUP BY state HAVING sum(n) <> 0;
  RETURN NULL;
END $$;
CREATE TRIGGER effects_count_insert AFTER INSERT ON effects
  REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION effect_count_inserted();
CREATE TRIGGER effects_count_delete AFTER DELETE ON effects
  REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION effect_count_deleted();
CREATE TRIGGER effects_count_update AFTER UPDATE ON effects
  REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION effect_count_updated();
