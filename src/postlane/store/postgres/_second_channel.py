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
from postlane.store.base import CHANNEL_STATS as _CHANNEL_STATS
from postlane.store.base import channel_stats as _channel_stats
from postlane.store.base import qualified_columns
from postlane.store.postgres._base import PostgresBase, _deliveries
from postlane.store.postgres._producing import enqueue_on_connection

# The flag is in the message (metadata), the state in the narrow row: the partial index
# over messages that carry a fallback (0010) finds the few, their narrow rows filter.
_CANDIDATES = f"""
SELECT {qualified_columns("d", "m")}
FROM postlane_messages m JOIN postlane_deliveries d ON d.id = m.id
WHERE m.metadata ? 'sms_fallback'  -- the partial index
  AND d.state IN ('pending', 'sending', 'ambiguous', 'dead', 'expired')
  AND NOT EXISTS (SELECT 1 FROM postlane_sms_fallbacks f WHERE f.email_id = d.id)
  AND (d.state IN ('dead', 'expired')
       OR d.created_at + make_interval(secs => COALESCE(
              (m.metadata -> 'sms_fallback' ->> 'after_s')::float8, %(after_s)s::float8))
          <= now())
ORDER BY m.id
LIMIT %(limit)s
"""
_PAIR_COLS = "email_id, sms_id, reason, created_at"
_EVENT = "INSERT INTO postlane_events (delivery_id, kind, state, data) VALUES (%s, %s, %s, %s)"

_CANARY_COLS = "import_id, size, keys, state, reason, created_at, settled_at"
_CANARY_STATES = """
SELECT d.state, count(*), min(CASE WHEN d.state IN ('dead', 'expired') THEN
           m.idempotency_key || ' ' || d.state || ' (' || COALESCE(d.dead_reason, d.state)
           || '): ' || COALESCE(left(d.last_error, 300), '') END)
FROM postlane_messages m JOIN postlane_deliveries d ON d.id = m.id
WHERE d.import_id = %(import_id)s AND m.idempotency_key = ANY(%(keys)s::text[])
GROUP BY d.state
"""
_HELD = """
SELECT count(*) FROM postlane_deliveries
WHERE import_id = %(import_id)s AND state = 'pending'
  AND run_at > now() + make_interval(secs => %(beyond_s)s::float8)
"""
_RELEASE = """
WITH released AS (
    UPDATE postlane_deliveries SET run_at = now(), updated_at = now()
    WHERE import_id = %(import_id)s AND state = 'pending'
      AND run_at > now() + make_interval(secs => %(beyond_s)s::float8)
    RETURNING id
), ev AS (
    INSERT INTO postlane_events (delivery_id, kind, state, data)
    SELECT id, 'released', 'pending', jsonb_build_object('why', %(why)s::text) FROM released
)
SELECT count(*) FROM released
"""


