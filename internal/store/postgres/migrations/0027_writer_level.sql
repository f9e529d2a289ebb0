-- writer-level: 1
--
-- Which writers may run (issue 40). writer_level holds one row: the level of the rules
-- every writer must follow on this schema. A migration that adds a fence or changes what
-- a writer must do says so in its first line ("-- writer-level: N"); the migrator raises
-- the row to N in the same transaction, and a binary whose own level
-- (store.WriterLevel) is below it writes nothing. Level 1 is this migration's: writers
-- that bump effects.version on every change (0013), keep the event chains when they
-- purge (0015), schedule approvals' warnings and escalations (0019), and register here.
-- Binaries from before this migration do not read the level: they are stopped or
-- drained by the documented procedure (docs/deployment.md, "Upgrades").
CREATE TABLE writer_level (
  only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
  level    integer NOT NULL
);
INSERT INTO writer_level (level) VALUES (0);

-- instances: every process that writes (serve, and CLI commands that write) while it
-- runs, rewritten by its heartbeat; removed on a clean exit. `airlock migrate` refuses
-- to raise the level while a lower-level row was seen recently; rows silent for a day
-- are removed by the heartbeats of others.
CREATE TABLE instances (
  id         text PRIMARY KEY,     -- host name and a per-process id
  hostname   text NOT NULL,
  pid        integer NOT NULL,
  version    text NOT NULL,        -- internal/version
  level      integer NOT NULL,     -- the writer level the binary implements
  role       text NOT NULL,        -- serve, or the CLI command
  dispatch   boolean NOT NULL,     -- runs the dispatcher and reconciliation
  started_at timestamptz NOT NULL,
  last_seen  timestamptz NOT NULL
);
