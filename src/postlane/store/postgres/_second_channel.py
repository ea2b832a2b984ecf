"""The second channel and careful imports on PostgreSQL: SMS fallbacks (``core.fallback``)
and import canaries (``core.canary``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from postlane.core.canary import HELD_BEYOND
from postlane.core.fallback import CANDIDATE_STATES
from postlane.core.message import Delivery, Message
from postlane.core.producers import FALLBACK_PRODUCER
from postlane.core.records import ChannelStats, FallbackPair, ImportCanary
from postlane.store.base import channel_stats as _channel_stats
from postlane.store.postgres._base import PostgresBase, Q, _deliveries
from postlane.store.postgres._producing import enqueue_on_connection


class SecondChannelMixin(PostgresBase):
    # -- SMS fallbacks ---------------------------------------------------------------------
    async def list_fallback_candidates(
        self, unsent_after_s: float | None, limit: int = 100
    ) -> list[Delivery]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["fallback_candidates"],
                                     {"after_s": unsent_after_s, "limit": limit})
            return await _deliveries(cur)

    async def create_sms_fallback(
        self, email_id: int, states: Sequence[str], message: Message | None, reason: str
    ) -> FallbackPair | None:
        assert set(states) <= set(CANDIDATE_STATES)
        async with self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute(Q["lock_fallback_email"], (email_id,))
            row = await cur.fetchone()
            if row is None or row[0] not in states:
                return None
            state, email_key = row
            cur = await conn.execute(Q["fallback_exists"], (email_id,))
            if await cur.fetchone():
                return None
            sms_id: int | None = None
            if message is not None:
                result = await enqueue_on_connection(conn, message, FALLBACK_PRODUCER,
                                                     compare_content=False)
                sms_id = result.id
            cur = await conn.execute(
                Q["add_fallback_pair"],
                (email_id, sms_id if sms_id is not None else None, reason))
            pair_row = await cur.fetchone()
            assert pair_row is not None
            await _pair_events(conn, email_id, str(state), email_key, sms_id, message, reason)
        if sms_id is not None:
            self._wakeup.set()
        return FallbackPair(*pair_row)

    async def channel_stats(self) -> ChannelStats:
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["channel_stats"])
            rows = await cur.fetchall()
        return _channel_stats(rows)

    async def sms_fallback_pair(self, delivery_id: int) -> FallbackPair | None:
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["sms_fallback_pair"], (delivery_id, delivery_id))
            row = await cur.fetchone()
        return FallbackPair(*row) if row else None

    # -- import canaries -------------------------------------------------------------------
    async def start_import_canary(
        self, import_id: str, size: int, keys: Sequence[str]
    ) -> ImportCanary:
        async with self._pool.connection() as conn:
            await conn.execute(Q["start_import_canary"],
                               (import_id, size, Jsonb(list(keys))))
            canary = await _canary(conn, import_id)
        assert canary is not None
        return canary

    async def get_import_canary(self, import_id: str) -> ImportCanary | None:
        async with self._pool.connection() as conn:
            return await _canary(conn, import_id)

    async def list_waiting_canaries(self, limit: int = 100) -> list[ImportCanary]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["waiting_canaries"], (limit,))
            ids = [r[0] for r in await cur.fetchall()]
            found = [await _canary(conn, import_id) for import_id in ids]
        return [c for c in found if c is not None]

    async def settle_import_canary(self, import_id: str, passed: bool, reason: str) -> bool:
        async with self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                Q["settle_import_canary"],
                ("passed" if passed else "failed", reason, import_id))
            if await cur.fetchone() is None:
                return False
            if passed:
                await _release(conn, import_id, "the import's canary passed")
        if passed:
            self._wakeup.set()
        return True

    async def release_import_hold(self, import_id: str) -> int:
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute(Q["release_import_canary"], (import_id,))
            released = await _release(conn, import_id, "released by an operator")
        self._wakeup.set()
        return released


async def _pair_events(conn: psycopg.AsyncConnection[Any], email_id: int, state: str,
                       email_key: str, sms_id: int | None, message: Message | None,
                       reason: str) -> None:
    if message is None or sms_id is None:
        await conn.execute(Q["fallback_event"], (email_id, "sms_fallback_skipped", state, Jsonb(
            {"reason": reason, "why": f"the fallback policy does not fall back on {reason}"})))
        return
    sms = dict(message.metadata.get("sms", {}))
    await conn.execute(Q["fallback_event"], (email_id, "sms_fallback", state, Jsonb(
        {"sms_id": sms_id, "sms_key": message.key, "reason": reason, **sms})))
    await conn.execute(Q["fallback_event"], (sms_id, "fallback_of", "pending", Jsonb(
        {"email_id": email_id, "email_key": email_key, "reason": reason, **sms})))


async def _canary(conn: psycopg.AsyncConnection[Any], import_id: str) -> ImportCanary | None:
    cur = await conn.execute(Q["import_canary"], (import_id,))
    row = await cur.fetchone()
    if row is None:
        return None
    keys = tuple(row[2] if not isinstance(row[2], str) else json.loads(row[2]))
    cur = await conn.execute(Q["import_canary_states"],
                             {"import_id": import_id, "keys": list(keys)})
    states: dict[str, int] = {}
    failures = []
    for state, count, failure in await cur.fetchall():
        states[state] = count
        if failure:
            failures.append(failure)
    cur = await conn.execute(Q["import_canary_held"], {"import_id": import_id,
                                     "beyond_s": HELD_BEYOND.total_seconds()})
    held_row = await cur.fetchone()
    return ImportCanary(row[0], row[1], keys, row[3], row[4], row[5], row[6], states,
                        min(failures) if failures else None, held_row[0] if held_row else 0)


async def _release(conn: psycopg.AsyncConnection[Any], import_id: str, why: str) -> int:
    cur = await conn.execute(Q["release_import_hold"], {"import_id": import_id, "why": why,
                                        "beyond_s": HELD_BEYOND.total_seconds()})
    row = await cur.fetchone()
    return int(row[0]) if row else 0

