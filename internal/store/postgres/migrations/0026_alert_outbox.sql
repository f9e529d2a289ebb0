-- Alerts are an outbox (issue 32). An alert used to be raised by the code that wrote its
-- event, after the commit: a lost commit reply or a crash in between lost it. Now every
-- committed alert event leaves a row here, written by a trigger in the transaction that
-- inserts the event, whatever statement inserts it (the claim's and the dispatcher's
-- batched statements included); the relay (internal/alerts) raises each row and deletes
-- it. The row copies what the alert needs, so retention deleting the event first loses
-- nothing; it is not an event, so the hash chain does not cover it.
--
-- Cost: the trigger fires only for kind = 'alert' (the WHEN condition is checked without
-- calling the function), so the other events pay a comparison and nothing else.
CREATE TABLE alert_outbox (
  event_id bigint PRIMARY KEY,
  run_key  text NOT NULL,
  at       timestamptz NOT NULL,
  detail   jsonb
);

CREATE FUNCTION events_alert_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO alert_outbox (event_id, run_key, at, detail) VALUES (NEW.id, NEW.run_key, NEW.at, NEW.detail);
  RETURN NULL;
END $$;

CREATE TRIGGER events_alert_outbox AFTER INSERT ON events
  FOR EACH ROW WHEN (NEW.kind = 'alert') EXECUTE FUNCTION events_alert_outbox();
