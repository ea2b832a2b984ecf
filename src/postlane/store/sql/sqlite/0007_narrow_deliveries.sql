-- Postlane 0007: the hot path's narrow table (see the PostgreSQL migration for why).
-- SQLite cannot drop a column under a UNIQUE constraint, so the table is rebuilt as its
-- documented twelve steps say (the runner turns foreign keys off around a migration and
-- checks them after): a new narrow table, the rows copied, the old one dropped, the new
-- one renamed. The tables that reference postlane_deliveries by name then reference it.
CREATE TABLE postlane_messages (
    -- The delivery's id: on SQLite the message is inserted first (its key decides whether
    -- there is a delivery at all) and hands its id to the delivery.
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key  TEXT NOT NULL,
    recipient        TEXT NOT NULL,
    sender           TEXT,
    subject          TEXT NOT NULL DEFAULT '',
    text_body        TEXT,
    html_body        TEXT,
    headers          TEXT NOT NULL DEFAULT '{}',
    metadata         TEXT NOT NULL DEFAULT '{}',
    template_id      TEXT,
    template_version INTEGER,
    producer         TEXT,
    request_hash     TEXT,
    CONSTRAINT postlane_messages_key UNIQUE (idempotency_key)
);

INSERT INTO postlane_messages (id, idempotency_key, recipient, sender, subject, text_body,
                               html_body, headers, metadata, template_id, template_version,
                               producer, request_hash)
SELECT id, idempotency_key, recipient, sender, subject, text_body, html_body, headers,
       metadata, template_id, template_version, producer, request_hash
FROM postlane_deliveries;

CREATE INDEX postlane_messages_recipient ON postlane_messages (recipient);
CREATE INDEX postlane_messages_template ON postlane_messages (template_id)
    WHERE template_id IS NOT NULL;

CREATE TABLE postlane_deliveries_narrow (
    id                  INTEGER PRIMARY KEY AUTOINCREMENT,
    lane                TEXT NOT NULL,
    channel             TEXT NOT NULL DEFAULT 'email',
    import_id           TEXT,
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
    provider_status     TEXT,
    CONSTRAINT postlane_deliveries_lease CHECK ((state = 'sending') = (lease_owner IS NOT NULL))
);

INSERT INTO postlane_deliveries_narrow (id, lane, channel, import_id, state, attempts, claims,
    run_at, expires_at, lease_owner, lease_expires_at, attempt_started_at,
    provider_message_id, dead_reason, last_error, created_at, updated_at, sent_at,
    finished_at, provider_status)
SELECT id, lane, channel, import_id, state, attempts, claims, run_at, expires_at, lease_owner,
       lease_expires_at, attempt_started_at, provider_message_id, dead_reason, last_error,
       created_at, updated_at, sent_at, finished_at, provider_status
FROM postlane_deliveries;

-- AUTOINCREMENT never reuses an id: the new table continues from the old one's counter.
DELETE FROM sqlite_sequence WHERE name = 'postlane_deliveries_narrow';
INSERT INTO sqlite_sequence (name, seq)
SELECT 'postlane_deliveries_narrow', seq FROM sqlite_sequence WHERE name = 'postlane_deliveries';

INSERT INTO sqlite_sequence (name, seq)
SELECT 'postlane_messages', seq FROM sqlite_sequence WHERE name = 'postlane_deliveries';

DROP TABLE postlane_deliveries;
ALTER TABLE postlane_deliveries_narrow RENAME TO postlane_deliveries;

CREATE INDEX postlane_deliveries_ready ON postlane_deliveries (lane, run_at, id)
    WHERE state = 'pending';
CREATE INDEX postlane_deliveries_leased ON postlane_deliveries (lease_expires_at)
    WHERE state = 'sending';
CREATE INDEX postlane_deliveries_finished ON postlane_deliveries (finished_at)
    WHERE finished_at IS NOT NULL;
CREATE INDEX postlane_deliveries_import ON postlane_deliveries (import_id)
    WHERE import_id IS NOT NULL;
CREATE INDEX postlane_deliveries_provider_id ON postlane_deliveries (provider_message_id)
    WHERE provider_message_id IS NOT NULL;
CREATE INDEX postlane_deliveries_ambiguous ON postlane_deliveries (updated_at)
    WHERE state = 'ambiguous';

-- Every column a delivery had before, in that order.
CREATE VIEW postlane_delivery_rows AS
SELECT d.id, m.idempotency_key, d.lane, d.channel, m.recipient, m.sender, m.subject,
       m.text_body, m.html_body, m.headers, m.metadata, d.import_id, m.template_id,
       m.template_version, d.state, d.attempts, d.claims, d.run_at, d.expires_at,
       d.lease_owner, d.lease_expires_at, d.attempt_started_at, d.provider_message_id,
       d.dead_reason, d.last_error, d.created_at, d.updated_at, d.sent_at, d.finished_at,
       d.provider_status, m.request_hash, m.producer
FROM postlane_deliveries d JOIN postlane_messages m ON m.id = d.id;
