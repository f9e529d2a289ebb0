-- writer-level: 1
--
-- Which writers may run (issue 40); postgres/migrations/0027_writer_level.sql says why.
-- writer_level holds one row, raised by the migrator for each migration whose first line
-- is "-- writer-level: N".
CREATE TABLE writer_level (
  only_row INTEGER PRIMARY KEY CHECK (only_row = 1),
  level    INTEGER NOT NULL
) STRICT;
INSERT INTO writer_level (only_row, level) VALUES (1, 0);

CREATE TABLE instances (
  id         TEXT PRIMARY KEY,
  hostname   TEXT NOT NULL,
  pid        INTEGER NOT NULL,
  version    TEXT NOT NULL,
  level      INTEGER NOT NULL,
  role       TEXT NOT NULL,
  dispatch   INTEGER NOT NULL,  -- 0 or 1
  started_at INTEGER NOT NULL,  -- microseconds
  last_seen  INTEGER NOT NULL   -- microseconds
) STRICT;
