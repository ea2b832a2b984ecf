-- Postlane 0011: the on-call view (issue 15). Times are REAL unix seconds (database clock).
-- Each running worker says it is alive: one row, rewritten every few seconds by its
-- caretaker and deleted on a clean stop. A row whose heartbeat is older than a few
-- intervals is a worker that died.
CREATE TABLE postlane_workers (
    owner        TEXT PRIMARY KEY,
    host         TEXT NOT NULL,
    pid          INTEGER NOT NULL,
    version      TEXT NOT NULL,
    provider     TEXT NOT NULL,
    lanes        TEXT NOT NULL DEFAULT '{}',  -- lane -> share of the worker's send slots
    in_flight    INTEGER NOT NULL DEFAULT 0,
    interval_s   REAL NOT NULL,
    started_at   REAL NOT NULL,
    heartbeat_at REAL NOT NULL
);

-- Outcomes per minute and lane (sent, throttled, transient, ambiguous, dead), added to by
-- every worker with its heartbeat: the dashboard's last 24 hours outlive `serve`.
CREATE TABLE postlane_outcome_minutes (
    minute  INTEGER NOT NULL,  -- unix seconds at the start of the minute
    lane    TEXT NOT NULL,
    outcome TEXT NOT NULL,
    count   INTEGER NOT NULL,
    PRIMARY KEY (minute, lane, outcome)
);

-- The messages browser pages newest first by id; the states the send path never passes
-- through get one partial index (see the PostgreSQL migration).
CREATE INDEX postlane_deliveries_settled ON postlane_deliveries (state, id)
    WHERE state IN ('ambiguous', 'dead', 'expired', 'cancelled', 'suppressed');

-- An import's or a template's deliveries, newest first: the same indexes (same names, same
-- partial condition) with the id added, so a page of an old import reads that import's rows
-- instead of the whole table backwards from the newest id.
DROP INDEX postlane_deliveries_import;
CREATE INDEX postlane_deliveries_import ON postlane_deliveries (import_id, id)
    WHERE import_id IS NOT NULL;
-- (The template is the message's since 0007: its index is on postlane_messages.)
DROP INDEX postlane_messages_template;
CREATE INDEX postlane_messages_template ON postlane_messages (template_id, id)
    WHERE template_id IS NOT NULL;
