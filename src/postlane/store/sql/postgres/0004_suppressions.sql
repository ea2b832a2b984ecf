-- Postlane 0004: provider events (webhooks) processed once each, and the suppression list.
ALTER TABLE postlane_deliveries ADD COLUMN provider_status TEXT;

CREATE TABLE postlane_provider_events (
    provider            TEXT NOT NULL,
    event_id            TEXT NOT NULL,
    kind                TEXT NOT NULL,
    provider_message_id TEXT,
    delivery_id         BIGINT REFERENCES postlane_deliveries (id) ON DELETE CASCADE,
    received_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, event_id)
);
CREATE INDEX postlane_provider_events_received ON postlane_provider_events (received_at);

-- ``stream`` is the lane the address is suppressed for, or '*' for every lane.
CREATE TABLE postlane_suppressions (
    address     TEXT NOT NULL,
    stream      TEXT NOT NULL,
    reason      TEXT NOT NULL,
    delivery_id BIGINT,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (address, stream)
);
