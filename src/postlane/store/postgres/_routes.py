"""Provider failover on PostgreSQL: which provider each delivery's latest attempt went to."""

from __future__ import annotations

from collections.abc import Sequence

from postlane.core.records import Route
from postlane.store.postgres._base import PostgresBase, Q


class RoutesMixin(PostgresBase):
    async def delivery_routes(self, ids: Sequence[int]) -> dict[int, Route]:
        if not ids:
            return {}
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["delivery_routes"], (list(ids),))
            return {r[0]: Route(r[0], r[1], r[2], r[3]) for r in await cur.fetchall()}

    async def record_routes(self, routes: Sequence[Route]) -> None:
        if not routes:
            return
        async with self._pool.connection() as conn:
            await conn.execute(Q["record_routes"], {
                "ids": [r.delivery_id for r in routes], "providers": [r.provider for r in routes],
                "attempts": [r.attempt for r in routes], "pinned": [r.pinned for r in routes]})
