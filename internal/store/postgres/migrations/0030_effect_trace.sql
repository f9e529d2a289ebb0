-- The W3C traceparent of the request that queued an effect (issue 37 item 9): the
-- dispatcher sends the effect in that trace, so one trace goes agent → airlock →
-- provider. '' when the request carried none. Expand-only (a constant default: no table
-- rewrite); an old binary writes '' and never reads it.
ALTER TABLE effects ADD COLUMN trace_parent TEXT NOT NULL DEFAULT '';
