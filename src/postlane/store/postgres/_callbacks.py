"""Status callbacks on PostgreSQL: endpoints, and the outbox the timeline's trigger fills
(migration 0008)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg.types.json import Jsonb

from postlane.core.records import Callback, CallbackEndpoint, CallbackResult, bound_response
from postlane.store.postgres._base import PostgresBase

_ENDPOINT_COLS = "id, url, api_key_id, events, created_at, disabled_at, secret"
_CALLBACK_COLS = ("c.id, c.endpoint_id, c.event_id, c.delivery_id, c.type, c.payload, c.state, "
                  "c.attempts, c.last_error, c.created_at, e.url, e.secret")

_CLAIM = f"""
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
SELECT {_CALLBACK_COLS} FROM c JOIN postlane_callback_endpoints e ON e.id = c.endpoint_id
ORDER BY c.id
"""

_FINISH = """
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
"""


def _endpoint(row: Sequence[Any]) -> CallbackEndpoint:
    events = () if row[3] == "*" else tuple(row[3].split(","))
    return CallbackEndpoint(row[0], row[1], row[2], events, row[4], row[5], secret=row[6])


def _callback(row: Sequence[Any]) -> Callback:
    return Callback(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8],
                    row[9], url=row[10], secret=row[11])


class CallbacksMixin(PostgresBase):
    async def add_callback_endpoint(self, url: str, secret: str, api_key_id: int | None,
                                    events: Sequence[str]) -> CallbackEndpoint:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "INSERT INTO postlane_callback_endpoints (url, secret, api_key_id, events) "
                f"VALUES (%s, %s, %s, %s) RETURNING {_ENDPOINT_COLS}",
                (url, secret, api_key_id, ",".join(events) or "*"))
            row = await cur.fetchone()
        assert row is not None
        return _endpoint(row)

    async def list_callback_endpoints(self, api_key_id: int | None = None,
                                      *, every_key: bool = True) -> list[CallbackEndpoint]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {_ENDPOINT_COLS} FROM postlane_callback_endpoints "
                "WHERE %s OR api_key_id IS NOT DISTINCT FROM %s::bigint ORDER BY id",
                (every_key, api_key_id))
            return [_endpoint(r) for r in await cur.fetchall()]

    async def disable_callback_endpoint(self, endpoint_id: int,
                                        api_key_id: int | None = None) -> bool:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "UPDATE postlane_callback_endpoints SET disabled_at = now() "
                "WHERE id = %s AND disabled_at IS NULL "
                "AND (%s::bigint IS NULL OR api_key_id = %s::bigint) RETURNING id",
                (endpoint_id, api_key_id, api_key_id))
            return await cur.fetchone() is not None

    async def claim_callbacks(self, limit: int, lease_s: float) -> list[Callback]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(_CLAIM, {"limit": limit, "lease_s": lease_s})
            return [_callback(r) for r in await cur.fetchall()]

    async def finish_callbacks(self, results: Sequence[CallbackResult]) -> int:
        if not results:
            return 0
        batch = [{"id": r.id, "attempts": r.attempts, "outcome": r.outcome,
                  "delay_s": r.delay_s, "error": bound_response(r.error)} for r in results]
        async with self._pool.connection() as conn:
            cur = await conn.execute(_FINISH, {"batch": Jsonb(batch)})
            row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def list_callbacks(self, state: str | None = None, delivery_id: int | None = None,
                             limit: int = 100) -> list[Callback]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {_CALLBACK_COLS} FROM postlane_callbacks c JOIN "
                "postlane_callback_endpoints e ON e.id = c.endpoint_id "
                "WHERE (%(state)s::text IS NULL OR c.state = %(state)s) "
                "AND (%(delivery)s::bigint IS NULL OR c.delivery_id = %(delivery)s) "
                "ORDER BY c.id DESC LIMIT %(limit)s",
                {"state": state, "delivery": delivery_id, "limit": limit})
            return [_callback(r) for r in await cur.fetchall()]

    async def replay_callbacks(self, ids: Sequence[int] | None = None) -> int:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "UPDATE postlane_callbacks SET state = 'pending', run_at = now(), attempts = 0, "
                "finished_at = NULL, replay_count = replay_count + 1 WHERE state = 'dead' "
                "AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))",
                {"ids": None if ids is None else list(ids)})
            return cur.rowcount

    async def callback_counts(self) -> dict[str, int]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT state, count(*) FROM postlane_callbacks GROUP BY state")
            return {r[0]: r[1] for r in await cur.fetchall()}
