-- Postlane 0005: the HTTP API. Keys are stored as the SHA-256 of the token (the token is
-- shown once, at creation); ``prefix`` tells keys apart in a list. ``request_hash`` is the
-- hash of the canonical body of the POST /v1/messages request that created a delivery, so
-- the same Idempotency-Key sent with a different body can be refused. Times: REAL unix seconds.
CREATE TABLE postlane_api_keys (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    name       TEXT NOT NULL,
    prefix     TEXT NOT NULL,
    token_hash TEXT NOT NULL,
    scopes     TEXT NOT NULL,
    created_at REAL NOT NULL,
    revoked_at REAL,
    CONSTRAINT postlane_api_keys_token UNIQUE (token_hash)
);

ALTER TABLE postlane_deliveries ADD COLUMN request_hash TEXT;