class SecondChannelMixin(PostgresBase):
    # -- SMS fallbacks ---------------------------------------------------------------------
    async def list_fallback_candidates(
        self, unsent_after_s: float | None, limit: int = 100
    ) -> list[Delivery]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(_CANDIDATES, {"after_s": unsent_after_s, "limit": limit})
            return await _deliveries(cur)

    async def create_sms_fallback(
        self, email_id: int, states: Sequence[str], message: Message | None, reason: str
    ) -> FallbackPair | None:
        assert set(states) <= set(CANDIDATE_STATES)
        async with self._pool.connection() as conn, conn.transaction():
            # Locked: the email cannot be sent (or replayed) while its fallback is decided.
            cur = await conn.execute(
                "SELECT d.state, m.idempotency_key FROM postlane_deliveries d "
                "JOIN postlane_messages m ON m.id = d.id WHERE d.id = %s "
                "FOR UPDATE OF d", (email_id,))
            row = await cur.fetchone()
            if row is None or row[0] not in states:
                return None
            state, email_key = row
            cur = await conn.execute(
                "SELECT 1 FROM postlane_sms_fallbacks WHERE email_id = %s", (email_id,))
            if await cur.fetchone():
                return None
            sms_id: int | None = None
            if message is not None:
                result = await enqueue_on_connection(conn, message, FALLBACK_PRODUCER,
                                                     compare_content=False)
                sms_id = result.id
            cur = await conn.execute(
                f"INSERT INTO postlane_sms_fallbacks (email_id, sms_id, reason) "
                f"VALUES (%s, %s, %s) RETURNING {_PAIR_COLS}",
                (email_id, sms_id if sms_id is not None else None, reason))
            pair_row = await cur.fetchone()
            assert pair_row is not None
            await _pair_events(conn, email_id, str(state), email_key, sms_id, message, reason)
        if sms_id is not None:
            self._wakeup.set()
        return FallbackPair(*pair_row)

    async def channel_stats(self) -> ChannelStats:
        async with self._pool.connection() as conn:
            cur = await conn.execute(_CHANNEL_STATS)
            rows = await cur.fetchall()
        return _channel_stats(rows)

    async def sms_fallback_pair(self, delivery_id: int) -> FallbackPair | None:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {_PAIR_COLS} FROM postlane_sms_fallbacks "
                "WHERE email_id = %s OR sms_id = %s ORDER BY email_id LIMIT 1",
                (delivery_id, delivery_id))
            row = await cur.fetchone()
        return FallbackPair(*row) if row else None

    # -- import canaries -------------------------------------------------------------------
    async def start_import_canary(
        self, import_id: str, size: int, keys: Sequence[str]
    ) -> ImportCanary:
        async with self._pool.connection() as conn:
            await conn.execute(
                "INSERT INTO postlane_import_canaries (import_id, size, keys) "
                "VALUES (%s, %s, %s) ON CONFLICT (import_id) DO NOTHING",
                (import_id, size, Jsonb(list(keys))))
            canary = await _canary(conn, import_id)
        assert canary is not None
        return canary

    async def get_import_canary(self, import_id: str) -> ImportCanary | None:
        async with self._pool.connection() as conn:
            return await _canary(conn, import_id)

    async def list_waiting_canaries(self, limit: int = 100) -> list[ImportCanary]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT import_id FROM postlane_import_canaries WHERE state = 'waiting' "
                "ORDER BY created_at LIMIT %s", (limit,))
            ids = [r[0] for r in await cur.fetchall()]
            found = [await _canary(conn, import_id) for import_id in ids]
        return [c for c in found if c is not None]

    async def settle_import_canary(self, import_id: str, passed: bool, reason: str) -> bool:
        async with self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "UPDATE postlane_import_canaries SET state = %s, reason = %s, "
                "settled_at = now() WHERE import_id = %s AND state = 'waiting' RETURNING 1",
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
            await conn.execute(
                "UPDATE postlane_import_canaries SET state = 'released', settled_at = now(), "
                "reason = COALESCE(reason || '; ', '') || 'released by an operator' "
                "WHERE import_id = %s AND state IN ('waiting', 'failed')", (import_id,))
            released = await _release(conn, import_id, "released by an operator")
        self._wakeup.set()
        return released


async def _pair_events(conn: psycopg.AsyncConnection[Any], email_id: int, state: str,
                       email_key: str, sms_id: int | None, message: Message | None,
                       reason: str) -> None:
    if message is None or sms_id is None:
        await conn.execute(_EVENT, (email_id, "sms_fallback_skipped", state, Jsonb(
            {"reason": reason, "why": f"the fallback policy does not fall back on {reason}"})))
        return
    sms = dict(message.metadata.get("sms", {}))
    await conn.execute(_EVENT, (email_id, "sms_fallback", state, Jsonb(
        {"sms_id": sms_id, "sms_key": message.key, "reason": reason, **sms})))
    await conn.execute(_EVENT, (sms_id, "fallback_of", "pending", Jsonb(
        {"email_id": email_id, "email_key": email_key, "reason": reason, **sms})))


async def _canary(conn: psycopg.AsyncConnection[Any], import_id: str) -> ImportCanary | None:
    cur = await conn.execute(
        f"SELECT {_CANARY_COLS} FROM postlane_import_canaries WHERE import_id = %s",
        (import_id,))
    row = await cur.fetchone()
    if row is None:
        return None
    keys = tuple(row[2] if not isinstance(row[2], str) else json.loads(row[2]))
    cur = await conn.execute(_CANARY_STATES, {"import_id": import_id, "keys": list(keys)})
    states: dict[str, int] = {}
    failures = []
    for state, count, failure in await cur.fetchall():
        states[state] = count
        if failure:
            failures.append(failure)
    cur = await conn.execute(_HELD, {"import_id": import_id,
                                     "beyond_s": HELD_BEYOND.total_seconds()})
    held_row = await cur.fetchone()
    return ImportCanary(row[0], row[1], keys, row[3], row[4], row[5], row[6], states,
                        min(failures) if failures else None, held_row[0] if held_row else 0)


async def _release(conn: psycopg.AsyncConnection[Any], import_id: str, why: str) -> int:
    cur = await conn.execute(_RELEASE, {"import_id": import_id, "why": why,
                                        "beyond_s": HELD_BEYOND.total_seconds()})
    row = await cur.fetchone()
    return int(row[0]) if row else 0

