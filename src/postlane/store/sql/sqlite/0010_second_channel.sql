-- Postlane 0010: the second channel (SMS fallbacks) and import canaries. Times are REAL
-- unix seconds.

-- Workers claim only the channel their provider sends (see the PostgreSQL migration).
CREATE INDEX postlane_deliveries_ready_channel ON postlane_deliveries (lane, channel, run_at, id)
    WHERE state = 'pending';
DROP INDEX IF EXISTS postlane_deliveries_ready;

-- Emails that carry an SMS fallback: what the sweep reads (over messages, where the flag
-- lives since 0007; see the PostgreSQL migration). Guarded by json_valid (CASE is lazy): a
-- message whose metadata is not JSON (a poison row another program wrote) must still insert.
CREATE INDEX postlane_messages_sms_fallback ON postlane_messages (id)
    WHERE CASE WHEN json_valid(metadata) THEN json_type(metadata, '$.sms_fallback') END
          IS NOT NULL;

CREATE TABLE postlane_sms_fallbacks (
    email_id   INTEGER PRIMARY KEY REFERENCES postlane_deliveries (id) ON DELETE CASCADE,
    sms_id     INTEGER,  -- NULL: the policy does not fall back on this; no SMS
    reason     TEXT NOT NULL CHECK (reason IN ('dead', 'expired', 'unsent')),
    created_at REAL NOT NULL
);
CREATE INDEX postlane_sms_fallbacks_sms ON postlane_sms_fallbacks (sms_id);

CREATE TABLE postlane_import_canaries (
    import_id  TEXT PRIMARY KEY,
    size       INTEGER NOT NULL CHECK (size >= 1),
    keys       TEXT NOT NULL DEFAULT '[]',
    state      TEXT NOT NULL DEFAULT 'waiting'
        CHECK (state IN ('waiting', 'passed', 'failed', 'released')),
    reason     TEXT,
    created_at REAL NOT NULL,
    settled_at REAL
);
CREATE INDEX postlane_import_canaries_waiting ON postlane_import_canaries (import_id)
    WHERE state = 'waiting';
