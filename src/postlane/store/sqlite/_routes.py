"""Provider failover on SQLite: which provider each delivery's latest attempt went to."""

from __future__ import annotations

import json
from collections.abc import Sequence

from postlane.core.records import Route
from postlane.store.sqlite._base import Q, SQLiteEngine


class RoutesMixin(SQLiteEngine):
    def delivery_routes(self, ids: Sequence[int]) -> dict[int, Route]:
        if not ids:
            return {}
        rows = self.conn.execute(Q["delivery_routes"], (json.dumps(list(ids)),)).fetchall()
        return {r[0]: Route(r[0], r[1], r[2], bool(r[3])) for r in rows}

    def record_routes(self, routes: Sequence[Route]) -> None:
        if not routes:
            return
        with self._write() as conn:
            conn.executemany(
                Q["record_route"],
                [(r.delivery_id, r.provider, r.attempt, 1 if r.pinned else 0)
                 for r in routes])
