-- Postlane 0002: operator and fleet controls (lane and import pauses, breaker state),
-- read by every worker about once a second. ``version`` makes compare-and-set possible.
CREATE TABLE postlane_controls (
    name       TEXT PRIMARY KEY,
    value      TEXT NOT NULL,
    version    INTEGER NOT NULL DEFAULT 1,
    updated_at REAL NOT NULL
);
CREATE INDEX postlane_deliveries_ambiguous ON postlane_deliveries (updated_at)
    WHERE state = 'ambiguous';
