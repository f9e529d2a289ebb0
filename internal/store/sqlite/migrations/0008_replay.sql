-- replays: mutating API requests made with an Idempotency-Key (issue 12 item 10). The
-- answer is written in the same transaction as the request's own writes, so a request
-- whose reply was lost after commit is answered again, never run twice. response is
-- sealed (AES-256-GCM) with a key derived from the raw API key, which is stored nowhere:
-- tokens in an answer (approval links) stay unreadable here.
CREATE TABLE replays (
  api_key_id   TEXT NOT NULL,
  route        TEXT NOT NULL,        -- the route pattern: "POST /v1/runs/claim"
  idem_key     TEXT NOT NULL,
  request_hash TEXT NOT NULL,        -- SHA-256 of method, path and body
  attempt      TEXT NOT NULL,        -- the request that holds the record
  done         INTEGER NOT NULL DEFAULT 0,
  status       INTEGER NOT NULL DEFAULT 0,
  response     BLOB,
  created_at   INTEGER NOT NULL,     -- microseconds
  expires_at   INTEGER NOT NULL,
  PRIMARY KEY (api_key_id, route, idem_key)
) STRICT;
CREATE INDEX replays_expires_at ON replays (expires_at);
