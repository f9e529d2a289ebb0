-- Stuck approvals (issue 22): see the PostgreSQL migration of the same number. Times are
-- microseconds since the epoch, as elsewhere in this backend.
ALTER TABLE approvals ADD COLUMN warn_at INTEGER;
ALTER TABLE approvals ADD COLUMN warned_at INTEGER;
ALTER TABLE approvals ADD COLUMN escalate_at INTEGER;
ALTER TABLE approvals ADD COLUMN escalated_at INTEGER;
ALTER TABLE approvals ADD COLUMN escalation_roles TEXT NOT NULL DEFAULT '';
ALTER TABLE approvals ADD COLUMN undecidable_since INTEGER;
CREATE INDEX IF NOT EXISTS approvals_warn_due ON approvals (warn_at) WHERE consumed_at IS NULL AND warned_at IS NULL AND warn_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS approvals_escalate_due ON approvals (escalate_at) WHERE consumed_at IS NULL AND escalated_at IS NULL AND escalate_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS approvals_undecidable ON approvals (created_at, id) WHERE consumed_at IS NULL AND undecidable_since IS NOT NULL;
CREATE TABLE IF NOT EXISTS people_seen (
  subject TEXT PRIMARY KEY,
  roles   TEXT NOT NULL,
  seen_at INTEGER NOT NULL
) STRICT;
