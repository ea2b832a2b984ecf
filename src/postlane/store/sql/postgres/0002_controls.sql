-- Postlane 0002: operator and fleet controls (lane and import pauses, breaker state),
-- read by every worker about once a second. ``version`` makes compare-and-set possible.
CREATE TABLE postlane_controls (
    name       TEXT PRIMARY KEY,
    value      JSONB NOT NULL,
    version    BIGINT NOT NULL DEFAULT 1,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX postlane_deliveries_ambiguous ON postlane_deliveries (updated_at)
    WHERE state = 'ambiguous';
