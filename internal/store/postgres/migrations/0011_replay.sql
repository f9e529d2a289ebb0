-- replays: answers to mutating API requests made with an Idempotency-Key,
-- written in the same transaction as the request's own writes: a request whose
-- reply was lost after commit is answered again, never run twice, and one that did not
-- commit left nothing. response is sealed (AES-256-GCM) with a key derived from the raw
-- API key, which is stored nowhere: tokens in an answer (approval links) stay unreadable.
CREATE TABLE replays (
  api_key_id   text NOT NULL,
  route        text NOT NULL,        -- the route pattern: "POST /v1/runs/claim"
  idem_key     text NOT NULL,
  request_hash text NOT NULL,        -- SHA-256 of method, path and body
  status       integer NOT NULL,
  response     bytea NOT NULL,
  created_at   timestamptz NOT NULL,
  expires_at   timestamptz NOT NULL,
  PRIMARY KEY (api_key_id, route, idem_key)
);
CREATE INDEX replays_expires_at ON replays (expires_at);
