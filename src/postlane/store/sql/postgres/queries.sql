-- The postgres engine's queries, by name (postlane.store.queries). Fragments written
-- {{name}} come from postlane.store.machine.
--
-- A word in capitals between double underscores (__WHERE__, __GUARD__) is filled by the
-- engine when it runs the query: with another entry of this file, or with conditions it
-- assembles from a caller's optional filters (store.base). The engine replaces every
-- occurrence, so an entry's comments name such a marker without its underscores (WHERE).
--
-- Parameters are psycopg's, a percent sign and a name, so a comment inside an entry never
-- holds a percent sign: psycopg reads one anywhere in the text, comments included.
--
-- Where PostgreSQL's text differs from SQLite's, it is for one of these reasons, noted in
-- the entry: FOR UPDATE SKIP LOCKED (many workers on many hosts claim at once; SQLite has
-- one writer and needs no row locks), make_interval and now() (the database's clock does
-- the interval arithmetic; SQLite's engine computes times as text), jsonb and its
-- operators (PostgreSQL stores JSON as jsonb; SQLite as text read with json_*), arrays
-- and unnest (a batch binds as one array per column; SQLite binds JSON text), writable
-- CTEs with RETURNING (a transition, its timeline event and its dead letter in one
-- statement), COPY (the bulk path), and LISTEN (the wake-up on new work).


-- ===========================================================================================
-- _base: migrations and the wake-up
-- ===========================================================================================

-- name: migrations_create
CREATE TABLE IF NOT EXISTS {{migrations_table}} (
    version INTEGER PRIMARY KEY, name TEXT NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now())

-- name: migrations_applied
SELECT version FROM {{migrations_table}}

-- name: migrations_table_exists
-- to_regclass: a table that does not exist is NULL here, not an error.
SELECT to_regclass(%s) IS NOT NULL

-- name: migrate_lock
-- One migrator at a time across every host (an advisory lock until the transaction ends).
SELECT pg_advisory_xact_lock(hashtext('postlane_migrate'))

-- name: migration_record
INSERT INTO {{migrations_table}} (version, name) VALUES (%s, %s)

-- name: listen
-- The channel the enqueue trigger of 0001 notifies (pg_notify); SQLite polls instead.
LISTEN postlane_enqueued


-- ===========================================================================================
-- _producing: enqueue one message, or a batch
-- ===========================================================================================

-- name: insert_one
-- The message (written once) and the delivery's narrow row (rewritten by every transition)
-- share the id, taken from the deliveries' sequence. The message goes first: its unique key
-- decides whether there is a delivery to create at all. The ID marker is that id: next_delivery_id
-- for one message, an id reserved in input order in the synchronous bulk form. Writable
-- CTEs: the message and its delivery are one statement (its "enqueued" entry is the
-- delivery's created_at: store.machine.timeline).
WITH msg AS (
    INSERT INTO postlane_messages (id, idempotency_key, recipient, sender, subject, text_body,
                                   html_body, headers, metadata, template_id,
                                   template_version, producer)
    VALUES (__ID__, %(key)s, %(recipient)s, %(sender)s, %(subject)s, %(text)s, %(html)s,
            %(headers)s, %(metadata)s, %(template_id)s, %(template_version)s, %(producer)s)
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id
), ins AS (
    INSERT INTO postlane_deliveries (id, lane, channel, import_id, run_at, expires_at)
    OVERRIDING SYSTEM VALUE
    SELECT id, %(lane)s, %(channel)s, %(import_id)s,
           now() + make_interval(secs => %(delay_s)s::float8),
           COALESCE(%(expires_at)s::timestamptz,
                    now() + make_interval(secs => %(expires_in_s)s::float8))
    FROM msg
    RETURNING id
)
SELECT id FROM ins

-- name: next_delivery_id
-- The sequence is named as a literal: resolved once at parse time, nextval costs a fifth of
-- what it does through pg_get_serial_sequence.
nextval('postlane_deliveries_id_seq')

-- name: held_by_keys
SELECT {{held_columns}} FROM {{held_from}} WHERE m.idempotency_key = ANY(%s)

-- name: reserve_ids
-- The direct COPY's ids and clock, in one round trip. now() is the transaction's start, so
-- run_at and expires_at computed from it equal what now() in an INSERT would give: the
-- database clock, not the client's.
SELECT now(), ARRAY(SELECT nextval('postlane_deliveries_id_seq') FROM generate_series(1, %s))

-- name: copy_messages
-- COPY writes given values into the identity column (as OVERRIDING SYSTEM VALUE would).
-- COLUMNS is the id, the key, the recipient and the subject, then only those of the other
-- columns some message of the batch sets: a column left out takes its default (NULL, or
-- the empty JSON object), which is what an unset field stores anyway, and costs neither
-- side a value per row.
COPY postlane_messages (__COLUMNS__) FROM STDIN

-- name: insert_deliveries
-- The batch's deliveries, in one statement from parallel arrays, in key order like the
-- messages. A column that is the same for every row (the lane, the channel) or unset for
-- all (import, delay, expiry) comes as a NULL array, which unnest pads with NULLs, and takes
-- the scalar or the default instead: run_at is then now(), the same transaction clock
-- reserve_ids read. No event row: the timeline's "enqueued" entry is the delivery's
-- created_at (store.machine.timeline).
INSERT INTO postlane_deliveries (id, lane, channel, import_id, run_at, expires_at)
OVERRIDING SYSTEM VALUE
SELECT r.id, COALESCE(r.lane, %(lane)s), COALESCE(r.channel, %(channel)s), r.import_id,
       COALESCE(r.run_at, now()), r.expires_at
FROM unnest(%(ids)s::bigint[], %(lanes)s::text[], %(channels)s::text[],
            %(import_ids)s::text[], %(run_at)s::timestamptz[], %(expires_at)s::timestamptz[])
     AS r(id, lane, channel, import_id, run_at, expires_at)

-- name: create_staging
-- A batch's rows as the insert-or-find way stages them (ids and times already set).
CREATE TEMP TABLE postlane_staging (
    id BIGINT, idempotency_key TEXT, lane TEXT, channel TEXT, recipient TEXT, sender TEXT,
    subject TEXT, text_body TEXT, html_body TEXT, headers JSONB, metadata JSONB, import_id TEXT,
    template_id TEXT, template_version INTEGER, producer TEXT, run_at TIMESTAMPTZ,
    expires_at TIMESTAMPTZ
) ON COMMIT DROP

-- name: copy_staging
-- The message's twelve fields first, then the delivery's (without the id again): the
-- engine's rows are in this order.
COPY postlane_staging (id, idempotency_key, recipient, sender, subject, text_body, html_body,
                       headers, metadata, template_id, template_version, producer, lane,
                       channel, import_id, run_at, expires_at) FROM STDIN

-- name: insert_staged
WITH msg AS (
    INSERT INTO postlane_messages (id, idempotency_key, recipient, sender, subject, text_body,
                                   html_body, headers, metadata, template_id,
                                   template_version, producer)
    SELECT id, idempotency_key, recipient, sender, subject, text_body, html_body, headers,
           metadata, template_id, template_version, producer
    FROM postlane_staging
    ORDER BY idempotency_key COLLATE "C"  -- the direct COPY's order: see enqueue_many
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id, idempotency_key
), ins AS (
    INSERT INTO postlane_deliveries (id, lane, channel, import_id, run_at, expires_at)
    OVERRIDING SYSTEM VALUE
    SELECT s.id, s.lane, s.channel, s.import_id, s.run_at, s.expires_at
    FROM postlane_staging s JOIN msg ON msg.id = s.id
)
SELECT id, idempotency_key FROM msg

-- name: drop_staging
-- ON COMMIT DROP only fires at the caller's commit: dropped at once so a second batch in
-- the same transaction can stage again.
DROP TABLE postlane_staging


-- ===========================================================================================
-- _drivers: the outbox through psycopg2 and asyncpg
-- ===========================================================================================

-- name: insert_unnest
-- The batch as parallel arrays, one per column (neither driver has psycopg 3's COPY of
-- Python rows); the JSON columns travel as text. The parameters are in the order of
-- _drivers._UNNEST_COLUMNS (a test holds them to it).
WITH r AS (
    SELECT * FROM unnest(%(id)s::bigint[], %(key)s::text[], %(lane)s::text[],
                         %(channel)s::text[], %(recipient)s::text[], %(sender)s::text[],
                         %(subject)s::text[], %(text)s::text[], %(html)s::text[],
                         %(headers)s::text[], %(metadata)s::text[], %(import_id)s::text[],
                         %(template_id)s::text[], %(template_version)s::int[],
                         %(delay_s)s::float8[], %(expires_at)s::timestamptz[],
                         %(expires_in_s)s::float8[])
         AS r(id, key, lane, channel, recipient, sender, subject, text, html, headers,
              metadata, import_id, template_id, template_version, delay_s, expires_at,
              expires_in_s)
), msg AS (
    INSERT INTO postlane_messages (id, idempotency_key, recipient, sender, subject, text_body,
                                   html_body, headers, metadata, template_id,
                                   template_version, producer)
    SELECT r.id, r.key, r.recipient, r.sender, r.subject, r.text, r.html, r.headers::jsonb,
           r.metadata::jsonb, r.template_id, r.template_version, NULL::text
    FROM r
    ORDER BY r.key COLLATE "C"
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id, idempotency_key
), ins AS (
    INSERT INTO postlane_deliveries (id, lane, channel, import_id, run_at, expires_at)
    OVERRIDING SYSTEM VALUE
    SELECT r.id, r.lane, r.channel, r.import_id, now() + make_interval(secs => r.delay_s),
           COALESCE(r.expires_at, now() + make_interval(secs => r.expires_in_s))
    FROM r JOIN msg ON msg.id = r.id
)
SELECT id, idempotency_key FROM msg


-- ===========================================================================================
-- _claims: the worker's path
-- ===========================================================================================

-- name: claim
-- FOR UPDATE SKIP LOCKED: workers on many hosts claim at once, each skipping the rows
-- another is claiming instead of waiting for them. Lease times from the database's clock
-- (make_interval), never a host's. No timeline row: the row that ends the claim tells it
-- (0015, store.machine.timeline), from claimed_at and the claim number kept here.
WITH picked AS (
    SELECT id FROM postlane_deliveries
    WHERE state = 'pending' AND lane = %(lane)s AND channel = %(channel)s AND run_at <= now()
      AND (import_id IS NULL OR NOT (import_id = ANY(%(exclude_imports)s::text[])))
    ORDER BY run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE postlane_deliveries d
    SET state = 'sending', lease_owner = %(owner)s,
        lease_expires_at = now() + make_interval(secs => %(lease_s)s::float8),
        claims = d.claims + 1, attempt_started_at = NULL, claimed_at = now(),
        updated_at = now()
    -- = ANY(ARRAY(...)), not a join with picked: the plan stays primary-key lookups when
    -- it is generic (prepared), where LIMIT's parameter is unknown. Joined, the planner
    -- guessed a tenth of the table and hashed all of it: 30 ms instead of 3.
    WHERE d.id = ANY(ARRAY(SELECT id FROM picked))
    RETURNING d.*
)
-- The update rewrote only the narrow rows; the message is read, never written. Two hints
-- save the worker a round trip each per batch (core.message.Delivery): an address that is
-- ASCII and not on the suppression list under its lowered spelling (the list's one
-- spelling, core.addresses.suppression_address) needs no suppression check, and a
-- delivery without stored parts no read of them.
SELECT {{claimed_columns}},
       m.recipient !~ '^[\x20-\x7e]*$' OR EXISTS (
           SELECT 1 FROM postlane_suppressions s WHERE s.address = lower(m.recipient)
       ) AS may_be_suppressed,
       EXISTS (SELECT 1 FROM postlane_attachments a WHERE a.delivery_id = c.id)
           AS has_attachments
FROM claimed c JOIN postlane_messages m ON m.id = c.id
ORDER BY c.run_at, c.id

-- name: start_attempts
-- No updated_at here: it is indexed (ambiguous rows), and leaving indexed columns alone
-- lets PostgreSQL update the row in place (HOT) on the hot path. The batch binds as one
-- array per column (unnest).
UPDATE postlane_deliveries d SET attempt_started_at = now()
FROM unnest(%(ids)s::bigint[], %(claims)s::int[]) AS t(id, claims)
WHERE d.id = t.id AND d.claims = t.claims  -- leased to me (see guard_leased_to_me):
  AND d.lease_owner = %(owner)s AND d.lease_expires_at > now()
RETURNING d.id

-- name: renew_leases
UPDATE postlane_deliveries d
SET lease_expires_at = now() + make_interval(secs => %(lease_s)s::float8)
FROM unnest(%(ids)s::bigint[], %(claims)s::int[]) AS t(id, claims)
WHERE d.id = t.id AND d.claims = t.claims  -- leased to me (see guard_leased_to_me):
  AND d.lease_owner = %(owner)s AND d.lease_expires_at > now()
RETURNING d.id

-- name: set_state
-- A batch of transitions, each with its timeline event and, for a dead or expired one, its
-- dead letter, in one statement (writable CTEs). The GUARD marker is guard_leased_to_me or
-- guard_ambiguous.
WITH t AS (
    -- One JSON document for the whole batch: json.dumps is far cheaper than ten arrays, and
    -- a row as an array (fields by position, as _batch writes them) cheaper than an object.
    SELECT (e->>0)::bigint AS id, (e->>1)::int AS claims, e->>2 AS state,
           (e->>3)::float8 AS delay_s, (e->>4)::int AS spend, e->>5 AS error, e->>6 AS pmid,
           e->>7 AS reason, e->>8 AS cause, e->>9 AS event, e->10 AS detail
    FROM jsonb_array_elements(%(batch)s::jsonb) AS b(e)
), u AS (
    UPDATE postlane_deliveries d SET
        state = t.state,
        attempts = d.attempts + t.spend,
        run_at = CASE WHEN t.state = 'pending'
                      THEN now() + make_interval(secs => COALESCE(t.delay_s, 0))
                      ELSE d.run_at END,
        lease_owner = NULL, lease_expires_at = NULL, attempt_started_at = NULL,
        last_error = COALESCE(t.error, d.last_error),
        provider_message_id = COALESCE(t.pmid, d.provider_message_id),
        dead_reason = CASE WHEN t.state = 'dead' THEN t.reason ELSE d.dead_reason END,
        sent_at = CASE WHEN t.state = 'sent' THEN now() ELSE d.sent_at END,
        finished_at = CASE WHEN t.state IN {{terminal}} THEN now() ELSE NULL END,
        updated_at = now()
    FROM t
    WHERE d.id = t.id AND d.claims = t.claims AND __GUARD__
    RETURNING d.id, d.state, d.last_error, t.event, t.detail, t.reason, t.cause,
              d.claims, d.claimed_at,
              -- the full row only where a dead letter needs it: building it is not free
              CASE WHEN t.state IN ('dead', 'expired') THEN to_jsonb(d.*) END AS snapshot
), ev AS (
    -- A worker's outcome ends its claim, and tells it (0015); settling an ambiguous
    -- delivery (no owner) ends none.
    INSERT INTO postlane_events (delivery_id, kind, state, data, claimed_at, claimed_by, claim)
    SELECT id, event, state, detail,
           CASE WHEN %(owner)s::text IS NOT NULL THEN claimed_at END, %(owner)s::text,
           CASE WHEN %(owner)s::text IS NOT NULL THEN claims END
    FROM u
), dl AS (
    INSERT INTO postlane_dead_letters
        (delivery_id, reason, cause, snapshot, last_response, attempt_history)
    -- The snapshot is the whole delivery: its new narrow row and its message.
    SELECT u.id, COALESCE(u.reason, u.state), u.cause,
           u.snapshot || (SELECT to_jsonb(m.*) - 'id' FROM postlane_messages m
                          WHERE m.id = u.id),
           u.last_error,
           COALESCE((SELECT jsonb_agg(e.data || jsonb_build_object('at', e.at) ORDER BY e.id)
                     FROM postlane_events e
                     WHERE e.delivery_id = u.id AND e.data ? 'outcome'), '[]'::jsonb)
           || CASE WHEN u.detail ? 'outcome'
                   THEN jsonb_build_array(u.detail || jsonb_build_object('at', now()))
                   ELSE '[]'::jsonb END
    FROM u WHERE u.state IN ('dead', 'expired')
    ON CONFLICT (delivery_id) DO UPDATE SET
        reason = excluded.reason, cause = excluded.cause, snapshot = excluded.snapshot,
        last_response = excluded.last_response, attempt_history = excluded.attempt_history,
        dead_at = excluded.dead_at, discarded_at = NULL, discard_reason = NULL
)
SELECT id FROM u

-- name: guard_leased_to_me
-- set_state's guard for a worker's outcome: "sending and leased to me". The table's CHECK
-- constraint makes lease_owner IS NOT NULL equivalent to state = 'sending', and leaving the
-- state out keeps the planner on primary-key lookups instead of the partial index of leased
-- rows (which it prefers, badly, while a freshly loaded table has no statistics).
d.lease_owner = %(owner)s

-- name: guard_ambiguous
-- set_state's guard for settling an ambiguous delivery.
d.state = 'ambiguous'

-- name: list_ambiguous
SELECT {{delivery_columns}} FROM {{delivery_rows}} WHERE state = 'ambiguous'
  AND (%s::text[] IS NULL OR lane = ANY(%s::text[]))
  AND (%s::text IS NULL OR channel = %s::text)
ORDER BY updated_at, id LIMIT %s

-- name: rescue
-- Where a rescued delivery goes and what the timeline says are store.machine's
-- (rescue_target, rescue_detail); this is their PostgreSQL spelling, in one statement.
-- FOR UPDATE SKIP LOCKED: every worker runs the rescue; two never take the same lease.
WITH picked AS (
    SELECT id, lease_owner, attempt_started_at IS NOT NULL AS started, claimed_at
    FROM postlane_deliveries
    WHERE state = 'sending' AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), u AS (
    UPDATE postlane_deliveries d SET
        state = CASE WHEN p.started THEN 'ambiguous' ELSE 'pending' END,
        attempts = d.attempts + CASE WHEN p.started THEN 1 ELSE 0 END,
        last_error = CASE WHEN p.started THEN {{rescue_started_error}} ELSE d.last_error END,
        lease_owner = NULL, lease_expires_at = NULL, attempt_started_at = NULL,
        updated_at = now()
    FROM picked p WHERE d.id = p.id
    RETURNING d.id, d.state, d.attempts, d.claims, p.lease_owner, p.started, p.claimed_at
), ev AS (
    -- A started attempt that never reported is part of the attempt history (as ambiguous).
    -- The rescue ends the claim, and tells it (0015).
    INSERT INTO postlane_events (delivery_id, kind, state, data, claimed_at, claimed_by, claim)
    SELECT id, {{rescue_event}}, state,
           jsonb_build_object('owner', lease_owner, 'attempt_started', started)
           || CASE WHEN started THEN jsonb_build_object(
                  'outcome', 'ambiguous', 'attempt', attempts,
                  'response', {{rescue_started_response}})
              ELSE '{}'::jsonb END,
           claimed_at, lease_owner, claims
    FROM u
)
SELECT id, state FROM u


-- ===========================================================================================
-- _operating: controls, reading, dead letters, bulk actions, stats, retention
-- ===========================================================================================

-- name: get_controls
SELECT name, value, version, updated_at FROM postlane_controls

-- name: delete_control
DELETE FROM postlane_controls WHERE name = %s

-- name: set_control
INSERT INTO postlane_controls (name, value) VALUES (%s, %s)
ON CONFLICT (name) DO UPDATE SET value = excluded.value,
    version = postlane_controls.version + 1, updated_at = now()

-- name: add_control
INSERT INTO postlane_controls (name, value) VALUES (%s, %s)
ON CONFLICT (name) DO NOTHING RETURNING name

-- name: replace_control
UPDATE postlane_controls SET value = %s, version = version + 1, updated_at = now()
WHERE name = %s AND version = %s RETURNING name

-- name: get_by_id
SELECT {{delivery_columns}} FROM {{delivery_rows}} WHERE id = %s

-- name: get_by_key
SELECT {{delivery_columns}} FROM {{delivery_rows}} WHERE idempotency_key = %s

-- name: timeline
-- The event rows, with the claim each ends, then the delivery's own row (the one without an
-- event id): when it was enqueued, and the claim it holds while sending (store.machine.
-- timeline makes the entries neither writes a row for).
SELECT id, delivery_id, at, kind, state, data, claimed_at, claimed_by, claim
FROM postlane_events WHERE delivery_id = %(id)s
UNION ALL
SELECT NULL, id, created_at, NULL, state, NULL, claimed_at, lease_owner, claims
FROM postlane_deliveries WHERE id = %(id)s
ORDER BY 1

-- name: dead_letters
-- The WHERE marker: the triage selection's conditions (store.base.dead_letter_conditions).
SELECT {{dead_letter_columns}} FROM postlane_dead_letters dl
JOIN {{delivery_rows}} d ON d.id = dl.delivery_id WHERE __WHERE__
ORDER BY dl.dead_at, dl.delivery_id LIMIT %(limit)s

-- name: dead_letter_by_id
dl.delivery_id = %(id)s

-- name: replay_dead_letters
WITH dl AS (
    UPDATE postlane_dead_letters dl
    SET replayed_at = now(), replayed_by = %(by)s, replay_count = dl.replay_count + 1
    FROM postlane_deliveries d
    WHERE dl.delivery_id = ANY(%(ids)s::bigint[]) AND d.id = dl.delivery_id
      AND d.state IN ('dead', 'expired') AND dl.discarded_at IS NULL
    RETURNING dl.delivery_id, dl.replay_count
), u AS (
    UPDATE postlane_deliveries d
    SET state = 'pending', attempts = 0, run_at = now(), dead_reason = NULL,
        finished_at = NULL, updated_at = now()
    FROM dl WHERE d.id = dl.delivery_id
    RETURNING d.id, dl.replay_count
), ev AS (
    INSERT INTO postlane_events (delivery_id, kind, state, data)
    SELECT id, 'replayed', 'pending',
           jsonb_build_object('by', %(by)s::text, 'replay', replay_count) FROM u
)
SELECT id FROM u

-- name: deliveries_where
-- The WHERE marker: store.base.find_conditions (find_deliveries) or delivery_conditions
-- (list_deliveries).
SELECT {{delivery_columns}} FROM {{delivery_rows}} WHERE __WHERE__
ORDER BY id DESC LIMIT %(limit)s

-- name: count_deliveries
-- The SOURCE and WHERE markers: store.base.delivery_source and delivery_conditions; the
-- CAP marker is count_deliveries_cap or nothing (no order: any cap + 1 rows tell "more than
-- cap").
SELECT count(*), COALESCE(max(id), 0) FROM (
    SELECT id FROM __SOURCE__ WHERE __WHERE__
    __CAP__
) s

-- name: count_deliveries_cap
LIMIT %(cap)s

-- name: cancel
WITH u AS (
    UPDATE postlane_deliveries SET state = 'cancelled', finished_at = now(), updated_at = now()
    WHERE id = %(id)s AND state IN ('pending', 'ambiguous')
    RETURNING id
), ev AS (
    INSERT INTO postlane_events (delivery_id, kind, state, data)
    SELECT id, 'cancelled', 'cancelled', jsonb_build_object('reason', %(reason)s::text) FROM u
)
SELECT id FROM u

-- name: cancel_many
-- Rows locked in id order and skipped when another transaction holds them (a claim): a bulk
-- action never waits behind, nor deadlocks with, the send path. (FOR UPDATE SKIP LOCKED:
-- SQLite's single writer cannot meet a claim half done.)
WITH u AS (
    UPDATE postlane_deliveries SET state = 'cancelled', finished_at = now(), updated_at = now()
    WHERE id IN (SELECT id FROM postlane_deliveries
                 WHERE id = ANY(%(ids)s::bigint[]) AND state = 'pending'
                 ORDER BY id FOR UPDATE SKIP LOCKED)
      AND state = 'pending'
    RETURNING id
), ev AS (
    INSERT INTO postlane_events (delivery_id, kind, state, data)
    SELECT id, 'cancelled', 'cancelled',
           jsonb_build_object('reason', %(reason)s::text, 'by', %(by)s::text) FROM u
)
SELECT id FROM u

-- name: discard_dead_letters
-- One entry or many (discard_dead_letter passes one id).
WITH dl AS (
    UPDATE postlane_dead_letters dl SET discarded_at = now(), discard_reason = %(reason)s
    FROM postlane_deliveries d
    WHERE dl.delivery_id = ANY(%(ids)s::bigint[]) AND d.id = dl.delivery_id
      AND d.state IN ('dead', 'expired') AND dl.discarded_at IS NULL
    RETURNING dl.delivery_id
), ev AS (
    INSERT INTO postlane_events (delivery_id, kind, state, data)
    SELECT delivery_id, 'discarded', NULL,
           jsonb_build_object('by', %(by)s::text, 'reason', %(reason)s::text) FROM dl
)
SELECT delivery_id FROM dl

-- name: stats_lanes
SELECT lane, count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(created_at)), 0)
FROM postlane_deliveries WHERE state IN ('pending', 'sending') GROUP BY lane

-- name: stats_states
-- One pass over every row kept gives both the states and the arrivals per lane.
SELECT lane, state, count(*) FROM postlane_deliveries GROUP BY lane, state

-- name: stats_pruned
SELECT lane, deliveries FROM postlane_pruned

-- name: stats_attempts
SELECT attempts + 1, count(*) FROM postlane_deliveries
WHERE state IN ('pending', 'sending') GROUP BY 1 ORDER BY 1

-- name: stats_dead_letters
SELECT dl.reason, dl.cause, count(*) FROM postlane_dead_letters dl
JOIN postlane_deliveries d ON d.id = dl.delivery_id
WHERE dl.discarded_at IS NULL AND d.state IN ('dead', 'expired')
GROUP BY dl.reason, dl.cause

-- name: prune
-- At most 5000 deliveries a statement (the engine repeats it while it deletes that many).
WITH gone AS (
    DELETE FROM postlane_deliveries WHERE id IN (
        SELECT id FROM postlane_deliveries
        WHERE finished_at IS NOT NULL AND (
            (state IN ('sent', 'expired', 'cancelled', 'suppressed')
                AND finished_at < now() - make_interval(secs => %(finished_s)s::float8))
            OR (state = 'dead'
                AND finished_at < now() - make_interval(secs => %(dead_s)s::float8)))
        LIMIT 5000
    ) RETURNING id, lane
), counted AS (
    -- Arrivals per lane are kept + pruned: retention must not turn that counter back.
    INSERT INTO postlane_pruned AS p (lane, deliveries)
    SELECT lane, count(*) FROM gone GROUP BY lane
    ON CONFLICT (lane) DO UPDATE SET deliveries = p.deliveries + excluded.deliveries
), messages AS (
    -- No foreign key either (it would be checked on every enqueue): a delivery's message
    -- goes with it here.
    DELETE FROM postlane_messages WHERE id IN (SELECT id FROM gone)
), timeline AS (
    -- The timeline has no foreign key (it would be checked on every event insert, the hot
    -- path); deliveries and their events go together here instead.
    DELETE FROM postlane_events WHERE delivery_id IN (SELECT id FROM gone)
)
SELECT count(*) FROM gone


-- ===========================================================================================
-- _on_call: workers' heartbeats and outcomes per minute
-- ===========================================================================================

-- name: heartbeat
INSERT INTO postlane_workers (owner, host, pid, version, provider, lanes, in_flight, interval_s)
VALUES (%(owner)s, %(host)s, %(pid)s, %(version)s, %(provider)s, %(lanes)s, %(in_flight)s,
        %(interval_s)s)
ON CONFLICT (owner) DO UPDATE SET lanes = excluded.lanes, in_flight = excluded.in_flight,
    interval_s = excluded.interval_s, heartbeat_at = now()

-- name: forget_gone_workers
DELETE FROM postlane_workers WHERE heartbeat_at < now() - make_interval(secs => %s)

-- name: add_outcomes
-- The minute from the database's clock, as every other time here.
INSERT INTO postlane_outcome_minutes (minute, lane, outcome, count)
SELECT (floor(EXTRACT(EPOCH FROM now()) / 60) * 60)::bigint, lane, outcome, n
FROM unnest(%(lanes)s::text[], %(outcomes)s::text[], %(counts)s::bigint[]) AS t(lane, outcome, n)
ON CONFLICT (minute, lane, outcome)
DO UPDATE SET count = postlane_outcome_minutes.count + excluded.count

-- name: forget_old_minutes
DELETE FROM postlane_outcome_minutes WHERE minute < EXTRACT(EPOCH FROM now()) - %s

-- name: forget_worker
DELETE FROM postlane_workers WHERE owner = %s

-- name: workers
SELECT owner, host, pid, version, provider, lanes, in_flight, interval_s, started_at,
       heartbeat_at, EXTRACT(EPOCH FROM now() - heartbeat_at)::float8
FROM postlane_workers ORDER BY host, pid, owner

-- name: outcome_minutes
SELECT minute, lane, outcome, count FROM postlane_outcome_minutes
WHERE minute >= EXTRACT(EPOCH FROM now()) - %s ORDER BY minute, lane, outcome


-- ===========================================================================================
-- _provider_events: provider events and the suppression list
-- ===========================================================================================

-- name: event_delivery
-- The COLUMN marker is one of d.id, d.provider_message_id, m.idempotency_key (tried in that order).
SELECT d.id, d.lane, m.recipient FROM postlane_deliveries d
JOIN postlane_messages m ON m.id = d.id WHERE __COLUMN__ = %s
ORDER BY d.id DESC LIMIT 1

-- name: insert_provider_event
INSERT INTO postlane_provider_events
    (provider, event_id, kind, provider_message_id, delivery_id, recipient, lane)
VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING event_id

-- name: provider_event_timeline
INSERT INTO postlane_events (delivery_id, kind, state, data) VALUES (%s, %s, NULL, %s)

-- name: raise_provider_status
-- A status only moves up core.records.STATUS_RANK (an unknown or no status ranks -1).
-- SQLite's engine compares the ranks in Python, inside its one writer's transaction.
UPDATE postlane_deliveries SET provider_status = %(kind)s
WHERE id = %(id)s
  AND (CASE provider_status {{provider_status_ranks}} ELSE -1 END)
      < (CASE %(kind)s {{provider_status_ranks}} ELSE -1 END)
RETURNING id

-- name: soft_bounces
SELECT count(*) FROM postlane_provider_events WHERE recipient = %s
  AND kind = 'soft_bounced' AND received_at > now() - make_interval(secs => %s)

-- name: upsert_suppression
-- Add a suppression, or replace one that ends sooner (an expired one, or a soft-bounce
-- entry that a hard bounce makes permanent).
INSERT INTO postlane_suppressions
    (address, stream, reason, delivery_id, source_event, expires_at)
VALUES (%(address)s, %(stream)s, %(reason)s, %(delivery)s, %(source)s,
        now() + make_interval(secs => %(seconds)s))
ON CONFLICT (address, stream) DO UPDATE SET reason = EXCLUDED.reason,
    delivery_id = EXCLUDED.delivery_id, source_event = EXCLUDED.source_event,
    expires_at = EXCLUDED.expires_at, created_at = now()
WHERE postlane_suppressions.expires_at IS NOT NULL
  AND (EXCLUDED.expires_at IS NULL
       OR EXCLUDED.expires_at > postlane_suppressions.expires_at)
RETURNING address

-- name: unsuppress
DELETE FROM postlane_suppressions WHERE address = ANY(%s)
  AND (%s::text IS NULL OR stream = %s)

-- name: list_suppressions
SELECT address, stream, reason, delivery_id, created_at, source_event, expires_at
FROM postlane_suppressions
WHERE (%s::text[] IS NULL OR address = ANY(%s))
ORDER BY created_at DESC LIMIT %s

-- name: suppressed_among
-- The deliveries' addresses as one JSON document (jsonb_to_recordset).
SELECT t.id, s.reason FROM jsonb_to_recordset(%s::jsonb)
    AS t(id bigint, address text, lane text)
JOIN postlane_suppressions s ON s.address = t.address
    AND s.stream IN (t.lane, '*')
    AND (s.expires_at IS NULL OR s.expires_at > now())

-- name: requeue_suppressed
WITH u AS (
    UPDATE postlane_deliveries SET state = 'pending', run_at = now(),
        finished_at = NULL, updated_at = now()
    WHERE state = 'suppressed' AND id IN (
        SELECT id FROM postlane_messages
        WHERE lower(recipient) = ANY(%(address)s))
    RETURNING id
), ev AS (
    INSERT INTO postlane_events (delivery_id, kind, state, data)
    SELECT id, 'unsuppressed', 'pending', '{}'::jsonb FROM u
) SELECT id FROM u ORDER BY id

-- name: deliverability_sent
SELECT lane, count(*) FROM postlane_deliveries WHERE state = 'sent'
  AND finished_at > now() - make_interval(secs => %s) GROUP BY lane

-- name: deliverability_events
SELECT lane, kind, count(*) FROM postlane_provider_events
WHERE lane IS NOT NULL AND received_at > now() - make_interval(secs => %s)
GROUP BY lane, kind

-- name: provider_event_totals
SELECT kind, COALESCE(lane, ''), count(*) FROM postlane_provider_events GROUP BY 1, 2


-- ===========================================================================================
-- _routes: which provider each delivery's latest attempt went to
-- ===========================================================================================

-- name: delivery_routes
SELECT delivery_id, provider, attempt, pinned FROM postlane_delivery_routes
WHERE delivery_id = ANY(%s::bigint[])

-- name: record_routes
INSERT INTO postlane_delivery_routes (delivery_id, provider, attempt, pinned)
SELECT * FROM unnest(%(ids)s::bigint[], %(providers)s::text[], %(attempts)s::int[],
                     %(pinned)s::bool[])
ON CONFLICT (delivery_id) DO UPDATE SET
    provider = excluded.provider, attempt = excluded.attempt, pinned = excluded.pinned,
    updated_at = now()


-- ===========================================================================================
-- _callbacks: status callbacks (migration 0008)
-- ===========================================================================================

-- name: add_callback_endpoint
INSERT INTO postlane_callback_endpoints (url, secret, api_key_id, events)
VALUES (%s, %s, %s, %s)
RETURNING id, url, api_key_id, events, created_at, disabled_at, secret

-- name: list_callback_endpoints
SELECT id, url, api_key_id, events, created_at, disabled_at, secret
FROM postlane_callback_endpoints
WHERE %s OR api_key_id IS NOT DISTINCT FROM %s::bigint ORDER BY id

-- name: disable_callback_endpoint
UPDATE postlane_callback_endpoints SET disabled_at = now()
WHERE id = %s AND disabled_at IS NULL
  AND (%s::bigint IS NULL OR api_key_id = %s::bigint) RETURNING id

-- name: claim_callbacks
-- FOR UPDATE SKIP LOCKED, as the deliveries' claim: every worker host sends callbacks.
WITH gone AS (
    UPDATE postlane_callbacks SET state = 'dead', finished_at = now(),
           last_error = 'endpoint disabled'
    WHERE state = 'pending' AND endpoint_id IN
        (SELECT id FROM postlane_callback_endpoints WHERE disabled_at IS NOT NULL)
), picked AS (
    SELECT id FROM postlane_callbacks
    WHERE state = 'pending' AND run_at <= now() AND endpoint_id NOT IN
        (SELECT id FROM postlane_callback_endpoints WHERE disabled_at IS NOT NULL)
    ORDER BY run_at, id LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), c AS (
    UPDATE postlane_callbacks c
    SET run_at = now() + make_interval(secs => %(lease_s)s::float8), attempts = c.attempts + 1
    FROM picked WHERE c.id = picked.id
    RETURNING c.*
)
SELECT c.id, c.endpoint_id, c.event_id, c.delivery_id, c.type, c.payload, c.state,
       c.attempts, c.last_error, c.created_at, e.url, e.secret
FROM c JOIN postlane_callback_endpoints e ON e.id = c.endpoint_id
ORDER BY c.id

-- name: finish_callbacks
WITH t AS (
    SELECT * FROM jsonb_to_recordset(%(batch)s::jsonb) AS t(
        id bigint, attempts int, outcome text, delay_s float8, error text)
), u AS (
    UPDATE postlane_callbacks c SET
        state = CASE WHEN t.outcome = 'retry' THEN 'pending' ELSE t.outcome END,
        run_at = CASE WHEN t.outcome = 'retry'
                      THEN now() + make_interval(secs => t.delay_s) ELSE c.run_at END,
        finished_at = CASE WHEN t.outcome = 'retry' THEN NULL ELSE now() END,
        last_error = COALESCE(t.error, c.last_error)
    FROM t WHERE c.id = t.id AND c.attempts = t.attempts AND c.state = 'pending'
    RETURNING c.id, c.delivery_id, c.endpoint_id, c.type, c.event_id, t.outcome, t.attempts,
              t.error
), ev AS (
    INSERT INTO postlane_events (delivery_id, kind, state, data)
    SELECT delivery_id, 'callback_' || outcome, NULL, jsonb_strip_nulls(jsonb_build_object(
        'callback', id, 'endpoint', endpoint_id, 'type', type, 'event_id', 'evt_' || event_id,
        'attempts', attempts, 'error', error))
    FROM u WHERE outcome <> 'retry'
)
SELECT count(*) FROM u

-- name: list_callbacks
SELECT c.id, c.endpoint_id, c.event_id, c.delivery_id, c.type, c.payload, c.state,
       c.attempts, c.last_error, c.created_at, e.url, e.secret
FROM postlane_callbacks c JOIN postlane_callback_endpoints e ON e.id = c.endpoint_id
WHERE (%(state)s::text IS NULL OR c.state = %(state)s)
  AND (%(delivery)s::bigint IS NULL OR c.delivery_id = %(delivery)s)
ORDER BY c.id DESC LIMIT %(limit)s

-- name: replay_callbacks
UPDATE postlane_callbacks SET state = 'pending', run_at = now(), attempts = 0,
    finished_at = NULL, replay_count = replay_count + 1
WHERE state = 'dead' AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))

