-- Postlane 0015: a claim writes no timeline row of its own (see PostgreSQL's 0015): the row
-- that ends it carries the claim's time, owner and number. Times as REAL unix seconds.
ALTER TABLE postlane_deliveries ADD COLUMN claimed_at REAL;
ALTER TABLE postlane_events ADD COLUMN claimed_at REAL;
ALTER TABLE postlane_events ADD COLUMN claimed_by TEXT;
ALTER TABLE postlane_events ADD COLUMN claim INTEGER;
