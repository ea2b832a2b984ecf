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

-- The trigger that fills postlane_callbacks is created with the first active endpoint and
-- dropped with the last one (store/sqlite/_callbacks.py): a row trigger costs SQLite about
-- 3 µs on every event insert, even one its WHEN clause skips, and every claim, ack and
-- enqueue writes events.
