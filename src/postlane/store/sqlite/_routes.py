"""Provider failover on SQLite: which provider each delivery's latest attempt went to."""

from __future__ import annotations

from collections.abc import Sequence

from postlane.core.records import Route
from postlane.store.sqlite._base import NOW, SQLiteEngine


class RoutesMixin(SQLiteEngine):
    def delivery_routes(self, ids: Sequence[int]) -> dict[int, Route]:
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        rows = self.conn.execute(
            "SELECT delivery_id, provider, attempt, pinned FROM postlane_delivery_routes "
            f"WHERE delivery_id IN ({marks})", list(ids)).fetchall()
        return {r[0]: Route(r[0], r[1], r[2], bool(r[3])) for r in rows}

    def record_routes(self, routes: Sequence[Route]) -> None:
        if not routes:
            return
        with self._write() as conn:
            conn.executemany(
                "INSERT INTO postlane_delivery_routes "
                f"(delivery_id, provider, attempt, pinned, updated_at) "
                f"VALUES (?, ?, ?, ?, {NOW}) ON CONFLICT (delivery_id) DO UPDATE SET "
                "provider = excluded.provider, attempt = excluded.attempt, "
                "pinned = excluded.pinned, updated_at = excluded.updated_at",
                [(r.delivery_id, r.provider, r.attempt, 1 if r.pinned else 0)
                 for r in routes])
