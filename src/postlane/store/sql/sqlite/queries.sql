-- The sqlite engine's queries, by name (postlane.store.queries). Fragments written
-- {{name}} come from postlane.store.machine: {{now}} is SQLite's clock as REAL unix seconds
-- (PostgreSQL has now(); SQLite computes it from julianday('now'), fixed within a
-- statement), {{delivery_columns}} the columns a Delivery is read from (store.base).
-- Words between double underscores are filled per call (a filter built from parts).
-- A batch travels as one JSON array read with json_each: SQLite has no arrays, and one
-- statement per batch costs less than a statement per row.

-- name: insert_event
INSERT INTO postlane_events (delivery_id, at, kind, state, data)
VALUES (?, {{now}}, ?, ?, ?)

-- name: insert_events
-- A batch's events from one JSON array of [delivery id, kind, state, detail] (an
-- executemany with a json.dumps per row cost more than the update it follows), each
-- followed, on a row that ends a claim (an outcome, a rescue), by that claim's time, owner
-- and number (0015, store.machine.timeline); absent elsewhere, so NULL.
INSERT INTO postlane_events (delivery_id, at, kind, state, data, claimed_at, claimed_by, claim)
SELECT json_extract(value, '$[0]'), {{now}}, json_extract(value, '$[1]'),
       json_extract(value, '$[2]'), json(json_extract(value, '$[3]')),
       json_extract(value, '$[4]'), json_extract(value, '$[5]'), json_extract(value, '$[6]')
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
VALUES (__VERSION__, '__NAME__', {{now}});

-- name: foreign_key_check
PRAGMA foreign_key_check

-- name: claim
-- SQLite has no FOR UPDATE SKIP LOCKED: the write lock (BEGIN IMMEDIATE) serialises
-- claimers, so the subquery's rows cannot be taken by another in between. No timeline row:
-- the row that ends the claim tells it (0015).
UPDATE postlane_deliveries
SET state = 'sending', lease_owner = :owner,
    lease_expires_at = {{now}} + :lease_s, claims = claims + 1,
    attempt_started_at = NULL, claimed_at = {{now}}, updated_at = {{now}}
WHERE id IN (
    SELECT id FROM postlane_deliveries
    WHERE state = 'pending' AND lane = :lane AND channel = :channel
      AND run_at <= {{now}}
      AND (import_id IS NULL OR import_id NOT IN
           (SELECT value FROM json_each(:excluded)))
    ORDER BY run_at, id LIMIT :limit)
RETURNING id, claims

-- name: claimed_rows
-- The claim rewrote only the narrow rows; the messages are read here, with the two hints
-- PostgreSQL's claim gives (see there). GLOB '*[^ -~]*': a character outside printable
-- ASCII (SQLite has no regular expressions by default); SQLite's lower() folds ASCII only,
-- which is all the hint relies on.
SELECT {{delivery_columns}},
       r.recipient GLOB '*[^ -~]*' OR EXISTS (
           SELECT 1 FROM postlane_suppressions s WHERE s.address = lower(r.recipient)
       ) AS may_be_suppressed,
       EXISTS (SELECT 1 FROM postlane_attachments a WHERE a.delivery_id = r.id)
           AS has_attachments
FROM postlane_delivery_rows r
WHERE r.id IN (SELECT value FROM json_each(?)) ORDER BY run_at, id

-- name: start_attempts
-- Guarded as on PostgreSQL: leased to me (claim number and owner), lease not yet expired.
UPDATE postlane_deliveries AS d SET attempt_started_at = {{now}}, updated_at = {{now}}
FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS claims
      FROM json_each(:claims)) AS t
WHERE d.id = t.id AND d.claims = t.claims AND d.state = 'sending'
  AND d.lease_owner = :owner AND d.lease_expires_at > {{now}}
RETURNING id

-- name: renew_leases
UPDATE postlane_deliveries AS d SET lease_expires_at = {{now}} + :lease_s, updated_at = {{now}}
FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS claims
      FROM json_each(:claims)) AS t
WHERE d.id = t.id AND d.claims = t.claims AND d.state = 'sending'
  AND d.lease_owner = :owner AND d.lease_expires_at > {{now}}
RETURNING id

-- name: set_state
-- The batch's transitions as one JSON array of [id, claims, state, delay_s, spend, error,
-- provider message id, dead reason]; GUARD (between double underscores) is the state
-- the rows must be in: guard_sending or guard_ambiguous.
UPDATE postlane_deliveries AS d SET
    state = t.state,
    attempts = d.attempts + t.spend,
    run_at = CASE WHEN t.state = 'pending'
                  THEN {{now}} + COALESCE(t.delay_s, 0) ELSE d.run_at END,
    lease_owner = NULL, lease_expires_at = NULL, attempt_started_at = NULL,
    last_error = COALESCE(t.error, d.last_error),
    provider_message_id = COALESCE(t.pmid, d.provider_message_id),
    dead_reason = CASE WHEN t.state = 'dead' THEN t.reason ELSE d.dead_reason END,
    sent_at = CASE WHEN t.state = 'sent' THEN {{now}} ELSE d.sent_at END,
    finished_at = CASE WHEN t.state IN {{terminal}} THEN {{now}} ELSE NULL END,
    updated_at = {{now}}
FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS claims,
             json_extract(value, '$[2]') AS state, json_extract(value, '$[3]') AS delay_s,
             json_extract(value, '$[4]') AS spend, json_extract(value, '$[5]') AS error,
             json_extract(value, '$[6]') AS pmid, json_extract(value, '$[7]') AS reason
      FROM json_each(:batch)) AS t
WHERE d.id = t.id AND d.claims = t.claims AND __GUARD__
RETURNING id, claimed_at

-- name: guard_sending
d.state = 'sending' AND d.lease_owner = :owner

-- name: guard_ambiguous
d.state = 'ambiguous'

-- name: list_ambiguous
SELECT {{delivery_columns}} FROM postlane_delivery_rows WHERE state = 'ambiguous'
  AND (:lanes IS NULL OR lane IN (SELECT value FROM json_each(:lanes)))
  AND (:channel IS NULL OR channel = :channel)
ORDER BY updated_at, id LIMIT :limit

-- name: delivery_by_id
SELECT {{delivery_columns}} FROM postlane_delivery_rows WHERE id = ?

-- name: attempt_events
-- The timeline entries that record an outcome, for a dead letter's attempt history.
SELECT data, at FROM postlane_events
WHERE delivery_id = ? AND json_extract(data, '$.outcome') IS NOT NULL ORDER BY id

-- name: write_dead_letter
INSERT INTO postlane_dead_letters
    (delivery_id, reason, cause, snapshot, last_response, attempt_history, dead_at)
VALUES (?, ?, ?, ?, ?, ?, {{now}})
ON CONFLICT (delivery_id) DO UPDATE SET
    reason = excluded.reason, cause = excluded.cause, snapshot = excluded.snapshot,
    last_response = excluded.last_response,
    attempt_history = excluded.attempt_history, dead_at = excluded.dead_at,
    discarded_at = NULL, discard_reason = NULL

-- name: expired_leases
SELECT id, lease_owner, attempt_started_at IS NOT NULL, claims, claimed_at
FROM postlane_deliveries
WHERE state = 'sending' AND lease_expires_at < {{now}} ORDER BY lease_expires_at LIMIT ?

-- name: rescue_started
-- An attempt that started may have reached the provider: ambiguous, never retried blindly
-- (store.machine.rescue_target).
UPDATE postlane_deliveries SET state = ?, attempts = attempts + 1,
    last_error = {{rescue_started_error}}, lease_owner = NULL, lease_expires_at = NULL,
    attempt_started_at = NULL, updated_at = {{now}}
WHERE id = ? RETURNING attempts

-- name: rescue_unstarted
UPDATE postlane_deliveries SET state = ?, lease_owner = NULL,
    lease_expires_at = NULL, attempt_started_at = NULL, updated_at = {{now}}
WHERE id = ?

-- name: insert_message
-- The message first: its unique key decides whether there is a delivery to create, and its
-- id (AUTOINCREMENT: never reused) becomes the delivery's. Writers are serialised, so
-- nothing can come between the two inserts.
INSERT INTO postlane_messages (idempotency_key, recipient, sender, subject, text_body,
    html_body, headers, metadata, template_id, template_version, producer)
VALUES (:key, :recipient, :sender, :subject, :text, :html, :headers, :metadata, :template_id,
        :template_version, :producer)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id

-- name: insert_delivery
INSERT INTO postlane_deliveries (id, lane, channel, import_id, run_at, expires_at,
    created_at, updated_at)
VALUES (:id, :lane, :channel, :import_id, {{now}} + :delay_s,
        COALESCE(:expires_at, {{now}} + :expires_in_s), {{now}}, {{now}})

-- name: held_by_keys
SELECT {{held_columns}} FROM {{held_from}}
WHERE m.idempotency_key IN (SELECT value FROM json_each(?))

-- name: insert_messages
-- One statement for a whole batch: the rows travel as one JSON array (json.dumps is cheap,
-- a statement per row is not). Row fields by position, as _producing._batch_row writes them.
INSERT INTO postlane_messages (idempotency_key, recipient, sender, subject, text_body,
    html_body, headers, metadata, template_id, template_version, producer)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'),
       json_extract(value, '$[2]'), json_extract(value, '$[3]'),
       json_extract(value, '$[4]'), json_extract(value, '$[5]'),
       json_extract(value, '$[6]'), json_extract(value, '$[7]'),
       json_extract(value, '$[8]'), json_extract(value, '$[9]'), :producer
