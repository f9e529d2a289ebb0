-- Decisions in Slack (issue 37): see the PostgreSQL migration of the same number. Times
-- are microseconds since the epoch, as elsewhere in this backend.
CREATE TABLE slack_links (
  team_id    TEXT NOT NULL,
  user_id    TEXT NOT NULL,
  subject    TEXT NOT NULL,
  account_id TEXT,
  linked_at  INTEGER NOT NULL,
  linked_by  TEXT NOT NULL,
  PRIMARY KEY (team_id, user_id)
) STRICT;
CREATE INDEX slack_links_subject ON slack_links (subject);

CREATE TABLE slack_link_codes (
  code_hash  TEXT PRIMARY KEY,
  subject    TEXT NOT NULL UNIQUE,
  account_id TEXT,
  expires_at INTEGER NOT NULL
) STRICT;

CREATE TABLE slack_requests_seen (
  sig_hash TEXT PRIMARY KEY,
  seen_at  INTEGER NOT NULL
) STRICT;
CREATE INDEX slack_requests_seen_at ON slack_requests_seen (seen_at);
