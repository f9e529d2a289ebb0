-- readiness: one row per airlock instance, rewritten by each readiness check (/readyz,
-- at most once a second per instance, and once at start) in a transaction that commits.
-- A rolled-back write proved nothing: it needs no disk space, so a
-- full disk passed it while real writes failed. Rows of instances silent for a day are
-- removed by the same check. Numbered 0014: 0013 is another branch's.
-- checks counts them: the row's bytes change on every check even when the clock has not
-- moved (SQLite skips a write of the same bytes, which then proves nothing either).
CREATE TABLE readiness (
  instance   text PRIMARY KEY,   -- host name and a per-process id
  checked_at timestamptz NOT NULL,
  checks     bigint NOT NULL DEFAULT 1
);
