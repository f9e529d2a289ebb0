-- Every effect carries a version that every statement changing it adds one to.
-- A decision made on a row read earlier (a reconciliation lookup's answer, an operator's
-- "not sent") applies only to that exact row: a re-queue is a compare-and-set on the
-- version it read, so a state that came back round (unknown → pending → sending →
-- unknown) is never mistaken for the one that was looked at.
ALTER TABLE effects ADD COLUMN version INTEGER NOT NULL DEFAULT 1;
