-- Postlane 0014: nothing to change on SQLite. PostgreSQL's events table had two indexes, its
-- key on id and one on (delivery_id, id), and keeps the second as its key. Here the id is
-- the rowid, the table's own B-tree, so (delivery_id, id) is already the one index written
-- per event (a WITHOUT ROWID table keyed by it would lose the id's AUTOINCREMENT).
SELECT 1;
