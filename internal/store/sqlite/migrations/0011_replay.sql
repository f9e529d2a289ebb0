-- replays: answers to mutating API requests made with an Idempotency-Key,
-- written in the same transaction as the request's own writes: a request whose
-- reply was lost after commit is answered again, never run twice, and one that did not
-- commit left nothing. response is sealed (AES-256-GCM) with a key derived from the raw
-- API key, which is stored nowhere: tokens in an answer (approval links) stay unreadable.
CREATE TABLE replays (
  api_key_id   TEXT NOT NULL,
  route        TEXT NOT NULL,        -- the route pattern: "POST /v1/runs/claim"
  idem_key     TEXT NOT NULL,
  request_hash TEXT NOT NULL,        -- SHA-256 of method, path and body
  status       INTEGER NOT NULL,
  response     BLOB NOT NULL,
  created_at   INTEGER NOT NULL,     -- microseconds
  expires_at   INTEGER NOT NULL,
  PRIMARY KEY (api_key_id, route, idem_key)
) STRICT;
CREATE INDEX replays_expires_at ON replays (expires_at);
