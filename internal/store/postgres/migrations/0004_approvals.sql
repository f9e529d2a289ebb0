-- Human approval gates: people who may log in, their sessions, the approvals that hold a
-- proposed effect until a decision, and login intents that keep an approval's place
-- across a login without the raw token ever being stored or put in a URL parameter.
CREATE TABLE users (
  id            text PRIMARY KEY,
  name          text NOT NULL UNIQUE,
  password_hash text NOT NULL,
  roles         text NOT NULL,
  created_at    timestamptz NOT NULL,
  disabled_at   timestamptz
);

CREATE TABLE sessions (
  id_hash      text PRIMARY KEY,            -- SHA-256 of the cookie value
  subject      text NOT NULL,
  roles        text NOT NULL,
  created_at   timestamptz NOT NULL,
  last_seen_at timestamptz NOT NULL,
  expires_at   timestamptz NOT NULL          -- absolute
);

CREATE TABLE login_intents (
  id_hash    text PRIMARY KEY,
  token_hash text NOT NULL,
  expires_at timestamptz NOT NULL
);

CREATE TABLE approvals (
  id                   text PRIMARY KEY,
  idempotency_key      text NOT NULL REFERENCES workflow_runs (idempotency_key),
  token_hash           text NOT NULL UNIQUE, -- SHA-256 of the token; the token is never stored
  mode                 text NOT NULL,
  allowed_decisions    text NOT NULL,
  expires_at           timestamptz NOT NULL,
  consumed_at          timestamptz,
  decision             text,
  approver_subject     text,
  reason               text,
  requested_by         text NOT NULL,
  approver_roles       text NOT NULL,
  approver_subjects    text NOT NULL,
  separation_of_duties boolean NOT NULL,
  action_type          text NOT NULL,
  target               text NOT NULL,
  effect_id            text NOT NULL,
  executor             text NOT NULL,
  payload              jsonb,
  payload_hash         text NOT NULL,
  created_at           timestamptz NOT NULL
);
CREATE INDEX approvals_open ON approvals (expires_at) WHERE consumed_at IS NULL;
CREATE INDEX approvals_run ON approvals (idempotency_key);
