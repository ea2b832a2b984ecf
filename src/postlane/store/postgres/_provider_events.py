"""Provider events (delivery receipts, bounces, complaints) and the suppression list."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from postlane.core.addresses import address_spellings, suppression_address
from postlane.core.deliverability import (
    DEFAULT_POLICY,
    SuppressionPolicy,
    counts_soft_bounces,
    source_of,
    suppression_for,
)
from postlane.core.message import Delivery
from postlane.core.records import (
    LaneDeliverability,
    ProviderEvent,
    ProviderEventResult,
    Suppression,
    deliverability_from_rows,
)
from postlane.store.postgres._base import PostgresBase, Q


class ProviderEventsMixin(PostgresBase):
    # -- provider events and the suppression list -------------------------------------------
    async def record_provider_event(
        self, event: ProviderEvent, policy: SuppressionPolicy = DEFAULT_POLICY,
    ) -> ProviderEventResult:
        async with self._pool.connection() as conn, conn.transaction():
            found = await _event_delivery(conn, event)
            delivery_id = found[0] if found else None
            lane = event.lane or (found[1] if found else None)
            recipient = event.recipient or (found[2] if found else None)
            address = suppression_address(recipient) if recipient else None
            cur = await conn.execute(
                Q["insert_provider_event"],
                (event.provider, event.event_id, event.kind, event.provider_message_id,
                 delivery_id, address, lane),
            )
            if await cur.fetchone() is None:
                return ProviderEventResult(True, delivery_id, False)
            changed = False
            if found is not None:
                await conn.execute(
                    Q["provider_event_timeline"],
                    (delivery_id, f"provider:{event.kind}",
                     Jsonb({"provider": event.provider, "event_id": event.event_id,
                            **dict(event.data)})),
                )
                cur = await conn.execute(Q["raise_provider_status"],
                                         {"kind": event.kind, "id": delivery_id})
                changed = await cur.fetchone() is not None
            if address is None or (found is None and event.lane is None):
                return ProviderEventResult(False, delivery_id, changed)
            soft = 0
            if counts_soft_bounces(event):
                cur = await conn.execute(
                    Q["soft_bounces"],
                    (address, policy.soft_bounce_window.total_seconds()),
                )
                soft = int((await cur.fetchone() or (0,))[0])
            rule = suppression_for(event, lane, soft_bounces=soft, policy=policy)
            if rule is None:
                return ProviderEventResult(False, delivery_id, changed)
            await _upsert_suppression(conn, address, rule.stream, rule.reason, delivery_id,
                                      source_of(event), rule.expires_in)
            return ProviderEventResult(False, delivery_id, changed, address)

    async def suppress(self, address: str, stream: str, reason: str,
                       delivery_id: int | None = None, *, source_event: str | None = None,
                       expires_in: timedelta | None = None) -> bool:
        async with self._pool.connection() as conn:
            return await _upsert_suppression(conn, suppression_address(address), stream, reason,
                                             delivery_id, source_event, expires_in)

    async def unsuppress(self, address: str, stream: str | None = None) -> int:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                Q["unsuppress"],
                (address_spellings(address), stream, stream),
            )
            return cur.rowcount

    async def list_suppressions(self, address: str | None = None,
                                limit: int = 100) -> list[Suppression]:
        spellings = address_spellings(address) if address else None
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                Q["list_suppressions"],
                (spellings, spellings, limit),
            )
            return [Suppression(*row) for row in await cur.fetchall()]

    async def suppressed_among(self, deliveries: Sequence[Delivery]) -> dict[int, str]:
        if not deliveries:
            return {}
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                Q["suppressed_among"],
                (json.dumps([{"id": d.id, "address": a, "lane": d.lane}
                             for d in deliveries for a in address_spellings(d.recipient)]),),
            )
            return {row[0]: row[1] for row in await cur.fetchall()}

    async def requeue_suppressed(self, address: str) -> list[int]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["requeue_suppressed"],
                                     {"address": address_spellings(address)})
            ids = [row[0] for row in await cur.fetchall()]
        self._wakeup.set()
        return ids


    async def deliverability(self, window: timedelta) -> dict[str, LaneDeliverability]:
        seconds = window.total_seconds()
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["deliverability_sent"], (seconds,))
            sent = {lane: int(n) for lane, n in await cur.fetchall()}
            cur = await conn.execute(Q["deliverability_events"], (seconds,))
            events = await cur.fetchall()
        return deliverability_from_rows(self.limits.lanes, sent, events)

    async def provider_event_totals(self) -> dict[tuple[str, str], int]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["provider_event_totals"])
            return {(kind, lane): int(n) for kind, lane, n in await cur.fetchall()}


async def _event_delivery(conn: AsyncConnection[Any],
                          event: ProviderEvent) -> tuple[int, str, str] | None:
    """(id, lane, recipient) of the delivery an event concerns: by id, provider message id,
    then idempotency key (see ``ProviderEvent``)."""
    lookups = (("d.id", event.delivery_id),
               ("d.provider_message_id", event.provider_message_id),
               ("m.idempotency_key", event.idempotency_key))
    for column, value in lookups:
        if value is None:
            continue
        cur = await conn.execute(Q["event_delivery"].replace("__COLUMN__", column), (value,))
        row = await cur.fetchone()
        if row is not None:
            return int(row[0]), str(row[1]), str(row[2])
    return None


async def _upsert_suppression(conn: AsyncConnection[Any], address: str, stream: str,
                              reason: str, delivery_id: int | None, source_event: str | None,
                              expires_in: timedelta | None) -> bool:
    """Add a suppression, or replace one that ends sooner (an expired one, or a soft-bounce
    entry that a hard bounce makes permanent); True when something was written."""
    cur = await conn.execute(
        Q["upsert_suppression"],
        {"address": address, "stream": stream, "reason": reason, "delivery": delivery_id,
         "source": source_event,
         "seconds": None if expires_in is None else expires_in.total_seconds()},
    )
    return await cur.fetchone() is not None
