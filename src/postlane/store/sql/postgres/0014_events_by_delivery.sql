-- Postlane 0014: timeline events keyed by (delivery_id, id). Every read of the timeline
-- (a delivery's events, its attempt history, prune) goes by delivery, none by the event id
-- alone, so the primary key takes the place of the (delivery_id, id) index: one index to
-- write per event instead of two, and every transition writes an event (a no-op send writes
-- two). The ids stay unique: they still come from the identity. Building the key reads the
-- whole table and holds its lock meanwhile: on a large timeline, run it while workers are
-- stopped (or after a prune).
ALTER TABLE postlane_events DROP CONSTRAINT postlane_events_pkey;
ALTER TABLE postlane_events ADD CONSTRAINT postlane_events_pkey PRIMARY KEY (delivery_id, id);
DROP INDEX postlane_events_delivery;