FROM json_each(:batch) WHERE true  -- (WHERE: SQLite's parser needs it before ON CONFLICT)
ORDER BY key  -- ids in input order
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id, idempotency_key

-- name: insert_deliveries
-- The created messages' deliveries, one JSON array of [id, lane, channel, import_id,
-- delay_s, expires_at, expires_in_s] (from _producing._delivery_row).
INSERT INTO postlane_deliveries (id, lane, channel, import_id, run_at, expires_at,
    created_at, updated_at)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'),
       json_extract(value, '$[2]'), json_extract(value, '$[3]'),
       {{now}} + json_extract(value, '$[4]'),
       COALESCE(json_extract(value, '$[5]'), {{now}} + json_extract(value, '$[6]')),
       {{now}}, {{now}}
FROM json_each(:rows)

-- name: record_heartbeat
INSERT INTO postlane_workers (owner, host, pid, version, provider, lanes, in_flight,
    interval_s, started_at, heartbeat_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, {{now}}, {{now}})
ON CONFLICT (owner) DO UPDATE SET lanes = excluded.lanes, in_flight = excluded.in_flight,
    interval_s = excluded.interval_s, heartbeat_at = {{now}}

-- name: drop_gone_workers
DELETE FROM postlane_workers WHERE heartbeat_at < {{now}} - ?

-- name: count_outcomes
-- The minute from SQLite's clock, REAL unix seconds, cut to a whole minute (PostgreSQL
-- takes the epoch of now()).
INSERT INTO postlane_outcome_minutes (minute, lane, outcome, count)
VALUES (CAST({{now}} / 60 AS INTEGER) * 60, ?, ?, ?)
ON CONFLICT (minute, lane, outcome) DO UPDATE SET count = count + excluded.count

-- name: drop_old_outcome_minutes
DELETE FROM postlane_outcome_minutes WHERE minute < {{now}} - ?

-- name: forget_worker
DELETE FROM postlane_workers WHERE owner = ?

-- name: list_workers
SELECT owner, host, pid, version, provider, lanes, in_flight, interval_s,
       started_at, heartbeat_at, {{now}} - heartbeat_at
FROM postlane_workers ORDER BY host, pid, owner

-- name: outcome_minutes
SELECT minute, lane, outcome, count FROM postlane_outcome_minutes
WHERE minute >= {{now}} - ? ORDER BY minute, lane, outcome

-- name: delivery_routes
SELECT delivery_id, provider, attempt, pinned FROM postlane_delivery_routes
WHERE delivery_id IN (SELECT value FROM json_each(?))

-- name: record_route
-- pinned is 0 or 1: SQLite has no boolean type.
INSERT INTO postlane_delivery_routes (delivery_id, provider, attempt, pinned, updated_at)
VALUES (?, ?, ?, ?, {{now}})
ON CONFLICT (delivery_id) DO UPDATE SET
    provider = excluded.provider, attempt = excluded.attempt,
    pinned = excluded.pinned, updated_at = excluded.updated_at

-- name: set_request_hash
UPDATE postlane_messages SET request_hash = ? WHERE id = ?

-- name: request_hash
SELECT request_hash FROM postlane_messages WHERE id = ?

-- name: create_api_key
INSERT INTO postlane_api_keys (name, prefix, token_hash, scopes, created_at)
VALUES (?, ?, ?, ?, {{now}})
RETURNING id, name, prefix, scopes, created_at, revoked_at, sessions_after

-- name: api_key_by_id
SELECT id, name, prefix, scopes, created_at, revoked_at, sessions_after
FROM postlane_api_keys WHERE id = ?

-- name: api_key_by_token_hash
SELECT id, name, prefix, scopes, created_at, revoked_at, sessions_after
FROM postlane_api_keys WHERE token_hash = ?

-- name: list_api_keys
SELECT id, name, prefix, scopes, created_at, revoked_at, sessions_after
FROM postlane_api_keys ORDER BY id

-- name: revoke_api_key
UPDATE postlane_api_keys SET revoked_at = {{now}}
WHERE id = ? AND revoked_at IS NULL RETURNING id

-- name: end_api_key_sessions
-- MAX of two values is SQLite's scalar max (PostgreSQL: GREATEST).
UPDATE postlane_api_keys SET sessions_after = MAX(?, COALESCE(sessions_after, 0))
WHERE id = ? RETURNING id

