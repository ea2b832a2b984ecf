-- Postlane 0009: deliverability. A suppression says where it came from and may end
-- (a run of soft bounces suppresses an address for a while); a provider event keeps the
-- address and lane it concerns, so soft bounces are counted per address and bounce and
-- complaint rates per lane without joining the deliveries table.
ALTER TABLE postlane_suppressions ADD COLUMN source_event TEXT;
ALTER TABLE postlane_suppressions ADD COLUMN expires_at TIMESTAMPTZ;

ALTER TABLE postlane_provider_events ADD COLUMN recipient TEXT;
ALTER TABLE postlane_provider_events ADD COLUMN lane TEXT;
CREATE INDEX postlane_provider_events_recipient
    ON postlane_provider_events (recipient, kind, received_at) WHERE recipient IS NOT NULL;
