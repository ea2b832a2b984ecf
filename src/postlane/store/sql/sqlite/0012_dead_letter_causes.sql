-- Postlane 0012: a dead letter keeps its cause (what to fix, and so whom to wake:
-- postlane.core.causes), and prune keeps count of the deliveries it deleted per lane, so that
-- arrivals per lane (kept + pruned) are a counter that retention does not turn back.
ALTER TABLE postlane_dead_letters ADD COLUMN cause TEXT;
-- Entries written before this migration: the cause follows from the reason, except for a
-- permanent refusal, which is not read again here (``rejected_other``).
UPDATE postlane_dead_letters SET cause = CASE reason
    WHEN 'permanent' THEN 'rejected_other'
    ELSE reason END;
CREATE INDEX postlane_dead_letters_cause ON postlane_dead_letters (cause)
    WHERE discarded_at IS NULL;

CREATE TABLE postlane_pruned (
    lane       TEXT PRIMARY KEY,
    deliveries BIGINT NOT NULL DEFAULT 0
);
