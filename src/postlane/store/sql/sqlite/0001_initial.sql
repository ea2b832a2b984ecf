-- Postlane 0001: deliveries, their timeline and dead letters. Times are REAL unix seconds.
CREATE TABLE postlane_deliveries (
    id                  INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key     TEXT NOT NULL,
    lane                TEXT NOT NULL,
    channel             TEXT NOT NULL DEFAULT 'email',
    recipient           TEXT NOT NULL,
    sender              TEXT,
    subject             TEXT NOT NULL DEFAULT '',
    text_body           TEXT,
    html_body           TEXT,
    headers             TEXT NOT NULL DEFAULT '{}',
    metadata            TEXT NOT NULL DEFAULT '{}',
    import_id           TEXT,
    template_id         TEXT,
    template_version    INTEGER,
    state               TEXT NOT NULL DEFAULT 'pending'
        CHECK (state IN ('pending', 'sending', 'sent', 'ambiguous', 'dead', 'expired',
                          'cancelled', 'suppressed')),
    attempts            INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    claims              INTEGER NOT NULL DEFAULT 0,
    run_at              REAL NOT NULL,
    expires_at          REAL,
    lease_owner         TEXT,
    lease_expires_at    REAL,
    attempt_started_at  REAL,
    provider_message_id TEXT,
    dead_reason         TEXT,
    last_error          TEXT,
    created_at          REAL NOT NULL,
    updated_at          REAL NOT NULL,
    sent_at             REAL,
    finished_at         REAL,
    CONSTRAINT postlane_deliveries_key UNIQUE (idempotency_key),
    CONSTRAINT postlane_deliveries_lease CHECK ((state = 'sending') = (lease_owner IS NOT NULL))
);

CREATE INDEX postlane_deliveries_ready ON postlane_deliveries (lane, run_at, id)
    WHERE state = 'pending';
CREATE INDEX postlane_deliveries_leased ON postlane_deliveries (lease_expires_at)
    WHERE state = 'sending';
CREATE INDEX postlane_deliveries_finished ON postlane_deliveries (finished_at)
    WHERE finished_at IS NOT NULL;
CREATE INDEX postlane_deliveries_recipient ON postlane_deliveries (recipient);
CREATE INDEX postlane_deliveries_import ON postlane_deliveries (import_id)
    WHERE import_id IS NOT NULL;
CREATE INDEX postlane_deliveries_provider_id ON postlane_deliveries (provider_message_id)
    WHERE provider_message_id IS NOT NULL;

CREATE TABLE postlane_events (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    delivery_id INTEGER NOT NULL,  -- no foreign key: checked on every insert; prune deletes
    at          REAL NOT NULL,
    kind        TEXT NOT NULL,
    state       TEXT,
    data        TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX postlane_events_delivery ON postlane_events (delivery_id, id);

CREATE TABLE postlane_dead_letters (
    delivery_id     INTEGER PRIMARY KEY REFERENCES postlane_deliveries (id) ON DELETE CASCADE,
    reason          TEXT NOT NULL,
    snapshot        TEXT NOT NULL,
    last_response   TEXT,
    attempt_history TEXT NOT NULL DEFAULT '[]',
    dead_at         REAL NOT NULL,
    replayed_at     REAL,
    replay_count    INTEGER NOT NULL DEFAULT 0,
    replayed_by     TEXT,
    discarded_at    REAL,
    discard_reason  TEXT
);
CREATE INDEX postlane_dead_letters_open ON postlane_dead_letters (dead_at)
    WHERE discarded_at IS NULL;
