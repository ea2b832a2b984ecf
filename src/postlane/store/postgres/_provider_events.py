"""Provider events (delivery receipts, bounces, complaints) and the suppression list."""

from __future__ import annotations

import json
from collections.abc import Sequence

from psycopg.types.json import Jsonb

from postlane.core.message import Delivery
from postlane.core.records import (
    STATUS_RANK,
    ProviderEvent,
    ProviderEventResult,
    Suppression,
    suppression_for,
)
from postlane.store.postgres._base import PostgresBase


class ProviderEventsMixin(PostgresBase):
    # -- provider events and the suppression list -------------------------------------------
    async def record_provider_event(self, event: ProviderEvent) -> ProviderEventResult:
        async with self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "SELECT d.id, d.lane, m.recipient FROM postlane_deliveries d "
                "JOIN postlane_messages m ON m.id = d.id "
                "WHERE d.provider_message_id = %s ORDER BY d.id DESC LIMIT 1",
                (event.provider_message_id,),
            )
            found = await cur.fetchone()
            delivery_id = found[0] if found else None
            cur = await conn.execute(
                "INSERT INTO postlane_provider_events "
                "(provider, event_id, kind, provider_message_id, delivery_id) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING event_id",
                (event.provider, event.event_id, event.kind, event.provider_message_id,
                 delivery_id),
            )
            if await cur.fetchone() is None:
                return ProviderEventResult(True, delivery_id, False)
            if found is None:
                return ProviderEventResult(False, None, False)
            _, lane, recipient = found
            await conn.execute(
                "INSERT INTO postlane_events (delivery_id, kind, state, data) "
                "VALUES (%s, %s, NULL, %s)",
                (delivery_id, f"provider:{event.kind}",
                 Jsonb({"provider": event.provider, "event_id": event.event_id,
                        **dict(event.data)})),
            )
            cur = await conn.execute(
                f"UPDATE postlane_deliveries SET provider_status = %(kind)s "
                f"WHERE id = %(id)s AND {_rank('provider_status')} < {_rank('%(kind)s')} "
                f"RETURNING id", {"kind": event.kind, "id": delivery_id},
            )
            changed = await cur.fetchone() is not None
            suppressed = None
            rule = suppression_for(event, lane)
            if rule is not None:
                address = (event.recipient or recipient).lower()
                await conn.execute(
                    "INSERT INTO postlane_suppressions (address, stream, reason, delivery_id) "
                    "VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    (address, rule[0], rule[1], delivery_id),
                )
                suppressed = address
            return ProviderEventResult(False, delivery_id, changed, suppressed)

    async def suppress(self, address: str, stream: str, reason: str,
                       delivery_id: int | None = None) -> bool:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "INSERT INTO postlane_suppressions (address, stream, reason, delivery_id) "
                "VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING address",
                (address.lower(), stream, reason, delivery_id),
            )
            return await cur.fetchone() is not None

    async def unsuppress(self, address: str, stream: str | None = None) -> int:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "DELETE FROM postlane_suppressions WHERE address = %s "
                "AND (%s::text IS NULL OR stream = %s)", (address.lower(), stream, stream),
            )
            return cur.rowcount

    async def list_suppressions(self, address: str | None = None,
                                limit: int = 100) -> list[Suppression]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT address, stream, reason, delivery_id, created_at "
                "FROM postlane_suppressions WHERE (%s::text IS NULL OR address = %s) "
                "ORDER BY created_at DESC LIMIT %s",
                (address and address.lower(), address and address.lower(), limit),
            )
            return [Suppression(*row) for row in await cur.fetchall()]

    async def suppressed_among(self, deliveries: Sequence[Delivery]) -> dict[int, str]:
        if not deliveries:
            return {}
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT t.id, s.reason FROM jsonb_to_recordset(%s::jsonb) "
                "AS t(id bigint, address text, lane text) "
                "JOIN postlane_suppressions s ON s.address = t.address "
                "AND s.stream IN (t.lane, '*')",
                (json.dumps([{"id": d.id, "address": d.recipient.lower(), "lane": d.lane}
                             for d in deliveries]),),
            )
            return {row[0]: row[1] for row in await cur.fetchall()}

    async def requeue_suppressed(self, address: str) -> list[int]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                """WITH u AS (
                    UPDATE postlane_deliveries SET state = 'pending', run_at = now(),
                        finished_at = NULL, updated_at = now()
                    WHERE state = 'suppressed' AND id IN (
                        SELECT id FROM postlane_messages WHERE lower(recipient) = %(address)s)
                    RETURNING id
                ), ev AS (
                    INSERT INTO postlane_events (delivery_id, kind, state, data)
                    SELECT id, 'unsuppressed', 'pending', '{}'::jsonb FROM u
                ) SELECT id FROM u ORDER BY id""", {"address": address.lower()},
            )
            ids = [row[0] for row in await cur.fetchall()]
        self._wakeup.set()
        return ids


def _rank(expression: str) -> str:
    """SQL for STATUS_RANK of an expression (-1 when NULL or unknown)."""
    cases = " ".join(f"WHEN '{k}' THEN {v}" for k, v in STATUS_RANK.items())
    return f"(CASE {expression} {cases} ELSE -1 END)"