-- name: callback_counts
SELECT state, count(*) FROM postlane_callbacks GROUP BY state


-- ===========================================================================================
-- _http_api: API keys, and requests made idempotent by their body
-- ===========================================================================================

-- name: set_request_hash
UPDATE postlane_messages SET request_hash = %s WHERE id = %s

-- name: request_hash
SELECT request_hash FROM postlane_messages WHERE id = %s

-- name: create_api_key
INSERT INTO postlane_api_keys (name, prefix, token_hash, scopes)
VALUES (%s, %s, %s, %s)
RETURNING id, name, prefix, scopes, created_at, revoked_at, sessions_after

-- name: api_key_by_id
SELECT id, name, prefix, scopes, created_at, revoked_at, sessions_after
FROM postlane_api_keys WHERE id = %s

-- name: api_key_by_token_hash
SELECT id, name, prefix, scopes, created_at, revoked_at, sessions_after
FROM postlane_api_keys WHERE token_hash = %s

-- name: list_api_keys
SELECT id, name, prefix, scopes, created_at, revoked_at, sessions_after
FROM postlane_api_keys ORDER BY id

-- name: revoke_api_key
UPDATE postlane_api_keys SET revoked_at = now()
WHERE id = %s AND revoked_at IS NULL RETURNING id

-- name: end_api_key_sessions
UPDATE postlane_api_keys SET sessions_after = GREATEST(%s, COALESCE(sessions_after, 0))
WHERE id = %s RETURNING id


