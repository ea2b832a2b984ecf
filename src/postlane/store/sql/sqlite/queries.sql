-- The sqlite engine's queries, by name (postlane.store.queries). Fragments written
-- {{name}} come from postlane.store.machine. Two markers are filled by the engine when it
-- loads this file (sqlite._base.Q): NOW, SQLite's clock as REAL unix seconds (PostgreSQL
-- has now(); SQLite computes it from julianday('now'), fixed within a statement), and
-- DELIVERY_COLUMNS, the columns a Delivery is read from (store.base), each written between
-- double underscores. Other such words are filled per call (a filter built from parts).
-- A batch travels as one JSON array read with json_each: SQLite has no arrays, and one
-- statement per batch costs less than a statement per row.

-- name: schema_version
SELECT max(version) FROM postlane_migrations

-- name: insert_event
INSERT INTO postlane_events (delivery_id, at, kind, state, data)
VALUES (?, __NOW__, ?, ?, ?)

-- name: insert_events
-- A batch's events from one JSON array of [delivery id, kind, state, detail] (an
-- executemany with a json.dumps per row cost more than the update it follows).
INSERT INTO postlane_events (delivery_id, at, kind, state, data)
SELECT json_extract(value, '$[0]'), __NOW__, json_extract(value, '$[1]'),
       json_extract(value, '$[2]'), json(json_extract(value, '$[3]'))
FROM json_each(?)

-- name: data_version
-- Changes when another connection commits: SQLite has no LISTEN/NOTIFY.
PRAGMA data_version

-- name: migrations_table
-- On one line: SQLite keeps a table's CREATE text as written, and the schema's dump
-- (tests/integration/schema/sqlite.txt) holds it.
CREATE TABLE IF NOT EXISTS postlane_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)

-- name: migrations_applied
SELECT version FROM postlane_migrations

-- name: migrations_table_exists
SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'postlane_migrations'

-- name: migration_record
-- Run inside the migration's own script (executescript takes no parameters), so the
-- values are written into it: version and name come from the migration's file name.
INSERT INTO postlane_migrations (version, name, applied_at)
VALUES (__VERSION__, '__NAME__', __NOW__);

-- name: foreign_key_check
PRAGMA foreign_key_check

-- name: claim
-- SQLite has no FOR UPDATE SKIP LOCKED: the write lock (BEGIN IMMEDIATE) serialises
-- claimers, so the subquery's rows cannot be taken by another in between.
UPDATE postlane_deliveries
SET state = 'sending', lease_owner = :owner,
    lease_expires_at = __NOW__ + :lease_s, claims = claims + 1,
    attempt_started_at = NULL, updated_at = __NOW__
WHERE id IN (
    SELECT id FROM postlane_deliveries
    WHERE state = 'pending' AND lane = :lane AND channel = :channel
      AND run_at <= __NOW__
      AND (import_id IS NULL OR import_id NOT IN
           (SELECT value FROM json_each(:excluded)))
    ORDER BY run_at, id LIMIT :limit)
RETURNING id, claims

-- name: claimed_rows
-- The claim rewrote only the narrow rows; the messages are read here.
SELECT __DELIVERY_COLUMNS__ FROM postlane_delivery_rows
WHERE id IN (SELECT value FROM json_each(?)) ORDER BY run_at, id

-- name: start_attempts
-- Guarded as on PostgreSQL: leased to me (claim number and owner), lease not yet expired.
UPDATE postlane_deliveries AS d SET attempt_started_at = __NOW__, updated_at = __NOW__
FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS claims
      FROM json_each(:claims)) AS t
WHERE d.id = t.id AND d.claims = t.claims AND d.state = 'sending'
  AND d.lease_owner = :owner AND d.lease_expires_at > __NOW__
RETURNING id

-- name: renew_leases
UPDATE postlane_deliveries AS d SET lease_expires_at = __NOW__ + :lease_s, updated_at = __NOW__
FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS claims
      FROM json_each(:claims)) AS t
