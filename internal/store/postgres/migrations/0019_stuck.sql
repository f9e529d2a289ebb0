-- Stuck approvals (issue 22): the expiry warning and the escalation are each claimed
-- once by a compare-and-set on their column (warned_at, escalated_at), so of several
-- instances exactly one notifies; undecidable_since marks an episode in which nobody
-- known could decide the approval (one event per episode). people_seen remembers who
-- signed in by single sign-on, with the roles they last had, since airlock keeps no
-- account for them.
ALTER TABLE approvals ADD COLUMN warn_at timestamptz;
ALTER TABLE approvals ADD COLUMN warned_at timestamptz;
ALTER TABLE approvals ADD COLUMN escalate_at timestamptz;
ALTER TABLE approvals ADD COLUMN escalated_at timestamptz;
ALTER TABLE approvals ADD COLUMN escalation_roles text NOT NULL DEFAULT '';
ALTER TABLE approvals ADD COLUMN undecidable_since timestamptz;
CREATE INDEX IF NOT EXISTS approvals_warn_due ON approvals (warn_at) WHERE consumed_at IS NULL AND warned_at IS NULL AND warn_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS approvals_escalate_due ON approvals (escalate_at) WHERE consumed_at IS NULL AND escalated_at IS NULL AND escalate_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS approvals_undecidable ON approvals (created_at, id) WHERE consumed_at IS NULL AND undecidable_since IS NOT NULL;
CREATE TABLE IF NOT EXISTS people_seen (
  subject text PRIMARY KEY,
  roles   text NOT NULL,
  seen_at timestamptz NOT NULL
);
