-- Outbox v2. Each unknown effect has its own next reconciliation time (with backoff), so
-- effects that can never be settled automatically do not starve newer ones; the due
-- index leads with the action type, since each type is leased up to its own cap.
ALTER TABLE effects ADD COLUMN next_check_at timestamptz;
ALTER TABLE effects ADD COLUMN checks integer NOT NULL DEFAULT 0;
CREATE INDEX effects_unknown_due ON effects (next_check_at) WHERE state = 'unknown';
DROP INDEX effects_due;
CREATE INDEX effects_due ON effects (executor, action_type, not_before) WHERE state = 'pending';