-- ===========================================================================================
-- _templates: templates and bulk imports
-- ===========================================================================================

-- name: add_template
WITH t AS (
    INSERT INTO postlane_templates AS tp (name, latest_version) VALUES (%(name)s, 1)
    ON CONFLICT (name) DO UPDATE SET latest_version = tp.latest_version + 1,
        deleted_at = NULL, updated_at = now()
    RETURNING name, latest_version, deprecated_at
), v AS (
    INSERT INTO postlane_template_versions (name, version, subject, text_body, html_body)
    SELECT name, latest_version, %(subject)s, %(text)s, %(html)s FROM t
    RETURNING name, version, subject, text_body, html_body, created_at
)
SELECT v.name, v.version, v.subject, v.text_body, v.html_body, v.created_at,
       t.latest_version, t.deprecated_at IS NOT NULL
FROM v, t

-- name: get_template
SELECT v.name, v.version, v.subject, v.text_body, v.html_body, v.created_at,
       t.latest_version, t.deprecated_at IS NOT NULL
FROM postlane_templates t
JOIN postlane_template_versions v ON v.name = t.name
WHERE t.name = %(name)s AND t.deleted_at IS NULL
  AND v.version = COALESCE(%(version)s::int, t.latest_version)

-- name: get_template_for_enqueue
-- get_template, share-locked until the enqueueing transaction ends: delete and deprecate
-- wait for it (FOR SHARE; SQLite's one writer needs no row lock).
SELECT v.name, v.version, v.subject, v.text_body, v.html_body, v.created_at,
       t.latest_version, t.deprecated_at IS NOT NULL
FROM postlane_templates t
JOIN postlane_template_versions v ON v.name = t.name
WHERE t.name = %(name)s AND t.deleted_at IS NULL
  AND v.version = COALESCE(%(version)s::int, t.latest_version)
FOR SHARE OF t

-- name: lock_template_for_enqueue
SELECT deprecated_at IS NOT NULL FROM postlane_templates
WHERE name = %s AND deleted_at IS NULL FOR SHARE

-- name: list_templates
SELECT v.name, v.version, v.subject, v.text_body, v.html_body, v.created_at,
       t.latest_version, t.deprecated_at IS NOT NULL
FROM postlane_templates t
JOIN postlane_template_versions v ON v.name = t.name AND v.version = t.latest_version
WHERE t.deleted_at IS NULL ORDER BY t.name

-- name: set_template_deprecated
UPDATE postlane_templates SET deprecated_at = CASE WHEN %(on)s
    THEN COALESCE(deprecated_at, now()) END, updated_at = now()
WHERE name = %(name)s AND deleted_at IS NULL RETURNING name

-- name: count_template_references
SELECT count(*) FROM postlane_messages m JOIN postlane_deliveries d ON d.id = m.id
WHERE m.template_id = %s AND {{template_reference}}

-- name: lock_template_for_delete
SELECT 1 FROM postlane_templates WHERE name = %s AND deleted_at IS NULL FOR UPDATE

-- name: delete_template_versions
DELETE FROM postlane_template_versions WHERE name = %s

-- name: mark_template_deleted
UPDATE postlane_templates SET deleted_at = now(), deprecated_at = NULL, updated_at = now()
WHERE name = %s

-- name: import_progress
UPDATE postlane_imports SET rows_read = %(read)s, rows_enqueued = %(enqueued)s,
    rows_skipped = %(skipped)s, rows_created = rows_created + %(created)s,
    finished_at = CASE WHEN %(finished)s THEN now() ELSE NULL END, updated_at = now()
WHERE import_id = %(id)s

-- name: start_import
INSERT INTO postlane_imports AS i (import_id, template, template_version, file_name, lane)
VALUES (%s, %s, %s, %s, %s) ON CONFLICT (import_id) DO UPDATE SET
    runs = i.runs + 1, last_started_at = now(), finished_at = NULL,
    template_version = excluded.template_version, file_name = excluded.file_name,
    lane = excluded.lane, rows_read = 0, rows_enqueued = 0, rows_created = 0,
    rows_skipped = 0, updated_at = now() WHERE i.template = excluded.template
RETURNING {{import_columns}}

-- name: get_import
SELECT {{import_columns}} FROM postlane_imports WHERE import_id = %s

-- name: list_imports
SELECT {{import_columns}} FROM postlane_imports
ORDER BY last_started_at DESC, import_id LIMIT %s

-- name: import_counts
SELECT state, attempts > 0, count(*), EXTRACT(EPOCH FROM now() - min(created_at))::float8
FROM postlane_deliveries WHERE import_id = %s GROUP BY 1, 2


-- ===========================================================================================
-- _second_channel: SMS fallbacks and import canaries
-- ===========================================================================================

-- name: fallback_candidates
-- The flag is in the message (metadata), the state in the narrow row: the partial index
-- over messages that carry a fallback (0010) finds the few, their narrow rows filter.
-- (jsonb: the ? operator is what that index answers.) The narrow row is looked up per
-- candidate (LATERAL), and OFFSET 0 keeps the planner from flattening that into a join:
-- joined, a table without statistics yet (a bulk load, before autovacuum's ANALYZE) was
-- planned from the deliveries' side, a scan of every row on every sweep (90 ms at 100,000
-- rows, once a second per worker, while the backlog drained).
SELECT {{delivery_message_columns}}
FROM postlane_messages m
CROSS JOIN LATERAL (SELECT * FROM postlane_deliveries d WHERE d.id = m.id OFFSET 0) d
WHERE m.metadata ? 'sms_fallback'  -- the partial index
  AND d.state IN ('pending', 'sending', 'ambiguous', 'dead', 'expired')
  AND NOT EXISTS (SELECT 1 FROM postlane_sms_fallbacks f WHERE f.email_id = d.id)
  AND (d.state IN ('dead', 'expired')
       OR d.created_at + make_interval(secs => COALESCE(
              (m.metadata -> 'sms_fallback' ->> 'after_s')::float8, %(after_s)s::float8))
          <= now())
ORDER BY m.id
LIMIT %(limit)s

-- name: lock_fallback_email
-- Locked: the email cannot be sent (or replayed) while its fallback is decided. (FOR
-- UPDATE OF d: SQLite's engine holds its one writer instead.)
SELECT d.state, m.idempotency_key FROM postlane_deliveries d
JOIN postlane_messages m ON m.id = d.id WHERE d.id = %s
FOR UPDATE OF d

-- name: fallback_exists
SELECT 1 FROM postlane_sms_fallbacks WHERE email_id = %s

-- name: add_fallback_pair
INSERT INTO postlane_sms_fallbacks (email_id, sms_id, reason)
VALUES (%s, %s, %s) RETURNING email_id, sms_id, reason, created_at

-- name: fallback_event
INSERT INTO postlane_events (delivery_id, kind, state, data) VALUES (%s, %s, %s, %s)

-- name: channel_stats
-- The same text as SQLite's.
SELECT state, channel, count(*) FROM postlane_deliveries
WHERE state IN ('pending', 'sending') GROUP BY state, channel
UNION ALL
SELECT 'fallback', CASE WHEN sms_id IS NULL THEN 'no_sms' ELSE reason END, count(*)
FROM postlane_sms_fallbacks GROUP BY 2

-- name: sms_fallback_pair
SELECT email_id, sms_id, reason, created_at FROM postlane_sms_fallbacks
WHERE email_id = %s OR sms_id = %s ORDER BY email_id LIMIT 1

-- name: start_import_canary
INSERT INTO postlane_import_canaries (import_id, size, keys)
VALUES (%s, %s, %s) ON CONFLICT (import_id) DO NOTHING

-- name: import_canary
SELECT import_id, size, keys, state, reason, created_at, settled_at
FROM postlane_import_canaries WHERE import_id = %s

-- name: import_canary_states
SELECT d.state, count(*), min(CASE WHEN d.state IN ('dead', 'expired') THEN
           m.idempotency_key || ' ' || d.state || ' (' || COALESCE(d.dead_reason, d.state)
           || '): ' || COALESCE(left(d.last_error, 300), '') END)
FROM postlane_messages m JOIN postlane_deliveries d ON d.id = m.id
WHERE d.import_id = %(import_id)s AND m.idempotency_key = ANY(%(keys)s::text[])
GROUP BY d.state

-- name: import_canary_held
SELECT count(*) FROM postlane_deliveries
WHERE import_id = %(import_id)s AND state = 'pending'
  AND run_at > now() + make_interval(secs => %(beyond_s)s::float8)

-- name: waiting_canaries
SELECT import_id FROM postlane_import_canaries WHERE state = 'waiting'
ORDER BY created_at LIMIT %s

-- name: settle_import_canary
UPDATE postlane_import_canaries SET state = %s, reason = %s, settled_at = now()
WHERE import_id = %s AND state = 'waiting' RETURNING 1

-- name: release_import_canary
UPDATE postlane_import_canaries SET state = 'released', settled_at = now(),
    reason = COALESCE(reason || '; ', '') || 'released by an operator'
WHERE import_id = %s AND state IN ('waiting', 'failed')

-- name: release_import_hold
WITH released AS (
    UPDATE postlane_deliveries SET run_at = now(), updated_at = now()
    WHERE import_id = %(import_id)s AND state = 'pending'
      AND run_at > now() + make_interval(secs => %(beyond_s)s::float8)
    RETURNING id
), ev AS (
    INSERT INTO postlane_events (delivery_id, kind, state, data)
    SELECT id, 'released', 'pending', jsonb_build_object('why', %(why)s::text) FROM released
)
SELECT count(*) FROM released
