-- Sign-in hardening.
-- signin_throttle: the backoff of one account or one client (key: "account:" or
-- "client:" + SHA-256 of the name or address), shared by every process on the file.
CREATE TABLE signin_throttle (
  key        TEXT PRIMARY KEY,
  failures   INTEGER NOT NULL,
  next_at    INTEGER NOT NULL,   -- no attempt before this
  updated_at INTEGER NOT NULL
) STRICT;

-- site_secrets: keys generated here, at migrate (randomblob is SQLite's CSPRNG);
-- intent_cookie seals the approval intent cookie (AES-256-GCM), so keeping an
-- approval's place across a sign-in writes nothing.
CREATE TABLE site_secrets (
  name  TEXT PRIMARY KEY,
  value BLOB NOT NULL
) STRICT;
INSERT INTO site_secrets (name, value) VALUES ('intent_cookie', randomblob(32));

DROP TABLE login_intents;

-- A session of a local account names it, so disabling the account, changing its roles
-- or its password ends its sessions at once. Single sign-on sessions have none.
-- Sessions from before this migration name no account: they end here (sign in again once).
DELETE FROM sessions;
ALTER TABLE sessions ADD COLUMN user_id TEXT;
CREATE INDEX sessions_user_id ON sessions (user_id) WHERE user_id IS NOT NULL;
