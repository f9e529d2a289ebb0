-- When the latest attempt whose outcome was ambiguous began (its send_started_at): a
-- lookup's "none" about that attempt proves nothing until the request can no longer
-- arrive (the action type's settle window, counted from here), and once an attempt was
-- ambiguous no later refusal is taken for "never performed". NULL: no ambiguous attempt,
-- or its absence was proven since (a confirmed "none", an operator's "not sent").
-- Adding a nullable column rewrites nothing.
ALTER TABLE effects ADD COLUMN IF NOT EXISTS ambiguous_at timestamptz;
