-- The outcome statement of a dispatcher's group (EffectUpdateManyLocked, one PostgreSQL)
-- links the events it inserts itself, as the claim does its run's first (0035), and the
-- events_chain trigger is no longer entered for an event that arrives linked (issue 38).
-- Until now each of the statement's events went through the trigger, whose update of its
-- run's head (a PL/pgSQL statement per event, ~0.1 ms each under the capacity load,
-- pg_stat_statements) was a large share of PostgreSQL's CPU per effect. The statement has
-- already locked the runs (FOR UPDATE, which returns each run's latest committed head):
-- it takes the events' ids from the sequence, hashes each event's content as the trigger
-- does, chains the events of one run in id order from the head it locked, and writes each
-- run's new head once. airlock_chain_fold is that chaining, an aggregate used as a window
-- function (PARTITION BY run ORDER BY id): its first argument is the run's head (the
-- first link's predecessor), its second each event's body; the value after an event is
-- its link, airlock_chain_next(previous link, body), exactly the trigger's.
--
-- No writer level: what a link is does not change (store.ChainHash recomputes both kinds;
-- TestOutcomeLinksItsOwnEvents), and a binary of level 3 without this statement writes
-- its events with chain_seq NULL, which the trigger links as before — it takes the same
-- run lock, and the head it reads and writes is the same row's.
CREATE FUNCTION airlock_chain_step(state text, start text, body text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  RETURN airlock_chain_next(coalesce(state, start), body);
END $$;

CREATE AGGREGATE airlock_chain_fold(text, text) (SFUNC = airlock_chain_step, STYPE = text);

-- The trigger again, entered only for an event with no link: the claim's first event and
-- the outcome statement's are linked by the statement that writes them, and no longer
-- pay for a PL/pgSQL call that returns at once. The function is unchanged (its own test
-- of NEW.chain_seq stays, for a trigger declared by an older migration), and so is its
-- pinned search_path on a Citus coordinator: DROP and CREATE TRIGGER do not touch a
-- function's settings. Citus propagates a trigger on a distributed table to its shards
-- only with citus.enable_unsafe_triggers on (as the placement sets it, citus.go), set here
-- for this transaction, and it sends the trigger's DDL to the workers as the text of the
-- command it came in: the migration is one multi-command string, which the workers refuse
-- ("cannot insert multiple commands into a prepared statement";
-- TestChainTriggerWhenAfterPlacement), so each command is EXECUTEd on its own.
SELECT set_config('citus.enable_unsafe_triggers', 'on', true) FROM pg_extension WHERE extname = 'citus';

DO $$
BEGIN
  EXECUTE 'DROP TRIGGER events_chain ON events';
  EXECUTE 'CREATE TRIGGER events_chain BEFORE INSERT ON events
    FOR EACH ROW WHEN (NEW.chain_seq IS NULL) EXECUTE FUNCTION events_chain()';
END $$;
