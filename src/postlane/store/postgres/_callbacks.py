"""Status callbacks on PostgreSQL: endpoints, and the outbox the timeline's trigger fills
(migration 0008)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg.types.json import Jsonb

from postlane.core.records import Callback, CallbackEndpoint, CallbackResult, bound_response
from postlane.store.postgres._base import PostgresBase, Q


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
            cur = await conn.execute(Q["add_callback_endpoint"],
                                     (url, secret, api_key_id, ",".join(events) or "*"))
            row = await cur.fetchone()
        assert row is not None
        return _endpoint(row)

    async def list_callback_endpoints(self, api_key_id: int | None = None,
                                      *, every_key: bool = True) -> list[CallbackEndpoint]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["list_callback_endpoints"], (every_key, api_key_id))
            return [_endpoint(r) for r in await cur.fetchall()]

    async def disable_callback_endpoint(self, endpoint_id: int,
                                        api_key_id: int | None = None) -> bool:
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["disable_callback_endpoint"],
                                     (endpoint_id, api_key_id, api_key_id))
            return await cur.fetchone() is not None

    async def claim_callbacks(self, limit: int, lease_s: float) -> list[Callback]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["claim_callbacks"], {"limit": limit, "lease_s": lease_s})
            return [_callback(r) for r in await cur.fetchall()]

    async def finish_callbacks(self, results: Sequence[CallbackResult]) -> int:
        if not results:
            return 0
        batch = [{"id": r.id, "attempts": r.attempts, "outcome": r.outcome,
                  "delay_s": r.delay_s, "error": bound_response(r.error)} for r in results]
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["finish_callbacks"], {"batch": Jsonb(batch)})
            row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def list_callbacks(self, state: str | None = None, delivery_id: int | None = None,
                             limit: int = 100) -> list[Callback]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                Q["list_callbacks"],
                {"state": state, "delivery": delivery_id, "limit": limit})
            return [_callback(r) for r in await cur.fetchall()]

    async def replay_callbacks(self, ids: Sequence[int] | None = None) -> int:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                Q["replay_callbacks"],
                {"ids": None if ids is None else list(ids)})
            return cur.rowcount

    async def callback_counts(self) -> dict[str, int]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["callback_counts"])
            return {r[0]: r[1] for r in await cur.fetchall()}
