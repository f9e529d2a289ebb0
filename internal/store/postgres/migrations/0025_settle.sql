-- When the latest attempt whose outcome was ambiguous began (its send_started_at): a
-- lookup's "none" about that attempt proves nothing until the request can no longer
-- arrive (the action type's settle window, counted from here), and once an attempt was
-- ambiguous no later refusal is taken for "never performed". NULL: no ambiguous attempt,
-- or its absence was proven since (a confirmed "none", an operator's "not sent").
-- Adding a nullable column rewrites nothing.
ALTER TABLE effects ADD COLUMN IF NOT EXISTS ambiguous_at timestamptz;

-- When a confirmed "none" (two authoritative lookups, a settle window apart) queued the
-- effect again: its resend, once completed, is looked up once more a settle window later
-- (next_check_at on a completed row), and two records raise reconcile_several — a first
-- request stalled past the window and performed after all is then seen, not silent.
ALTER TABLE effects ADD COLUMN IF NOT EXISTS none_confirmed_at timestamptz;
CREATE INDEX IF NOT EXISTS effects_recheck_due ON effects (next_check_at)
  WHERE state = 'completed' AND next_check_at IS NOT NULL;
