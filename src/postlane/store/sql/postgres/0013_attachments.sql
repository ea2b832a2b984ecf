-- Postlane 0013: attachments, inline parts and calendar invites, beside their delivery.
-- A side table, never read by a claim: the worker loads a batch's parts only when it
-- builds the messages to send, so large content costs the claim path nothing. The rows
-- live as long as the delivery (retries, replays and the dead letter send the same bytes).
CREATE TABLE postlane_attachments (
    delivery_id  BIGINT NOT NULL REFERENCES postlane_deliveries (id) ON DELETE CASCADE,
    position     INTEGER NOT NULL,
    kind         TEXT NOT NULL CHECK (kind IN ('attachment', 'inline', 'calendar')),
    filename     TEXT NOT NULL,
    content_type TEXT NOT NULL,
    content_id   TEXT,
    size         INTEGER NOT NULL,
    content      BYTEA NOT NULL,
    PRIMARY KEY (delivery_id, position)
);