-- name: callbacks_trigger
-- Callbacks are enqueued with the timeline event that causes them, in its transaction. The
-- trigger exists only while an endpoint is active (created with the first, dropped with the
-- last, in the same transaction): SQLite runs a row trigger's program for every insert, about
-- 3 µs even for an event its WHEN clause skips, and claims, acks and enqueues all write events.
-- (PostgreSQL's trigger is a statement trigger over the new rows, installed by its migration.)
CREATE TRIGGER IF NOT EXISTS postlane_events_callbacks
AFTER INSERT ON postlane_events
WHEN NEW.state IN ('sent', 'dead', 'expired', 'suppressed')
  OR NEW.kind IN ('provider:bounced', 'provider:complained')
BEGIN
    INSERT OR IGNORE INTO postlane_callbacks
        (endpoint_id, event_id, delivery_id, type, payload, run_at, created_at)
    SELECT e.id, NEW.id, NEW.delivery_id, t.type, json_object(
        'type', t.type,
        'timestamp', strftime('%Y-%m-%dT%H:%M:%fZ', NEW.at, 'unixepoch'),
        'data', json_object(
            'event_id', 'evt_' || NEW.id,
            'delivery_id', NEW.delivery_id,
            'key', m.idempotency_key,
            'lane', d.lane,
            'state', d.state,
            'provider', json_extract(NEW.data, '$.provider'),
            'provider_message_id', d.provider_message_id,
            'cause', COALESCE(json_extract(NEW.data, '$.response'),
                              json_extract(NEW.data, '$.why'),
                              json_extract(NEW.data, '$.reason'),
                              json_extract(NEW.data, '$.bounce_type'), d.dead_reason),
            'dead_reason', CASE WHEN NEW.state IN ('dead', 'expired') THEN d.dead_reason END,
            'attempt', json_extract(NEW.data, '$.attempt'))),
        NEW.at, NEW.at
    FROM (SELECT CASE
            WHEN NEW.state = 'sent' THEN 'delivery.sent'
            WHEN NEW.state IN ('dead', 'expired') THEN 'delivery.dead_lettered'
            WHEN NEW.state = 'suppressed' THEN 'delivery.suppressed'
            WHEN NEW.kind = 'provider:bounced' THEN 'delivery.bounced'
            ELSE 'delivery.complained' END AS type) t
    JOIN postlane_deliveries d ON d.id = NEW.delivery_id
    JOIN postlane_messages m ON m.id = NEW.delivery_id  -- the key and producer (0007)
    JOIN postlane_callback_endpoints e
      ON e.disabled_at IS NULL
     AND (e.api_key_id IS NULL OR m.producer = 'apikey:' || e.api_key_id)
     AND (e.events = '*' OR instr(',' || e.events || ',', ',' || t.type || ',') > 0);
END

-- name: drop_callbacks_trigger
DROP TRIGGER IF EXISTS postlane_events_callbacks

-- name: add_callback_endpoint
-- Events as one comma-separated text, '*' for every event.
INSERT INTO postlane_callback_endpoints (url, secret, api_key_id, events, created_at)
VALUES (?, ?, ?, ?, {{now}})
RETURNING id, url, api_key_id, events, created_at, disabled_at, secret

-- name: list_callback_endpoints
SELECT id, url, api_key_id, events, created_at, disabled_at, secret
FROM postlane_callback_endpoints WHERE ? OR api_key_id IS ? ORDER BY id

-- name: disable_callback_endpoint
UPDATE postlane_callback_endpoints SET disabled_at = {{now}}
WHERE id = ? AND disabled_at IS NULL AND (? IS NULL OR api_key_id = ?)
RETURNING id

-- name: any_active_callback_endpoint
SELECT 1 FROM postlane_callback_endpoints WHERE disabled_at IS NULL LIMIT 1

-- name: kill_callbacks_of_disabled_endpoints
UPDATE postlane_callbacks SET state = 'dead', finished_at = {{now}},
    last_error = 'endpoint disabled'
WHERE state = 'pending'
  AND endpoint_id IN (SELECT id FROM postlane_callback_endpoints WHERE disabled_at IS NOT NULL)

-- name: due_callbacks
-- No FOR UPDATE SKIP LOCKED: the write lock serialises claimers (see claim).
SELECT id FROM postlane_callbacks WHERE state = 'pending' AND run_at <= {{now}}
ORDER BY run_at, id LIMIT ?

-- name: lease_callbacks
UPDATE postlane_callbacks SET run_at = {{now}} + ?, attempts = attempts + 1
WHERE id IN (SELECT value FROM json_each(?))

-- name: callbacks_by_ids
SELECT c.id, c.endpoint_id, c.event_id, c.delivery_id, c.type, c.payload, c.state,
       c.attempts, c.last_error, c.created_at, e.url, e.secret
FROM postlane_callbacks c JOIN postlane_callback_endpoints e ON e.id = c.endpoint_id
WHERE c.id IN (SELECT value FROM json_each(?)) ORDER BY c.id

-- name: retry_callback
UPDATE postlane_callbacks SET run_at = {{now}} + ?, last_error = ?
WHERE id = ? AND attempts = ? AND state = 'pending'
RETURNING delivery_id

-- name: finish_callback
UPDATE postlane_callbacks SET state = ?, finished_at = {{now}},
    last_error = COALESCE(?, last_error)
WHERE id = ? AND attempts = ? AND state = 'pending'
RETURNING delivery_id, endpoint_id, type, event_id

-- name: list_callbacks
SELECT c.id, c.endpoint_id, c.event_id, c.delivery_id, c.type, c.payload, c.state,
       c.attempts, c.last_error, c.created_at, e.url, e.secret
FROM postlane_callbacks c JOIN postlane_callback_endpoints e ON e.id = c.endpoint_id
WHERE (? IS NULL OR c.state = ?) AND (? IS NULL OR c.delivery_id = ?)
ORDER BY c.id DESC LIMIT ?

-- name: replay_callbacks
UPDATE postlane_callbacks SET state = 'pending', run_at = {{now}}, attempts = 0,
    finished_at = NULL, replay_count = replay_count + 1
WHERE state = 'dead' AND (:ids IS NULL OR id IN (SELECT value FROM json_each(:ids)))

-- name: callback_counts
SELECT state, count(*) FROM postlane_callbacks GROUP BY state

-- name: insert_provider_event
-- ON CONFLICT without a target: the one unique key is (provider, event_id), a repeat.
INSERT INTO postlane_provider_events (provider, event_id, kind, provider_message_id,
    delivery_id, received_at, recipient, lane)
VALUES (?, ?, ?, ?, ?, {{now}}, ?, ?)
ON CONFLICT DO NOTHING
RETURNING event_id

-- name: provider_status
SELECT provider_status FROM postlane_deliveries WHERE id = ?

-- name: set_provider_status
UPDATE postlane_deliveries SET provider_status = ? WHERE id = ?

-- name: recent_soft_bounces
SELECT count(*) FROM postlane_provider_events
WHERE recipient = ? AND kind = 'soft_bounced' AND received_at > {{now}} - ?

-- name: unsuppress
-- The address's spellings as one JSON array (core.addresses.address_spellings).
DELETE FROM postlane_suppressions
WHERE address IN (SELECT value FROM json_each(?)) AND (? IS NULL OR stream = ?)

-- name: list_suppressions
SELECT address, stream, reason, delivery_id, created_at, source_event, expires_at
FROM postlane_suppressions
WHERE (? IS NULL OR address IN (SELECT value FROM json_each(?)))
ORDER BY created_at DESC LIMIT ?

-- name: suppressed_among
-- One JSON array of {id, address, lane}, an entry per spelling of each recipient.
SELECT json_extract(t.value, '$.id'), s.reason FROM json_each(?) t
JOIN postlane_suppressions s
  ON s.address = json_extract(t.value, '$.address')
 AND s.stream IN (json_extract(t.value, '$.lane'), '*')
 AND (s.expires_at IS NULL OR s.expires_at > {{now}})

-- name: requeue_suppressed
UPDATE postlane_deliveries SET state = 'pending', run_at = {{now}},
    finished_at = NULL, updated_at = {{now}}
WHERE state = 'suppressed' AND id IN (SELECT id FROM postlane_messages
      WHERE lower(recipient) IN (SELECT value FROM json_each(?)))
RETURNING id

-- name: sent_by_lane
SELECT lane, count(*) FROM postlane_deliveries
WHERE state = 'sent' AND finished_at > {{now}} - ? GROUP BY lane

-- name: provider_events_by_lane
SELECT lane, kind, count(*) FROM postlane_provider_events
WHERE lane IS NOT NULL AND received_at > {{now}} - ? GROUP BY lane, kind

-- name: provider_event_totals
SELECT kind, COALESCE(lane, ''), count(*) FROM postlane_provider_events GROUP BY 1, 2

-- name: event_delivery_by_id
-- The delivery a provider event concerns, looked up by what the event names: by id,
-- provider message id, then idempotency key (see ProviderEvent), one entry for each.
SELECT d.id, d.lane, m.recipient FROM postlane_deliveries d
JOIN postlane_messages m ON m.id = d.id WHERE d.id = ?
ORDER BY d.id DESC LIMIT 1

-- name: event_delivery_by_provider_message_id
SELECT d.id, d.lane, m.recipient FROM postlane_deliveries d
JOIN postlane_messages m ON m.id = d.id WHERE d.provider_message_id = ?
ORDER BY d.id DESC LIMIT 1

-- name: event_delivery_by_key
SELECT d.id, d.lane, m.recipient FROM postlane_deliveries d
JOIN postlane_messages m ON m.id = d.id WHERE m.idempotency_key = ?
ORDER BY d.id DESC LIMIT 1

-- name: upsert_suppression
-- Add a suppression, or replace one that ends sooner (an expired one, or a soft-bounce
-- entry that a hard bounce makes permanent); a row comes back when something was written.
INSERT INTO postlane_suppressions
    (address, stream, reason, delivery_id, created_at, source_event, expires_at)
VALUES (?, ?, ?, ?, {{now}}, ?, {{now}} + ?)
ON CONFLICT (address, stream) DO UPDATE SET reason = excluded.reason,
    delivery_id = excluded.delivery_id, source_event = excluded.source_event,
    expires_at = excluded.expires_at, created_at = excluded.created_at
WHERE postlane_suppressions.expires_at IS NOT NULL
  AND (excluded.expires_at IS NULL
       OR excluded.expires_at > postlane_suppressions.expires_at)
RETURNING address

-- name: fallback_candidates
-- The flag is in the message (metadata), the state in the narrow row: the partial index
-- over messages that carry a fallback (0010) finds the few, their narrow rows filter.
-- Metadata is JSON text on SQLite: json_valid first, so a row another program wrote badly
-- is skipped here rather than failing the query (PostgreSQL's jsonb is always valid).
SELECT {{delivery_message_columns}}
FROM postlane_messages AS m JOIN postlane_deliveries AS d ON d.id = m.id
WHERE CASE WHEN json_valid(m.metadata) THEN json_type(m.metadata, '$.sms_fallback') END
          IS NOT NULL  -- the partial index
  AND d.state IN ('pending', 'sending', 'ambiguous', 'dead', 'expired')
  AND NOT EXISTS (SELECT 1 FROM postlane_sms_fallbacks f WHERE f.email_id = d.id)
  AND (d.state IN ('dead', 'expired')
       OR d.created_at + COALESCE(CASE WHEN json_valid(m.metadata) THEN
                                  json_extract(m.metadata, '$.sms_fallback.after_s') END,
                                  :after_s) <= {{now}})
ORDER BY m.id
LIMIT :limit

-- name: fallback_email
SELECT d.state, m.idempotency_key FROM postlane_deliveries d
JOIN postlane_messages m ON m.id = d.id WHERE d.id = ?

-- name: has_sms_fallback
SELECT 1 FROM postlane_sms_fallbacks WHERE email_id = ?

-- name: insert_sms_fallback
INSERT INTO postlane_sms_fallbacks (email_id, sms_id, reason, created_at)
VALUES (?, ?, ?, {{now}})
RETURNING email_id, sms_id, reason, created_at

-- name: sms_fallback_pair
SELECT email_id, sms_id, reason, created_at FROM postlane_sms_fallbacks
WHERE email_id = ? OR sms_id = ? ORDER BY email_id LIMIT 1

-- name: start_import_canary
INSERT INTO postlane_import_canaries (import_id, size, keys, created_at)
VALUES (?, ?, ?, {{now}})
ON CONFLICT (import_id) DO NOTHING

-- name: waiting_canaries
SELECT import_id FROM postlane_import_canaries WHERE state = 'waiting'
ORDER BY created_at LIMIT ?

-- name: settle_import_canary
UPDATE postlane_import_canaries SET state = ?, reason = ?, settled_at = {{now}}
WHERE import_id = ? AND state = 'waiting'
RETURNING 1

-- name: release_import_canary
UPDATE postlane_import_canaries SET state = 'released', settled_at = {{now}},
    reason = COALESCE(reason || '; ', '') || 'released by an operator'
WHERE import_id = ? AND state IN ('waiting', 'failed')

-- name: import_canary
SELECT import_id, size, keys, state, reason, created_at, settled_at
FROM postlane_import_canaries WHERE import_id = ?

-- name: canary_states
SELECT d.state, count(*), min(CASE WHEN d.state IN ('dead', 'expired') THEN
           m.idempotency_key || ' ' || d.state || ' (' || COALESCE(d.dead_reason, d.state)
           || '): ' || COALESCE(substr(d.last_error, 1, 300), '') END)
FROM postlane_messages AS m JOIN postlane_deliveries AS d ON d.id = m.id
WHERE d.import_id = :import_id AND m.idempotency_key IN (SELECT value FROM json_each(:keys))
GROUP BY d.state

-- name: canary_held
-- An import's held deliveries: pending, due beyond the hold (core.canary.HELD_BEYOND);
-- release_canary_held releases the same rows.
SELECT count(*) FROM postlane_deliveries
WHERE import_id = :import_id AND state = 'pending' AND run_at > {{now}} + :beyond_s

-- name: release_canary_held
UPDATE postlane_deliveries SET run_at = {{now}}, updated_at = {{now}}
WHERE import_id = :import_id AND state = 'pending' AND run_at > {{now}} + :beyond_s
RETURNING id

-- name: get_template
-- A template version, the latest when :version is NULL.
SELECT v.name, v.version, v.subject, v.text_body, v.html_body, v.created_at,
       t.latest_version, t.deprecated_at IS NOT NULL
FROM postlane_templates t
JOIN postlane_template_versions v ON v.name = t.name
WHERE t.name = :name AND t.deleted_at IS NULL
  AND v.version = COALESCE(:version, t.latest_version)

-- name: count_template_references
SELECT count(*) FROM postlane_messages m JOIN postlane_deliveries d ON d.id = m.id
WHERE m.template_id = ? AND {{template_reference}}

-- name: import_progress
UPDATE postlane_imports SET rows_read = :read, rows_enqueued = :enqueued,
    rows_skipped = :skipped, rows_created = rows_created + :created,
    finished_at = CASE WHEN :finished THEN {{now}} ELSE NULL END, updated_at = {{now}}
WHERE import_id = :id

-- name: add_template
-- A template's next version number; a deleted template's name starts it again.
INSERT INTO postlane_templates (name, latest_version, created_at, updated_at)
VALUES (?, 1, {{now}}, {{now}})
ON CONFLICT (name) DO UPDATE SET latest_version = latest_version + 1, deleted_at = NULL,
    updated_at = {{now}}

-- name: add_template_version
INSERT INTO postlane_template_versions
    (name, version, subject, text_body, html_body, created_at)
SELECT name, latest_version, ?, ?, ?, {{now}} FROM postlane_templates WHERE name = ?

-- name: list_templates
SELECT v.name, v.version, v.subject, v.text_body, v.html_body, v.created_at,
       t.latest_version, t.deprecated_at IS NOT NULL
FROM postlane_templates t
JOIN postlane_template_versions v ON v.name = t.name AND v.version = t.latest_version
WHERE t.deleted_at IS NULL ORDER BY t.name

-- name: set_template_deprecated
UPDATE postlane_templates
SET deprecated_at = CASE WHEN :on THEN COALESCE(deprecated_at, {{now}}) END,
    updated_at = {{now}}
WHERE name = :name AND deleted_at IS NULL RETURNING name

-- name: template_exists
SELECT 1 FROM postlane_templates WHERE name = ? AND deleted_at IS NULL

-- name: delete_template_versions
DELETE FROM postlane_template_versions WHERE name = ?

-- name: delete_template
UPDATE postlane_templates SET deleted_at = {{now}}, deprecated_at = NULL, updated_at = {{now}}
WHERE name = ?

-- name: template_deprecated
SELECT deprecated_at IS NOT NULL FROM postlane_templates
WHERE name = ? AND deleted_at IS NULL

-- name: start_import
-- A run of an import already seen (the same template) starts its counts again; one of
-- another template's is refused (no row comes back).
INSERT INTO postlane_imports (import_id, template, template_version, file_name, lane,
    started_at, last_started_at, updated_at)
VALUES (?, ?, ?, ?, ?, {{now}}, {{now}}, {{now}})
ON CONFLICT (import_id) DO UPDATE SET runs = runs + 1,
    last_started_at = {{now}}, finished_at = NULL,
    template_version = excluded.template_version,
    file_name = excluded.file_name, lane = excluded.lane, rows_read = 0,
    rows_enqueued = 0, rows_created = 0, rows_skipped = 0,
    updated_at = {{now}}
WHERE template = excluded.template
RETURNING {{import_columns}}

-- name: get_import
SELECT {{import_columns}} FROM postlane_imports WHERE import_id = ?

-- name: list_imports
SELECT {{import_columns}} FROM postlane_imports
ORDER BY last_started_at DESC, import_id LIMIT ?

-- name: import_counts
SELECT state, attempts > 0, count(*), {{now}} - min(created_at)
FROM postlane_deliveries WHERE import_id = ? GROUP BY 1, 2

-- name: get_controls
SELECT name, value, version, updated_at FROM postlane_controls

-- name: delete_control
DELETE FROM postlane_controls WHERE name = ?

-- name: set_control
INSERT INTO postlane_controls (name, value, updated_at)
VALUES (?, ?, {{now}})
ON CONFLICT (name) DO UPDATE SET value = excluded.value, version = version + 1,
    updated_at = {{now}}

-- name: create_control
INSERT INTO postlane_controls (name, value, updated_at)
VALUES (?, ?, {{now}})
ON CONFLICT (name) DO NOTHING RETURNING name

-- name: update_control_at_version
UPDATE postlane_controls SET value = ?, version = version + 1, updated_at = {{now}}
WHERE name = ? AND version = ? RETURNING name

-- name: delivery_by_key
SELECT {{delivery_columns}} FROM postlane_delivery_rows WHERE idempotency_key = ?

-- name: timeline
-- The event rows, with the claim each ends, then the delivery's own row (the one without an
-- event id): when it was enqueued, and the claim it holds while sending (store.machine.
-- timeline makes the entries neither writes a row for).
SELECT id, delivery_id, at, kind, state, data, claimed_at, claimed_by, claim
FROM postlane_events WHERE delivery_id = :id
UNION ALL
SELECT NULL, id, created_at, NULL, state, NULL, claimed_at, lease_owner, claims
FROM postlane_deliveries WHERE id = :id
ORDER BY 1

-- name: dead_letters
-- WHERE (between double underscores) is the filter, from store.base.dead_letter_conditions.
SELECT {{dead_letter_columns}} FROM postlane_dead_letters dl
JOIN postlane_delivery_rows d ON d.id = dl.delivery_id WHERE __WHERE__
ORDER BY dl.dead_at, dl.delivery_id LIMIT :limit

-- name: mark_dead_letter_replayed
UPDATE postlane_dead_letters
SET replayed_at = {{now}}, replayed_by = ?, replay_count = replay_count + 1
WHERE delivery_id = ? AND discarded_at IS NULL AND EXISTS (
    SELECT 1 FROM postlane_deliveries d WHERE d.id = delivery_id
      AND d.state IN ('dead', 'expired'))
RETURNING replay_count

-- name: replay_delivery
UPDATE postlane_deliveries SET state = 'pending', attempts = 0, run_at = {{now}},
    dead_reason = NULL, finished_at = NULL, updated_at = {{now}}
WHERE id = ?

-- name: discard_dead_letter
UPDATE postlane_dead_letters SET discarded_at = {{now}}, discard_reason = ?
WHERE delivery_id = ? AND discarded_at IS NULL AND EXISTS (
    SELECT 1 FROM postlane_deliveries d WHERE d.id = delivery_id
      AND d.state IN ('dead', 'expired'))
RETURNING delivery_id

-- name: deliveries_where
-- WHERE (between double underscores) is the filter, from store.base.find_conditions or
-- store.base.delivery_conditions.
SELECT {{delivery_columns}} FROM postlane_delivery_rows WHERE __WHERE__
ORDER BY id DESC LIMIT :limit

-- name: cancel_many
UPDATE postlane_deliveries SET state = 'cancelled', finished_at = {{now}}, updated_at = {{now}}
WHERE id IN (SELECT value FROM json_each(?)) AND state = 'pending'
RETURNING id

-- name: lane_depths
SELECT lane, count(*), {{now}} - min(created_at) FROM postlane_deliveries
WHERE state IN ('pending', 'sending') GROUP BY lane

-- name: lane_states
-- One pass over every row kept gives both the states and the arrivals per lane.
SELECT lane, state, count(*) FROM postlane_deliveries GROUP BY lane, state

-- name: pruned_by_lane
SELECT lane, deliveries FROM postlane_pruned

-- name: attempts_in_flight
SELECT attempts + 1, count(*) FROM postlane_deliveries
WHERE state IN ('pending', 'sending') GROUP BY 1 ORDER BY 1

-- name: dead_letter_counts
SELECT dl.reason, dl.cause, count(*) FROM postlane_dead_letters dl
JOIN postlane_deliveries d ON d.id = dl.delivery_id
WHERE dl.discarded_at IS NULL AND d.state IN ('dead', 'expired')
GROUP BY dl.reason, dl.cause

-- name: cancel
UPDATE postlane_deliveries SET state = 'cancelled', finished_at = {{now}}, updated_at = {{now}}
WHERE id = ? AND state IN ('pending', 'ambiguous')
RETURNING id

-- name: prunable
-- A batch at a time: each is one write transaction, so workers get the lock in between.
SELECT id, lane FROM postlane_deliveries
WHERE finished_at IS NOT NULL AND (
    (state IN ('sent', 'expired', 'cancelled', 'suppressed') AND finished_at < {{now}} - ?)
    OR (state = 'dead' AND finished_at < {{now}} - ?))
LIMIT 5000

-- name: count_pruned
-- Arrivals per lane are kept + pruned: retention must not turn that counter back.
INSERT INTO postlane_pruned (lane, deliveries) VALUES (?, ?)
ON CONFLICT (lane) DO UPDATE SET deliveries = deliveries + excluded.deliveries

-- name: prune_events
-- The timeline and the messages have no foreign key (checked on every insert); a
-- delivery, its message and its events go together.
DELETE FROM postlane_events WHERE delivery_id IN (SELECT value FROM json_each(?))

-- name: prune_messages
DELETE FROM postlane_messages WHERE id IN (SELECT value FROM json_each(?))

-- name: prune_deliveries
DELETE FROM postlane_deliveries WHERE id IN (SELECT value FROM json_each(?))
