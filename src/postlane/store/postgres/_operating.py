"""Reading and operating: deliveries, their timelines, dead letters (replay, discard),
search, stats, cancel and prune; and the controls shared by the fleet."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from psycopg.types.json import Jsonb

from postlane.core.message import Delivery
from postlane.core.records import (
    Control,
    DeadLetter,
    DeadLetterFilter,
    DeliveryFilter,
    Event,
    LaneStats,
    Stats,
)
from postlane.core.states import State
from postlane.store.base import (
    DEAD_LETTER_COLUMNS,
    dead_letter_conditions,
    dead_letter_counts,
    delivery_conditions,
    delivery_source,
)
from postlane.store.base import (
    find_conditions as _find_conditions,
)
from postlane.store.postgres._base import _COLS, ROWS, PostgresBase, _deliveries

_REPLAY = """
WITH dl AS (
    UPDATE postlane_dead_letters dl
    SET replayed_at = now(), replayed_by = %(by)s, replay_count = dl.replay_count + 1
    FROM postlane_deliveries d
    WHERE dl.delivery_id = ANY(%(ids)s::bigint[]) AND d.id = dl.delivery_id
      AND d.state IN ('dead', 'expired') AND dl.discarded_at IS NULL
    RETURNING dl.delivery_id, dl.replay_count
), u AS (
    UPDATE postlane_deliveries d
    SET state = 'pending', attempts = 0, run_at = now(), dead_reason = NULL,
        finished_at = NULL, updated_at = now()
    FROM dl WHERE d.id = dl.delivery_id
    RETURNING d.id, dl.replay_count
), ev AS (
    INSERT INTO postlane_events (delivery_id, kind, state, data)
    SELECT id, 'replayed', 'pending',
           jsonb_build_object('by', %(by)s::text, 'replay', replay_count) FROM u
)
SELECT id FROM u
"""
_DISCARD = """
WITH dl AS (
    UPDATE postlane_dead_letters dl SET discarded_at = now(), discard_reason = %(reason)s
    FROM postlane_deliveries d
    WHERE dl.delivery_id = %(id)s AND d.id = dl.delivery_id
      AND d.state IN ('dead', 'expired') AND dl.discarded_at IS NULL
    RETURNING dl.delivery_id
), ev AS (
    INSERT INTO postlane_events (delivery_id, kind, state, data)
    SELECT delivery_id, 'discarded', NULL,
           jsonb_build_object('by', %(by)s::text, 'reason', %(reason)s::text) FROM dl
)
SELECT delivery_id FROM dl
"""

_CANCEL = """
WITH u AS (
    UPDATE postlane_deliveries SET state = 'cancelled', finished_at = now(), updated_at = now()
    WHERE id = %(id)s AND state IN ('pending', 'ambiguous')
    RETURNING id
), ev AS (
    INSERT INTO postlane_events (delivery_id, kind, state, data)
    SELECT id, 'cancelled', 'cancelled', jsonb_build_object('reason', %(reason)s::text) FROM u
)
SELECT id FROM u
"""
# Rows locked in id order and skipped when another transaction holds them (a claim): a bulk
# action never waits behind, nor deadlocks with, the send path.
_CANCEL_MANY = """
WITH u AS (
    UPDATE postlane_deliveries SET state = 'cancelled', finished_at = now(), updated_at = now()
    WHERE id IN (SELECT id FROM postlane_deliveries
                 WHERE id = ANY(%(ids)s::bigint[]) AND state = 'pending'
                 ORDER BY id FOR UPDATE SKIP LOCKED)
      AND state = 'pending'
    RETURNING id
), ev AS (
    INSERT INTO postlane_events (delivery_id, kind, state, data)
    SELECT id, 'cancelled', 'cancelled',
           jsonb_build_object('reason', %(reason)s::text, 'by', %(by)s::text) FROM u
)
SELECT id FROM u
"""
_DISCARD_MANY = """
WITH dl AS (
    UPDATE postlane_dead_letters dl SET discarded_at = now(), discard_reason = %(reason)s
    FROM postlane_deliveries d
    WHERE dl.delivery_id = ANY(%(ids)s::bigint[]) AND d.id = dl.delivery_id
      AND d.state IN ('dead', 'expired') AND dl.discarded_at IS NULL
    RETURNING dl.delivery_id
), ev AS (
    INSERT INTO postlane_events (delivery_id, kind, state, data)
    SELECT delivery_id, 'discarded', NULL,
           jsonb_build_object('by', %(by)s::text, 'reason', %(reason)s::text) FROM dl
)
SELECT delivery_id FROM dl
"""
_PRUNE = """
WITH gone AS (
    DELETE FROM postlane_deliveries WHERE id IN (
        SELECT id FROM postlane_deliveries
        WHERE finished_at IS NOT NULL AND (
            (state IN ('sent', 'expired', 'cancelled', 'suppressed')
                AND finished_at < now() - make_interval(secs => %(finished_s)s::float8))
            OR (state = 'dead'
                AND finished_at < now() - make_interval(secs => %(dead_s)s::float8)))
        LIMIT 5000
    ) RETURNING id, lane
), counted AS (
    -- Arrivals per lane are kept + pruned: retention must not turn that counter back.
    INSERT INTO postlane_pruned AS p (lane, deliveries)
    SELECT lane, count(*) FROM gone GROUP BY lane
    ON CONFLICT (lane) DO UPDATE SET deliveries = p.deliveries + excluded.deliveries
), messages AS (
    -- No foreign key either (it would be checked on every enqueue): a delivery's message
    -- goes with it here.
    DELETE FROM postlane_messages WHERE id IN (SELECT id FROM gone)
), timeline AS (
    -- The timeline has no foreign key (it would be checked on every event insert, the hot
    -- path); deliveries and their events go together here instead.
    DELETE FROM postlane_events WHERE delivery_id IN (SELECT id FROM gone)
)
SELECT count(*) FROM gone
"""


class OperatingMixin(PostgresBase):
    # -- controls shared by the fleet ------------------------------------------------------
    async def get_controls(self) -> dict[str, Control]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT name, value, version, updated_at FROM postlane_controls"
            )
            return {row[0]: Control(*row) for row in await cur.fetchall()}

    async def set_control(self, name: str, value: Mapping[str, Any] | None) -> None:
        async with self._pool.connection() as conn:
            if value is None:
                await conn.execute("DELETE FROM postlane_controls WHERE name = %s", (name,))
                return
            await conn.execute(
                "INSERT INTO postlane_controls (name, value) VALUES (%s, %s) "
                "ON CONFLICT (name) DO UPDATE SET value = excluded.value, "
                "version = postlane_controls.version + 1, updated_at = now()",
                (name, Jsonb(dict(value))),
            )

    async def compare_and_set_control(
        self, name: str, expected_version: int | None, value: Mapping[str, Any]
    ) -> bool:
        async with self._pool.connection() as conn:
            if expected_version is None:
                cur = await conn.execute(
                    "INSERT INTO postlane_controls (name, value) VALUES (%s, %s) "
                    "ON CONFLICT (name) DO NOTHING RETURNING name", (name, Jsonb(dict(value)))
                )
            else:
                cur = await conn.execute(
                    "UPDATE postlane_controls SET value = %s, version = version + 1, "
                    "updated_at = now() WHERE name = %s AND version = %s RETURNING name",
                    (Jsonb(dict(value)), name, expected_version),
                )
            return await cur.fetchone() is not None

    # -- reading and operating -------------------------------------------------------------
    async def get(self, id_or_key: int | str) -> Delivery | None:
        column = "id" if isinstance(id_or_key, int) else "idempotency_key"
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {_COLS} FROM {ROWS} WHERE {column} = %s", (id_or_key,)
            )
            found = await _deliveries(cur)
        return found[0] if found else None

    async def timeline(self, delivery_id: int) -> list[Event]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT id, delivery_id, at, kind, state, data FROM postlane_events "
                "WHERE delivery_id = %s ORDER BY id", (delivery_id,)
            )
            return [Event(*row) for row in await cur.fetchall()]

    async def dead_letter(self, delivery_id: int) -> DeadLetter | None:
        found = await self._dead_letters("dl.delivery_id = %(id)s", {"id": delivery_id}, 1)
        return found[0] if found else None

    async def list_dead_letters(
        self, selection: DeadLetterFilter = DeadLetterFilter(), limit: int = 100
    ) -> list[DeadLetter]:
        where, params = dead_letter_conditions(selection, lambda name: f"%({name})s",
                                               lambda when: when)
        return await self._dead_letters(where, params, limit)

    async def _dead_letters(self, where: str, params: dict[str, Any],
                            limit: int) -> list[DeadLetter]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {DEAD_LETTER_COLUMNS} FROM postlane_dead_letters dl "
                f"JOIN {ROWS} d ON d.id = dl.delivery_id WHERE {where} "
                f"ORDER BY dl.dead_at, dl.delivery_id LIMIT %(limit)s",
                {**params, "limit": limit},
            )
            return [DeadLetter(*row) for row in await cur.fetchall()]

    async def replay_dead_letters(self, ids: Sequence[int], by: str) -> set[int]:
        if not ids:
            return set()
        async with self._pool.connection() as conn:
            cur = await conn.execute(_REPLAY, {"ids": list(ids), "by": by})
            return {row[0] for row in await cur.fetchall()}

    async def discard_dead_letter(self, delivery_id: int, reason: str, by: str) -> bool:
        async with self._pool.connection() as conn:
            cur = await conn.execute(_DISCARD, {"id": delivery_id, "reason": reason, "by": by})
            return await cur.fetchone() is not None

    async def find_deliveries(
        self, *, key: str | None = None, recipient: str | None = None,
        import_id: str | None = None, limit: int = 100,
    ) -> list[Delivery]:
        conditions, params = _find_conditions(key, recipient, import_id, "%({})s")
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {_COLS} FROM {ROWS} WHERE {conditions} "
                f"ORDER BY id DESC LIMIT %(limit)s", {**params, "limit": limit},
            )
            return await _deliveries(cur)

    async def list_deliveries(
        self, selection: DeliveryFilter = DeliveryFilter(), *, before: int | None = None,
        upto_id: int | None = None, limit: int = 100,
    ) -> list[Delivery]:
        where, params = delivery_conditions(selection, lambda name: f"%({name})s",
                                            before=before, upto_id=upto_id)
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {_COLS} FROM {ROWS} WHERE {where} "
                f"ORDER BY id DESC LIMIT %(limit)s", {**params, "limit": limit},
            )
            return await _deliveries(cur)

    async def count_deliveries(
        self, selection: DeliveryFilter = DeliveryFilter(), *, upto_id: int | None = None,
        cap: int | None = None,
    ) -> tuple[int, int]:
        where, params = delivery_conditions(selection, lambda name: f"%({name})s",
                                            upto_id=upto_id)
        rows = f"SELECT id FROM {delivery_source(selection)} WHERE {where}"
        if cap is not None:  # no order: any cap + 1 rows tell "more than cap"
            rows += " LIMIT %(cap)s"
            params["cap"] = cap + 1
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT count(*), COALESCE(max(id), 0) FROM ({rows}) s", params)
            row = await cur.fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    async def cancel_many(self, ids: Sequence[int], reason: str, by: str) -> set[int]:
        if not ids:
            return set()
        async with self._pool.connection() as conn:
            cur = await conn.execute(_CANCEL_MANY, {"ids": list(ids), "reason": reason,
                                                    "by": by})
            return {row[0] for row in await cur.fetchall()}

    async def discard_dead_letters(self, ids: Sequence[int], reason: str,
                                   by: str) -> set[int]:
        if not ids:
            return set()
        async with self._pool.connection() as conn:
            cur = await conn.execute(_DISCARD_MANY, {"ids": list(ids), "reason": reason,
                                                     "by": by})
            return {row[0] for row in await cur.fetchall()}

    async def stats(self) -> Stats:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT lane, count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(created_at)), 0) "
                "FROM postlane_deliveries WHERE state IN ('pending', 'sending') GROUP BY lane"
            )
            lanes = {name: LaneStats(0, 0.0) for name in self.limits.lanes}
            for lane, depth, age in await cur.fetchall():
                lanes[lane] = LaneStats(int(depth), max(0.0, float(age)))
            # One pass over every row kept gives both the states and the arrivals per lane.
            cur = await conn.execute(
                "SELECT lane, state, count(*) FROM postlane_deliveries GROUP BY lane, state"
            )
            states = {str(s): 0 for s in State}
            arrivals = {name: 0 for name in self.limits.lanes}
            for lane, state, n in await cur.fetchall():
                states[state] = states.get(state, 0) + int(n)
                arrivals[lane] = arrivals.get(lane, 0) + int(n)
            cur = await conn.execute("SELECT lane, deliveries FROM postlane_pruned")
            for lane, n in await cur.fetchall():
                arrivals[lane] = arrivals.get(lane, 0) + int(n)
            cur = await conn.execute(
                "SELECT attempts + 1, count(*) FROM postlane_deliveries "
                "WHERE state IN ('pending', 'sending') GROUP BY 1 ORDER BY 1"
            )
            attempts = {str(a): int(n) for a, n in await cur.fetchall()}
            cur = await conn.execute(
                "SELECT dl.reason, dl.cause, count(*) FROM postlane_dead_letters dl "
                "JOIN postlane_deliveries d ON d.id = dl.delivery_id "
                "WHERE dl.discarded_at IS NULL AND d.state IN ('dead', 'expired') "
                "GROUP BY dl.reason, dl.cause"
            )
            dead, causes = dead_letter_counts(await cur.fetchall())
        return Stats(lanes=lanes, states=states, attempts=attempts, dead_letters=dead,
                     dead_letter_causes=causes, arrivals=arrivals)

    async def cancel(self, delivery_id: int, reason: str = "") -> bool:
        async with self._pool.connection() as conn:
            cur = await conn.execute(_CANCEL, {"id": delivery_id, "reason": reason})
            return await cur.fetchone() is not None

    async def prune(self, finished_before: timedelta, dead_before: timedelta) -> int:
        params = {"finished_s": finished_before.total_seconds(),
                  "dead_s": dead_before.total_seconds()}
        total = 0
        async with self._pool.connection() as conn:
            while True:
                cur = await conn.execute(_PRUNE, params)
                row = await cur.fetchone()
                deleted = int(row[0]) if row else 0
                total += deleted
                if deleted < 5000:
                    return total
