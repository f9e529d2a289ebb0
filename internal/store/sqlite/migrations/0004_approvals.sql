-- Human approval gates: people who may log in, their sessions, the approvals that hold a
-- proposed effect until a decision, and login intents that keep an approval's place
-- across a login without the raw token ever being stored or put in a URL parameter.
CREATE TABLE users (
  id            TEXT PRIMARY KEY,
  name          TEXT NOT NULL UNIQUE,
  password_hash TEXT NOT NULL,
  roles         TEXT NOT NULL,
  created_at    INTEGER NOT NULL,
  disabled_at   INTEGER
) STRICT;

CREATE TABLE sessions (
  id_hash      TEXT PRIMARY KEY,            -- SHA-256 of the cookie value
  subject      TEXT NOT NULL,
  roles        TEXT NOT NULL,
  created_at   INTEGER NOT NULL,
  last_seen_at INTEGER NOT NULL,
  expires_at   INTEGER NOT NULL          -- absolute
) STRICT;

CREATE TABLE login_intents (
  id_hash    TEXT PRIMARY KEY,
  token_hash TEXT NOT NULL,
  expires_at INTEGER NOT NULL
) STRICT;

CREATE TABLE approvals (
  id                   TEXT PRIMARY KEY,
  idempotency_key      TEXT NOT NULL REFERENCES workflow_runs (idempotency_key),
  token_hash           TEXT NOT NULL UNIQUE, -- SHA-256 of the token; the token is never stored
  mode                 TEXT NOT NULL,
  allowed_decisions    TEXT NOT NULL,
  expires_at           INTEGER NOT NULL,
  consumed_at          INTEGER,
  decision             TEXT,
  approver_subject     TEXT,
  reason               TEXT,
  requested_by         TEXT NOT NULL,
  approver_roles       TEXT NOT NULL,
  approver_subjects    TEXT NOT NULL,
  separation_of_duties INTEGER NOT NULL,
  action_type          TEXT NOT NULL,
  target               TEXT NOT NULL,
  effect_id            TEXT NOT NULL,
  executor             TEXT NOT NULL,
  payload              TEXT,
  payload_hash         TEXT NOT NULL,
  created_at           INTEGER NOT NULL
) STRICT;
CREATE INDEX approvals_open ON approvals (expires_at) WHERE consumed_at IS NULL;
CREATE INDEX approvals_run ON approvals (idempotency_key);
