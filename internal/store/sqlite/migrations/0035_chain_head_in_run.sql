-- writer-level: 3
--
-- Nothing changes in SQLite's schema. On PostgreSQL, 0035 moves a run's chain head into
-- the run's row, and a binary of level 2 would purge events there without moving their
-- run's retention base; the writer level is the binary's, one number for both backends
-- (TestWriterLevelFollowsMigrations), so SQLite's schema says level 3 too.
SELECT 1;
