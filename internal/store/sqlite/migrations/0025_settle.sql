-- When the latest attempt whose outcome was ambiguous began (see the PostgreSQL
-- migration): microseconds since the epoch, as every time here; NULL when none was, or
-- its absence was proven since.
ALTER TABLE effects ADD COLUMN ambiguous_at INTEGER;

-- When a confirmed "none" queued the effect again: its resend, once completed, is looked
-- up once more (see the PostgreSQL migration).
ALTER TABLE effects ADD COLUMN none_confirmed_at INTEGER;
CREATE INDEX IF NOT EXISTS effects_recheck_due ON effects (next_check_at)
  WHERE state = 'completed' AND next_check_at IS NOT NULL;
