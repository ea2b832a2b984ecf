-- Postlane 0008: provider failover and status callbacks (see the PostgreSQL migration for
-- what each table is for).
CREATE TABLE postlane_delivery_routes (
    delivery_id INTEGER PRIMARY KEY,
    provider    TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    pinned      INTEGER NOT NULL DEFAULT 0,
    updated_at  REAL NOT NULL
);

CREATE TABLE postlane_callback_endpoints (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    url         TEXT NOT NULL,
    secret      TEXT NOT NULL,
    api_key_id  INTEGER,
    events      TEXT NOT NULL DEFAULT '*',
    created_at  REAL NOT NULL,
    disabled_at REAL
);

CREATE TABLE postlane_callbacks (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    endpoint_id  INTEGER NOT NULL REFERENCES postlane_callback_endpoints (id) ON DELETE CASCADE,
    event_id     INTEGER NOT NULL,
    delivery_id  INTEGER NOT NULL,
    type         TEXT NOT NULL,
    payload      TEXT NOT NULL,
    state        TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'sent', 'dead')),
    attempts     INTEGER NOT NULL DEFAULT 0,
    run_at       REAL NOT NULL,
    last_error   TEXT,
    created_at   REAL NOT NULL,
    finished_at  REAL,
    replay_count INTEGER NOT NULL DEFAULT 0,
    CONSTRAINT postlane_callbacks_once UNIQUE (endpoint_id, event_id)
);
CREATE INDEX postlane_callbacks_due ON postlane_callbacks (run_at, id) WHERE state = 'pending';
CREATE INDEX postlane_callbacks_delivery ON postlane_callbacks (delivery_id);

-- Enqueued with the timeline event that causes them, in its transaction. SQLite triggers
-- are per row: the WHEN clause keeps every other event (claims, retries) out of it.
CREATE TRIGGER postlane_events_callbacks
AFTER INSERT ON postlane_events
WHEN NEW.state IN ('sent', 'dead', 'expired', 'suppressed')
  OR NEW.kind IN ('provider:bounced', 'provider:complained')
BEGIN
    INSERT OR IGNORE INTO postlane_callbacks
        (endpoint_id, event_id, delivery_id, type, payload, run_at, created_at)
    SELECT e.id, NEW.id, NEW.delivery_id, t.type, json_object(
        'type', t.type,
        'timestamp', strftime('%Y-%m-%dT%H:%M:%fZ', NEW.at, 'unixepoch'),
        'data', json_object(
            'event_id', 'evt_' || NEW.id,
            'delivery_id', NEW.delivery_id,
            'key', d.idempotency_key,
            'lane', d.lane,
            'state', d.state,
            'provider', json_extract(NEW.data, '$.provider'),
            'provider_message_id', d.provider_message_id,
            'cause', COALESCE(json_extract(NEW.data, '$.response'),
                              json_extract(NEW.data, '$.why'),
                              json_extract(NEW.data, '$.reason'),
                              json_extract(NEW.data, '$.bounce_type'), d.dead_reason),
            'dead_reason', CASE WHEN NEW.state IN ('dead', 'expired') THEN d.dead_reason END,
            'attempt', json_extract(NEW.data, '$.attempt'))),
        NEW.at, NEW.at
    FROM (SELECT CASE
            WHEN NEW.state = 'sent' THEN 'delivery.sent'
            WHEN NEW.state IN ('dead', 'expired') THEN 'delivery.dead_lettered'
            WHEN NEW.state = 'suppressed' THEN 'delivery.suppressed'
            WHEN NEW.kind = 'provider:bounced' THEN 'delivery.bounced'
            ELSE 'delivery.complained' END AS type) t
    JOIN postlane_deliveries d ON d.id = NEW.delivery_id
    JOIN postlane_callback_endpoints e
      ON e.disabled_at IS NULL
     AND (e.api_key_id IS NULL OR d.producer = 'apikey:' || e.api_key_id)
     AND (e.events = '*' OR instr(',' || e.events || ',', ',' || t.type || ',') > 0);
END;
