"""The worker's path: claim deliveries under a lease, start and renew attempts, report their
outcomes, settle ambiguous ones, and rescue the leases of workers that went away."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from postlane.core.attachments import Attachment
from postlane.core.message import EMAIL, Delivery
from postlane.core.records import Claim, RescueResult, Transition, bound_response
from postlane.core.states import State
from postlane.store.attachments import SELECT_PG, parts_by_delivery
from postlane.store.postgres._base import (
    _CM_COLS,
    _COLS,
    _TERMINAL,
    ROWS,
    PostgresBase,
    _deliveries,
)

_CLAIM = f"""
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
        claims = d.claims + 1, attempt_started_at = NULL, updated_at = now()
    FROM picked WHERE d.id = picked.id
    RETURNING d.*
), ev AS (
    INSERT INTO postlane_events (delivery_id, kind, state, data)
    SELECT id, 'claimed', 'sending', jsonb_build_object('owner', %(owner)s::text, 'claim', claims)
    FROM claimed
)
-- The update rewrote only the narrow rows; the message is read, never written. Two hints
-- save the worker a round trip each per batch (core.message.Delivery): an address that is
-- ASCII and not on the suppression list under its lowered spelling (the list's one
-- spelling, core.addresses.suppression_address) needs no suppression check, and a
-- delivery without stored parts no read of them.
SELECT {_CM_COLS},
       m.recipient !~ '^[\x20-\x7e]*$' OR EXISTS (
           SELECT 1 FROM postlane_suppressions s WHERE s.address = lower(m.recipient)
       ) AS may_be_suppressed,
       EXISTS (SELECT 1 FROM postlane_attachments a WHERE a.delivery_id = c.id)
           AS has_attachments
FROM claimed c JOIN postlane_messages m ON m.id = c.id ORDER BY c.run_at, c.id
"""
_START = """
-- No updated_at here: it is indexed (ambiguous rows), and leaving indexed columns alone
-- lets PostgreSQL update the row in place (HOT) on the hot path.
UPDATE postlane_deliveries d SET attempt_started_at = now()
FROM unnest(%(ids)s::bigint[], %(claims)s::int[]) AS t(id, claims)
WHERE d.id = t.id AND d.claims = t.claims  -- leased to me (see _LEASED_TO_ME):
  AND d.lease_owner = %(owner)s AND d.lease_expires_at > now()
RETURNING d.id
"""
_RENEW = """
UPDATE postlane_deliveries d
SET lease_expires_at = now() + make_interval(secs => %(lease_s)s::float8)
FROM unnest(%(ids)s::bigint[], %(claims)s::int[]) AS t(id, claims)
WHERE d.id = t.id AND d.claims = t.claims  -- leased to me (see _LEASED_TO_ME):
  AND d.lease_owner = %(owner)s AND d.lease_expires_at > now()
