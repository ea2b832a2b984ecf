-- Postlane 0008: provider failover and status callbacks.

-- Which provider an attempt went to, written before the request leaves (only by workers
-- that have a fallback provider). Reconciliation of an ambiguous delivery asks the provider
-- of its latest attempt (``attempt`` = the delivery's attempts): the same key at two
-- providers would be two emails. ``pinned``: the delivery was ambiguous there and settled
-- by "the provider deduplicates the key", so every later attempt must go there too.
CREATE TABLE postlane_delivery_routes (
    delivery_id BIGINT PRIMARY KEY,  -- no foreign key, as for events: prune deletes
    provider    TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    pinned      BOOLEAN NOT NULL DEFAULT false,
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Where the application wants status callbacks (Standard Webhooks). ``api_key_id`` NULL:
-- every delivery; else only deliveries that API key produced. ``events``: '*' or a comma
-- list of event types. The secret signs; it is shown once, at registration.
CREATE TABLE postlane_callback_endpoints (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    url         TEXT NOT NULL,
    secret      TEXT NOT NULL,
    api_key_id  BIGINT,
    events      TEXT NOT NULL DEFAULT '*',
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    disabled_at TIMESTAMPTZ
);

-- The callbacks' own outbox: one row per (endpoint, timeline event), written by the trigger
-- below in the transaction that wrote the event. A sender claims due rows by pushing
-- ``run_at`` one lease ahead and counting the attempt; a sender that dies leaves the row
-- due again when the lease ends (at least once). ``event_id`` is the stable id receivers
-- deduplicate by (``webhook-id: evt_<event_id>``).
CREATE TABLE postlane_callbacks (
    id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    endpoint_id  BIGINT NOT NULL REFERENCES postlane_callback_endpoints (id) ON DELETE CASCADE,
    event_id     BIGINT NOT NULL,
    delivery_id  BIGINT NOT NULL,
    type         TEXT NOT NULL,
    payload      JSONB NOT NULL,
    state        TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'sent', 'dead')),
    attempts     INTEGER NOT NULL DEFAULT 0,
    run_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_error   TEXT,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at  TIMESTAMPTZ,
    replay_count INTEGER NOT NULL DEFAULT 0,
    CONSTRAINT postlane_callbacks_once UNIQUE (endpoint_id, event_id)
);
CREATE INDEX postlane_callbacks_due ON postlane_callbacks (run_at, id) WHERE state = 'pending';
CREATE INDEX postlane_callbacks_delivery ON postlane_callbacks (delivery_id);

-- Callbacks are enqueued by the write of the timeline event that causes them, in the same
-- transaction, with no change to the statements that write events: one call per statement
-- (not per row), which returns at once while no endpoint is registered.
CREATE FUNCTION postlane_enqueue_callbacks() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM postlane_callback_endpoints WHERE disabled_at IS NULL) THEN
        RETURN NULL;
    END IF;
    INSERT INTO postlane_callbacks (endpoint_id, event_id, delivery_id, type, payload)
    SELECT e.id, n.id, n.delivery_id, n.type, jsonb_build_object(
        'type', n.type,
        'timestamp', to_char(n.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'data', jsonb_build_object(
            'event_id', 'evt_' || n.id,
            'delivery_id', n.delivery_id,
            'key', m.idempotency_key,
            'lane', d.lane,
            'state', d.state,
            'provider', n.data ->> 'provider',
            'provider_message_id', d.provider_message_id,
            'cause', COALESCE(n.data ->> 'response', n.data ->> 'why', n.data ->> 'reason',
                              n.data ->> 'bounce_type', d.dead_reason),
            'dead_reason', CASE WHEN n.state IN ('dead', 'expired') THEN d.dead_reason END,
            'attempt', (n.data ->> 'attempt')::int))
    FROM (
        SELECT ev.*, CASE
            WHEN ev.state = 'sent' THEN 'delivery.sent'
            WHEN ev.state IN ('dead', 'expired') THEN 'delivery.dead_lettered'
            WHEN ev.state = 'suppressed' THEN 'delivery.suppressed'
            WHEN ev.kind = 'provider:bounced' THEN 'delivery.bounced'
            WHEN ev.kind = 'provider:complained' THEN 'delivery.complained'
        END AS type
        FROM postlane_new_events ev
    ) n
    JOIN postlane_deliveries d ON d.id = n.delivery_id
    JOIN postlane_messages m ON m.id = n.delivery_id  -- the key and producer (0007)
    JOIN postlane_callback_endpoints e
      ON e.disabled_at IS NULL
     AND (e.api_key_id IS NULL OR m.producer = 'apikey:' || e.api_key_id)
     AND (e.events = '*' OR n.type = ANY (string_to_array(e.events, ',')))
    WHERE n.type IS NOT NULL
    ON CONFLICT ON CONSTRAINT postlane_callbacks_once DO NOTHING;
    RETURN NULL;
END $$;

CREATE TRIGGER postlane_events_callbacks
    AFTER INSERT ON postlane_events
    REFERENCING NEW TABLE AS postlane_new_events
    FOR EACH STATEMENT EXECUTE FUNCTION postlane_enqueue_callbacks();
