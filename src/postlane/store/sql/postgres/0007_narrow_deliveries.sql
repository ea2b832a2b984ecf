-- Postlane 0007: the hot path's narrow table. ``postlane_deliveries`` keeps only what a
-- transition changes or the claim filters on (state, lane, channel, import, times, lease,
-- attempts, outcome); the message as enqueued (key, recipient, rendered content, headers,
-- metadata, template, producer) moves to ``postlane_messages``, written once and never
-- updated. A claim or an ack rewrites a short row and the index entries of the primary key
-- and the one partial index the row enters, instead of the bodies and the key and
-- recipient entries as well. ``postlane_delivery_rows`` joins the two for every read that
-- wants the whole delivery.

-- Same id as the delivery (taken from the deliveries' sequence by the enqueue). No foreign
-- key: it would be checked on every insert, and the two rows are written and pruned
-- together by the store.
CREATE TABLE postlane_messages (
    id               BIGINT PRIMARY KEY,
    idempotency_key  TEXT NOT NULL,
    recipient        TEXT NOT NULL,
    sender           TEXT,
    subject          TEXT NOT NULL DEFAULT '',
    text_body        TEXT,
    html_body        TEXT,
    headers          JSONB NOT NULL DEFAULT '{}',
    metadata         JSONB NOT NULL DEFAULT '{}',
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

-- Their indexes (key, recipient, template) go with them. DROP COLUMN does not rewrite the
-- table: a row written before this migration gives the space back on its next update.
ALTER TABLE postlane_deliveries
    DROP COLUMN idempotency_key, DROP COLUMN recipient, DROP COLUMN sender,
    DROP COLUMN subject, DROP COLUMN text_body, DROP COLUMN html_body, DROP COLUMN headers,
    DROP COLUMN metadata, DROP COLUMN template_id, DROP COLUMN template_version,
    DROP COLUMN producer, DROP COLUMN request_hash;

-- Every column a delivery had before, in that order.
CREATE VIEW postlane_delivery_rows AS
SELECT d.id, m.idempotency_key, d.lane, d.channel, m.recipient, m.sender, m.subject,
       m.text_body, m.html_body, m.headers, m.metadata, d.import_id, m.template_id,
       m.template_version, d.state, d.attempts, d.claims, d.run_at, d.expires_at,
       d.lease_owner, d.lease_expires_at, d.attempt_started_at, d.provider_message_id,
       d.dead_reason, d.last_error, d.created_at, d.updated_at, d.sent_at, d.finished_at,
       d.provider_status, m.request_hash, m.producer
FROM postlane_deliveries d JOIN postlane_messages m ON m.id = d.id;
