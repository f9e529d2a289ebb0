-- airlock_chain_next (0032) in PL/pgSQL, with the same body and result. As an SQL
-- function it is never inlined — it is IMMUTABLE (Citus needs that in an UPDATE's SET) and
-- its body calls convert_to, which is STABLE, and PostgreSQL inlines a function only when
-- its body is no more volatile than it is declared — so each call ran its body as a query
-- of its own, planned again for each statement that called it: every event after a run's
-- first (the events_chain trigger's head update) paid about 20 µs for it. PL/pgSQL keeps
-- the expression's plan for the session: the head's update costs 28–37 µs instead of
-- 45–65 µs (a loop of 1,000 updates of distinct runs' heads, docs/benchmarks.md). The
-- links are unchanged (TestChainAcrossTheMigration, TestChainEveryPathLinked: each
-- against store.ChainHash). The chain is the database's: no writer level.
CREATE OR REPLACE FUNCTION airlock_chain_next(head text, body text) RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  RETURN encode(sha256(convert_to(airlock_chain_field(head) || body, 'UTF8')), 'hex');
END $$;