RETURNING d.id
"""
_SET_STATE_TEMPLATE = f"""
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
        finished_at = CASE WHEN t.state IN {_TERMINAL} THEN now() ELSE NULL END,
        updated_at = now()
    FROM t
    WHERE d.id = t.id AND d.claims = t.claims AND __GUARD__
    RETURNING d.id, d.state, d.last_error, t.event, t.detail, t.reason, t.cause,
              -- the full row only where a dead letter needs it: building it is not free
              CASE WHEN t.state IN ('dead', 'expired') THEN to_jsonb(d.*) END AS snapshot
), ev AS (
    INSERT INTO postlane_events (delivery_id, kind, state, data)
    SELECT id, event, state, detail FROM u
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
"""
# The guard is "sending and leased to me": the table's CHECK constraint makes
# ``lease_owner IS NOT NULL`` equivalent to ``state = 'sending'``, and leaving the state
# out keeps the planner on primary-key lookups instead of the partial index of leased rows
# (which it prefers, badly, while a freshly loaded table has no statistics).
_LEASED_TO_ME = "d.lease_owner = %(owner)s"
_SET_STATE_IF_SENDING = _SET_STATE_TEMPLATE.replace("__GUARD__", _LEASED_TO_ME)
_SET_STATE_IF_AMBIGUOUS = _SET_STATE_TEMPLATE.replace("__GUARD__", "d.state = 'ambiguous'")

_RESCUE = """
WITH picked AS (
    SELECT id, lease_owner, attempt_started_at IS NOT NULL AS started
    FROM postlane_deliveries
    WHERE state = 'sending' AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), u AS (
    UPDATE postlane_deliveries d SET
        state = CASE WHEN p.started THEN 'ambiguous' ELSE 'pending' END,
        attempts = d.attempts + CASE WHEN p.started THEN 1 ELSE 0 END,
        last_error = CASE WHEN p.started
                          THEN 'lease expired after the attempt started; the provider may '
                               || 'have accepted it'
                          ELSE d.last_error END,
        lease_owner = NULL, lease_expires_at = NULL, attempt_started_at = NULL,
        updated_at = now()
    FROM picked p WHERE d.id = p.id
    RETURNING d.id, d.state, d.attempts, p.lease_owner, p.started
), ev AS (
    -- A started attempt that never reported is part of the attempt history (as ambiguous).
    INSERT INTO postlane_events (delivery_id, kind, state, data)
    SELECT id, 'lease_expired', state,
           jsonb_build_object('owner', lease_owner, 'attempt_started', started)
           || CASE WHEN started THEN jsonb_build_object(
                  'outcome', 'ambiguous', 'attempt', attempts,
                  'response', 'lease expired after the attempt started')
              ELSE '{}'::jsonb END
    FROM u
)
SELECT id, state FROM u
"""


class ClaimsMixin(PostgresBase):
    async def attachments_among(self, ids: Sequence[int]) -> dict[int, tuple[Attachment, ...]]:
        if not ids:
            return {}
        async with self._pool.connection() as conn:
            # Binary results: bytea as its bytes, not as hex text twice their size to send
            # and to parse.
            cur = await conn.execute(SELECT_PG, (list(ids),), binary=True)
            return parts_by_delivery(await cur.fetchall())

    # -- the worker's path -----------------------------------------------------------------
    async def claim_batch(
        self, lane: str, limit: int, owner: str, lease: timedelta,
        exclude_imports: Sequence[str] = (), channel: str = EMAIL,
    ) -> list[Delivery]:
        params = {"lane": lane, "channel": channel, "limit": limit, "owner": owner,
                  "lease_s": lease.total_seconds(), "exclude_imports": list(exclude_imports)}
        async with self._pool.connection() as conn:
            # Never prepared: a generic plan of this statement is ten times slower.
            cur = await conn.execute(_CLAIM, params, prepare=False)
            return await _deliveries(cur, hinted=True)

    async def start_attempts(self, owner: str, claims: Sequence[Claim]) -> set[int]:
        return await self._ids(_START, owner, claims, {})

    async def renew_leases(
        self, owner: str, claims: Sequence[Claim], lease: timedelta
    ) -> set[int]:
        return await self._ids(_RENEW, owner, claims, {"lease_s": lease.total_seconds()})

    async def _ids(
        self, sql: str, owner: str, claims: Sequence[Claim], extra: dict[str, Any]
    ) -> set[int]:
        if not claims:
            return set()
        params = {"owner": owner, "ids": [c.id for c in claims],
                  "claims": [c.claims for c in claims], **extra}
        async with self._pool.connection() as conn:
            cur = await conn.execute(sql, params)
            return {row[0] for row in await cur.fetchall()}

    async def set_state_if_sending_many(
        self, owner: str, transitions: Sequence[Transition]
    ) -> set[int]:
        return await self._set_state_many(_SET_STATE_IF_SENDING, owner, transitions)

    async def set_state_if_ambiguous_many(self, transitions: Sequence[Transition]) -> set[int]:
        return await self._set_state_many(_SET_STATE_IF_AMBIGUOUS, None, transitions)

    async def _set_state_many(
        self, sql: str, owner: str | None, transitions: Sequence[Transition]
    ) -> set[int]:
        if not transitions:
            return set()
        batch = [
            [t.id, t.claims, t.state.value, t.delay_s, 1 if t.spend_attempt else 0,
             bound_response(t.error), t.provider_message_id, t.dead_reason, t.dead_cause,
             t.event, t.detail]
            for t in transitions
        ]
        # default=dict: a detail that is a Mapping but not a dict.
        params = {"owner": owner, "batch": json.dumps(batch, default=dict)}
        async with self._pool.connection() as conn:
            cur = await conn.execute(sql, params)
            return {row[0] for row in await cur.fetchall()}

    async def list_ambiguous(
        self, limit: int = 100, lanes: Sequence[str] | None = None,
        channel: str | None = None,
    ) -> list[Delivery]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {_COLS} FROM {ROWS} WHERE state = 'ambiguous' "
                "AND (%s::text[] IS NULL OR lane = ANY(%s::text[])) "
                "AND (%s::text IS NULL OR channel = %s::text) "
                "ORDER BY updated_at, id LIMIT %s",
                (None if lanes is None else list(lanes), None if lanes is None else list(lanes),
                 channel, channel, limit),
            )
            return await _deliveries(cur)

    async def rescue_expired_leases(self, limit: int = 1000) -> RescueResult:
        async with self._pool.connection() as conn:
            cur = await conn.execute(_RESCUE, {"limit": limit})
            rows = await cur.fetchall()
        return RescueResult(
            requeued=sorted(r[0] for r in rows if r[1] == State.PENDING),
            ambiguous=sorted(r[0] for r in rows if r[1] == State.AMBIGUOUS),
        )
