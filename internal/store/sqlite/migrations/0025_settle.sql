-- When the latest attempt whose outcome was ambiguous began (see the PostgreSQL
-- migration): microseconds since the epoch, as every time here; NULL when none was, or
-- its absence was proven since.
ALTER TABLE effects ADD COLUMN ambiguous_at INTEGER;
