-- Postlane 0001: deliveries, their timeline, dead letters, and the enqueue wake-up.
CREATE TABLE postlane_deliveries (
    id                  BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    idempotency_key     TEXT NOT NULL,
    lane                TEXT NOT NULL,
    channel             TEXT NOT NULL DEFAULT 'email',
    recipient           TEXT NOT NULL,
    sender              TEXT,
    subject             TEXT NOT NULL DEFAULT '',
    text_body           TEXT,
    html_body           TEXT,
    headers             JSONB NOT NULL DEFAULT '{}',
    metadata            JSONB NOT NULL DEFAULT '{}',
    import_id           TEXT,
    template_id         TEXT,
    template_version    INTEGER,
    state               TEXT NOT NULL DEFAULT 'pending'
        CHECK (state IN ('pending', 'sending', 'sent', 'ambiguous', 'dead', 'expired',
                          'cancelled', 'suppressed')),
    attempts            INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    claims              INTEGER NOT NULL DEFAULT 0,
    run_at              TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at          TIMESTAMPTZ,
    lease_owner         TEXT,
    lease_expires_at    TIMESTAMPTZ,
    attempt_started_at  TIMESTAMPTZ,
    provider_message_id TEXT,
    dead_reason         TEXT,
    last_error          TEXT,
    created_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    sent_at             TIMESTAMPTZ,
    finished_at         TIMESTAMPTZ,
    CONSTRAINT postlane_deliveries_key UNIQUE (idempotency_key),
    CONSTRAINT postlane_deliveries_lease CHECK ((state = 'sending') = (lease_owner IS NOT NULL))
)
-- Room on each page for in-place (HOT) updates of the attempt and lease marks.
WITH (fillfactor = 70);

-- The claim path touches only ready rows of one lane, oldest first.
CREATE INDEX postlane_deliveries_ready ON postlane_deliveries (lane, run_at, id)
    WHERE state = 'pending';
-- The rescuer touches only leased rows.
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
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    delivery_id BIGINT NOT NULL,  -- no foreign key: checked on every insert; prune deletes
    at          TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    kind        TEXT NOT NULL,
    state       TEXT,
    data        JSONB NOT NULL DEFAULT '{}'
);
CREATE INDEX postlane_events_delivery ON postlane_events (delivery_id, id);

CREATE TABLE postlane_dead_letters (
    delivery_id     BIGINT PRIMARY KEY REFERENCES postlane_deliveries (id) ON DELETE CASCADE,
    reason          TEXT NOT NULL,
    snapshot        JSONB NOT NULL,
    last_response   TEXT,
    attempt_history JSONB NOT NULL DEFAULT '[]',
    dead_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    replayed_at     TIMESTAMPTZ,
    replay_count    INTEGER NOT NULL DEFAULT 0,
    replayed_by     TEXT,
    discarded_at    TIMESTAMPTZ,
    discard_reason  TEXT
);
CREATE INDEX postlane_dead_letters_open ON postlane_dead_letters (dead_at)
    WHERE discarded_at IS NULL;

-- One NOTIFY per enqueueing statement (not per row), so COPY of a million rows wakes
-- idle workers once.
CREATE FUNCTION postlane_notify_enqueued() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('postlane_enqueued', '');
    RETURN NULL;
END $$;

CREATE TRIGGER postlane_deliveries_enqueued
    AFTER INSERT ON postlane_deliveries
    FOR EACH STATEMENT EXECUTE FUNCTION postlane_notify_enqueued();
