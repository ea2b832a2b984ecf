"""Provider events and the suppression list on SQLite."""

from __future__ import annotations

import json
from collections.abc import Sequence

from postlane.core.message import Delivery
from postlane.core.records import (
    STATUS_RANK,
    ProviderEvent,
    ProviderEventResult,
    Suppression,
    suppression_for,
)
from postlane.store.sqlite._base import _INSERT_EVENT, NOW, SQLiteBase, _dt


class ProviderEventsMixin(SQLiteBase):
    # -- provider events and the suppression list -------------------------------------------
    async def record_provider_event(self, event: ProviderEvent) -> ProviderEventResult:
        def _record() -> ProviderEventResult:
            with self._write() as conn:
                found = conn.execute(
                    "SELECT d.id, d.lane, m.recipient FROM postlane_deliveries d "
                    "JOIN postlane_messages m ON m.id = d.id "
                    "WHERE d.provider_message_id = ? ORDER BY d.id DESC LIMIT 1",
                    (event.provider_message_id,),
                ).fetchone()
                delivery_id = found[0] if found else None
                inserted = conn.execute(
                    f"INSERT INTO postlane_provider_events (provider, event_id, kind, "
                    f"provider_message_id, delivery_id, received_at) "
                    f"VALUES (?, ?, ?, ?, ?, {NOW}) ON CONFLICT DO NOTHING RETURNING event_id",
                    (event.provider, event.event_id, event.kind, event.provider_message_id,
                     delivery_id),
                ).fetchone()
                if inserted is None:
                    return ProviderEventResult(True, delivery_id, False)
                if found is None:
                    return ProviderEventResult(False, None, False)
                _, lane, recipient = found
                conn.execute(_INSERT_EVENT, (
                    delivery_id, f"provider:{event.kind}", None,
                    json.dumps({"provider": event.provider, "event_id": event.event_id,
                                **dict(event.data)}),
                ))
                current = conn.execute(
                    "SELECT provider_status FROM postlane_deliveries WHERE id = ?",
                    (delivery_id,),
                ).fetchone()[0]
                changed = STATUS_RANK.get(event.kind, -1) > STATUS_RANK.get(current or "", -1)
                if changed:
                    conn.execute("UPDATE postlane_deliveries SET provider_status = ? "
                                 "WHERE id = ?", (event.kind, delivery_id))
                suppressed = None
                rule = suppression_for(event, lane)
                if rule is not None:
                    suppressed = (event.recipient or recipient).lower()
                    conn.execute(
                        f"INSERT INTO postlane_suppressions (address, stream, reason, "
                        f"delivery_id, created_at) VALUES (?, ?, ?, ?, {NOW}) "
                        f"ON CONFLICT DO NOTHING",
                        (suppressed, rule[0], rule[1], delivery_id),
                    )
                return ProviderEventResult(False, delivery_id, changed, suppressed)
        return await self._run(_record)

    async def suppress(self, address: str, stream: str, reason: str,
                       delivery_id: int | None = None) -> bool:
        def _suppress() -> bool:
            with self._write() as conn:
                row = conn.execute(
                    f"INSERT INTO postlane_suppressions (address, stream, reason, delivery_id, "
                    f"created_at) VALUES (?, ?, ?, ?, {NOW}) ON CONFLICT DO NOTHING "
                    f"RETURNING address", (address.lower(), stream, reason, delivery_id),
                ).fetchone()
                return row is not None
        return await self._run(_suppress)

    async def unsuppress(self, address: str, stream: str | None = None) -> int:
        def _unsuppress() -> int:
            with self._write() as conn:
                cur = conn.execute(
                    "DELETE FROM postlane_suppressions WHERE address = ? "
                    "AND (? IS NULL OR stream = ?)", (address.lower(), stream, stream),
                )
                return cur.rowcount
        return await self._run(_unsuppress)

    async def list_suppressions(self, address: str | None = None,
                                limit: int = 100) -> list[Suppression]:
        def _list() -> list[Suppression]:
            key = address.lower() if address else None
            rows = self.conn.execute(
                "SELECT address, stream, reason, delivery_id, created_at "
                "FROM postlane_suppressions WHERE (? IS NULL OR address = ?) "
                "ORDER BY created_at DESC LIMIT ?", (key, key, limit),
            ).fetchall()
            return [Suppression(r[0], r[1], r[2], r[3], _dt(r[4])) for r in rows]
        return await self._run(_list)

    async def suppressed_among(self, deliveries: Sequence[Delivery]) -> dict[int, str]:
        if not deliveries:
            return {}
        batch = json.dumps([{"id": d.id, "address": d.recipient.lower(), "lane": d.lane}
                            for d in deliveries])

        def _among() -> dict[int, str]:
            rows = self.conn.execute(
                "SELECT json_extract(t.value, '$.id'), s.reason FROM json_each(?) t "
                "JOIN postlane_suppressions s "
                "ON s.address = json_extract(t.value, '$.address') "
                "AND s.stream IN (json_extract(t.value, '$.lane'), '*')", (batch,),
            ).fetchall()
            return {int(r[0]): r[1] for r in rows}
        return await self._run(_among)

    async def requeue_suppressed(self, address: str) -> list[int]:
        def _requeue() -> list[int]:
            with self._write() as conn:
                ids = [r[0] for r in conn.execute(
                    f"UPDATE postlane_deliveries SET state = 'pending', run_at = {NOW}, "
                    f"finished_at = NULL, updated_at = {NOW} "
                    f"WHERE state = 'suppressed' AND id IN (SELECT id FROM postlane_messages "
                    f"WHERE lower(recipient) = ?) RETURNING id",
                    (address.lower(),),
                ).fetchall()]
                conn.executemany(_INSERT_EVENT, [(i, "unsuppressed", "pending", "{}")
                                                 for i in ids])
                return sorted(ids)
        ids = await self._run(_requeue)
        self._wakeup.set()
        return ids
