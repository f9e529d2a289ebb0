-- Decisions in Slack (issue 37). A Slack user decides only as the airlock person they are
-- linked to: slack_links binds (team, user) to a subject, made by an admin (`airlock user
-- link-slack`) or by the person (a one-time code from the console, completed by a signed
-- Slack slash command). account_id is the local account linked (NULL for single sign-on):
-- a link of a removed and re-created account of the same name does not carry over.
CREATE TABLE slack_links (
  team_id    text NOT NULL,
  user_id    text NOT NULL,
  subject    text NOT NULL,
  account_id text,
  linked_at  timestamptz NOT NULL,
  linked_by  text NOT NULL,
  PRIMARY KEY (team_id, user_id)
);
CREATE INDEX slack_links_subject ON slack_links (subject);

-- One-time link codes: only their SHA-256 is stored; one live code per person.
CREATE TABLE slack_link_codes (
  code_hash  text PRIMARY KEY,
  subject    text NOT NULL UNIQUE,
  account_id text,
  expires_at timestamptz NOT NULL
);

-- Signed Slack requests seen within the five minutes a timestamp is accepted (and a
-- margin): the SHA-256 of the signature, so that a replayed request is refused by every
-- instance.
CREATE TABLE slack_requests_seen (
  sig_hash text PRIMARY KEY,
  seen_at  timestamptz NOT NULL
);
CREATE INDEX slack_requests_seen_at ON slack_requests_seen (seen_at);
