-- Postlane 0010: the second channel (SMS fallbacks) and import canaries.

-- Workers claim only the channel their provider sends: the ready index leads with the lane
-- and the channel, so an SMS worker finds its few rows without walking an email backlog.
-- (IF EXISTS: another migration may have reshaped the ready index already.)
CREATE INDEX postlane_deliveries_ready_channel ON postlane_deliveries (lane, channel, run_at, id)
    WHERE state = 'pending';
DROP INDEX IF EXISTS postlane_deliveries_ready;

-- Emails that carry an SMS fallback: what the sweep reads. The flag lives in the message
-- (0007), the state in the narrow row, so the index is over messages and the sweep filters
-- the states through the primary key; the hot path's table gets no index for this.
CREATE INDEX postlane_messages_sms_fallback ON postlane_messages (id)
    WHERE metadata ? 'sms_fallback';

-- One row per email whose fallback was created: the pair, and why.
CREATE TABLE postlane_sms_fallbacks (
    email_id   BIGINT PRIMARY KEY REFERENCES postlane_deliveries (id) ON DELETE CASCADE,
    sms_id     BIGINT,  -- NULL: the policy does not fall back on this; no SMS
    reason     TEXT NOT NULL CHECK (reason IN ('dead', 'expired', 'unsent')),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX postlane_sms_fallbacks_sms ON postlane_sms_fallbacks (sms_id);

-- An import's canary: the keys of its first deliveries, and what became of them.
CREATE TABLE postlane_import_canaries (
    import_id  TEXT PRIMARY KEY,
    size       INTEGER NOT NULL CHECK (size >= 1),
    keys       JSONB NOT NULL DEFAULT '[]',
    state      TEXT NOT NULL DEFAULT 'waiting'
        CHECK (state IN ('waiting', 'passed', 'failed', 'released')),
    reason     TEXT,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    settled_at TIMESTAMPTZ
);
CREATE INDEX postlane_import_canaries_waiting ON postlane_import_canaries (import_id)
    WHERE state = 'waiting';
