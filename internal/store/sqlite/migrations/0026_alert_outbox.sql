-- Alerts are an outbox (issue 32): every committed alert event leaves a row here, written
-- by a trigger in the transaction that inserts the event; the relay (internal/alerts)
-- raises each row and deletes it, so a lost commit reply or a crash between the commit
-- and the raise no longer loses an alert. The row copies what the alert needs (retention
-- may delete the event first) and is not an event: the hash chain does not cover it.
-- The trigger fires only for kind = 'alert'.
CREATE TABLE alert_outbox (
  event_id INTEGER PRIMARY KEY,
  run_key  TEXT NOT NULL,
  at       INTEGER NOT NULL,
  detail   TEXT
) STRICT;

CREATE TRIGGER events_alert_outbox AFTER INSERT ON events WHEN NEW.kind = 'alert'
BEGIN
  INSERT INTO alert_outbox (event_id, run_key, at, detail) VALUES (NEW.id, NEW.run_key, NEW.at, NEW.detail);
END;