WHERE d.id = t.id AND d.claims = t.claims AND d.state = 'sending'
  AND d.lease_owner = :owner AND d.lease_expires_at > __NOW__
RETURNING id

-- name: set_state
-- The batch's transitions as one JSON array of [id, claims, state, delay_s, spend, error,
-- provider message id, dead reason]; GUARD (between double underscores) is the state
-- the rows must be in: guard_sending or guard_ambiguous.
UPDATE postlane_deliveries AS d SET
    state = t.state,
    attempts = d.attempts + t.spend,
    run_at = CASE WHEN t.state = 'pending'
                  THEN __NOW__ + COALESCE(t.delay_s, 0) ELSE d.run_at END,
    lease_owner = NULL, lease_expires_at = NULL, attempt_started_at = NULL,
    last_error = COALESCE(t.error, d.last_error),
    provider_message_id = COALESCE(t.pmid, d.provider_message_id),
    dead_reason = CASE WHEN t.state = 'dead' THEN t.reason ELSE d.dead_reason END,
    sent_at = CASE WHEN t.state = 'sent' THEN __NOW__ ELSE d.sent_at END,
    finished_at = CASE WHEN t.state IN {{terminal}} THEN __NOW__ ELSE NULL END,
    updated_at = __NOW__
FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS claims,
             json_extract(value, '$[2]') AS state, json_extract(value, '$[3]') AS delay_s,
             json_extract(value, '$[4]') AS spend, json_extract(value, '$[5]') AS error,
             json_extract(value, '$[6]') AS pmid, json_extract(value, '$[7]') AS reason
      FROM json_each(:batch)) AS t
WHERE d.id = t.id AND d.claims = t.claims AND __GUARD__
RETURNING id

-- name: guard_sending
d.state = 'sending' AND d.lease_owner = :owner

-- name: guard_ambiguous
d.state = 'ambiguous'

-- name: list_ambiguous
SELECT __DELIVERY_COLUMNS__ FROM postlane_delivery_rows WHERE state = 'ambiguous'
  AND (:lanes IS NULL OR lane IN (SELECT value FROM json_each(:lanes)))
  AND (:channel IS NULL OR channel = :channel)
ORDER BY updated_at, id LIMIT :limit

-- name: delivery_by_id
SELECT __DELIVERY_COLUMNS__ FROM postlane_delivery_rows WHERE id = ?

-- name: attempt_events
-- The timeline entries that record an outcome, for a dead letter's attempt history.
SELECT data, at FROM postlane_events
WHERE delivery_id = ? AND json_extract(data, '$.outcome') IS NOT NULL ORDER BY id

-- name: write_dead_letter
INSERT INTO postlane_dead_letters
    (delivery_id, reason, cause, snapshot, last_response, attempt_history, dead_at)
VALUES (?, ?, ?, ?, ?, ?, __NOW__)
ON CONFLICT (delivery_id) DO UPDATE SET
    reason = excluded.reason, cause = excluded.cause, snapshot = excluded.snapshot,
    last_response = excluded.last_response,
    attempt_history = excluded.attempt_history, dead_at = excluded.dead_at,
    discarded_at = NULL, discard_reason = NULL

-- name: expired_leases
SELECT id, lease_owner, attempt_started_at IS NOT NULL FROM postlane_deliveries
WHERE state = 'sending' AND lease_expires_at < __NOW__ ORDER BY lease_expires_at LIMIT ?

-- name: rescue_started
-- An attempt that started may have reached the provider: ambiguous, never retried blindly
-- (store.machine.rescue_target).
UPDATE postlane_deliveries SET state = ?, attempts = attempts + 1,
    last_error = {{rescue_started_error}}, lease_owner = NULL, lease_expires_at = NULL,
    attempt_started_at = NULL, updated_at = __NOW__
WHERE id = ? RETURNING attempts

-- name: rescue_unstarted
UPDATE postlane_deliveries SET state = ?, lease_owner = NULL,
    lease_expires_at = NULL, attempt_started_at = NULL, updated_at = __NOW__
WHERE id = ?
