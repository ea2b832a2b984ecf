-- Postlane 0015: a claim writes no timeline row of its own. The row that ends the claim (the
-- outcome, a release, a rescue) carries when it was claimed, by whom and which claim it was,
-- and the timeline shows a "claimed" entry before it (store.machine.timeline); the claim
-- still held is read from the narrow row's claimed_at. A no-op send writes one event row
-- instead of two: one heap row and one key entry less per claim, and the claim statement
-- loses its insert and the callbacks trigger's pass over it. Nullable columns without a
-- default: adding them rewrites nothing. Rows written before keep their own "claimed" rows.
ALTER TABLE postlane_deliveries ADD COLUMN claimed_at TIMESTAMPTZ;
ALTER TABLE postlane_events ADD COLUMN claimed_at TIMESTAMPTZ, ADD COLUMN claimed_by TEXT,
    ADD COLUMN claim INTEGER;
