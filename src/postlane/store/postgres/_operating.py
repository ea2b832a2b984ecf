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
from postlane.store import machine
from postlane.store.base import (
    dead_letter_conditions,
    dead_letter_counts,
    delivery_conditions,
    delivery_source,
)
from postlane.store.base import (
    find_conditions as _find_conditions,
)
from postlane.store.postgres._base import PostgresBase, Q, _deliveries


class OperatingMixin(PostgresBase):
    # -- controls shared by the fleet ------------------------------------------------------
    async def get_controls(self) -> dict[str, Control]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["get_controls"])
            return {row[0]: Control(*row) for row in await cur.fetchall()}

    async def set_control(self, name: str, value: Mapping[str, Any] | None) -> None:
        async with self._pool.connection() as conn:
            if value is None:
                await conn.execute(Q["delete_control"], (name,))
                return
            await conn.execute(Q["set_control"], (name, Jsonb(dict(value))))

    async def compare_and_set_control(
        self, name: str, expected_version: int | None, value: Mapping[str, Any]
    ) -> bool:
        async with self._pool.connection() as conn:
            if expected_version is None:
                cur = await conn.execute(Q["add_control"], (name, Jsonb(dict(value))))
            else:
                cur = await conn.execute(Q["replace_control"],
                                         (Jsonb(dict(value)), name, expected_version))
            return await cur.fetchone() is not None

    # -- reading and operating -------------------------------------------------------------
    async def get(self, id_or_key: int | str) -> Delivery | None:
        sql = Q["get_by_id"] if isinstance(id_or_key, int) else Q["get_by_key"]
        async with self._pool.connection() as conn:
            cur = await conn.execute(sql, (id_or_key,))
            found = await _deliveries(cur)
        return found[0] if found else None

    async def timeline(self, delivery_id: int) -> list[Event]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["timeline"], {"id": delivery_id})
            rows = await cur.fetchall()
        return machine.timeline(
            delivery_id, [(Event(*r[:6]), (r[6], r[7], r[8])) for r in rows if r[0] is not None],
            next((machine.DeliveryColumns(r[2], r[4], *r[6:]) for r in rows if r[0] is None),
                 None))

    async def dead_letter(self, delivery_id: int) -> DeadLetter | None:
        found = await self._dead_letters(Q["dead_letter_by_id"], {"id": delivery_id}, 1)
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
            cur = await conn.execute(Q["dead_letters"].replace("__WHERE__", where),
                                     {**params, "limit": limit})
            return [DeadLetter(*row) for row in await cur.fetchall()]

    async def replay_dead_letters(self, ids: Sequence[int], by: str) -> set[int]:
        if not ids:
            return set()
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["replay_dead_letters"], {"ids": list(ids), "by": by})
            return {row[0] for row in await cur.fetchall()}

    async def discard_dead_letter(self, delivery_id: int, reason: str, by: str) -> bool:
        return bool(await self.discard_dead_letters([delivery_id], reason, by))

    async def find_deliveries(
        self, *, key: str | None = None, recipient: str | None = None,
        import_id: str | None = None, limit: int = 100,
    ) -> list[Delivery]:
        conditions, params = _find_conditions(key, recipient, import_id, "%({})s")
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["deliveries_where"].replace("__WHERE__", conditions),
                                     {**params, "limit": limit})
            return await _deliveries(cur)

    async def list_deliveries(
        self, selection: DeliveryFilter = DeliveryFilter(), *, before: int | None = None,
        upto_id: int | None = None, limit: int = 100,
    ) -> list[Delivery]:
        where, params = delivery_conditions(selection, lambda name: f"%({name})s",
                                            before=before, upto_id=upto_id)
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["deliveries_where"].replace("__WHERE__", where),
                                     {**params, "limit": limit})
            return await _deliveries(cur)

    async def count_deliveries(
        self, selection: DeliveryFilter = DeliveryFilter(), *, upto_id: int | None = None,
        cap: int | None = None,
    ) -> tuple[int, int]:
        where, params = delivery_conditions(selection, lambda name: f"%({name})s",
                                            upto_id=upto_id)
        sql = (Q["count_deliveries"].replace("__SOURCE__", delivery_source(selection))
               .replace("__WHERE__", where)
               .replace("__CAP__", "" if cap is None else Q["count_deliveries_cap"]))
        if cap is not None:
            params["cap"] = cap + 1
        async with self._pool.connection() as conn:
            cur = await conn.execute(sql, params)
            row = await cur.fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    async def cancel_many(self, ids: Sequence[int], reason: str, by: str) -> set[int]:
        if not ids:
            return set()
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["cancel_many"], {"ids": list(ids), "reason": reason,
                                                    "by": by})
            return {row[0] for row in await cur.fetchall()}

    async def discard_dead_letters(self, ids: Sequence[int], reason: str,
                                   by: str) -> set[int]:
        if not ids:
            return set()
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["discard_dead_letters"],
                                     {"ids": list(ids), "reason": reason, "by": by})
            return {row[0] for row in await cur.fetchall()}

    async def stats(self) -> Stats:
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["stats_lanes"])
            lanes = {name: LaneStats(0, 0.0) for name in self.limits.lanes}
            for lane, depth, age in await cur.fetchall():
                lanes[lane] = LaneStats(int(depth), max(0.0, float(age)))
            cur = await conn.execute(Q["stats_states"])
            states = {str(s): 0 for s in State}
            arrivals = {name: 0 for name in self.limits.lanes}
            for lane, state, n in await cur.fetchall():
                states[state] = states.get(state, 0) + int(n)
                arrivals[lane] = arrivals.get(lane, 0) + int(n)
            cur = await conn.execute(Q["stats_pruned"])
            for lane, n in await cur.fetchall():
                arrivals[lane] = arrivals.get(lane, 0) + int(n)
            cur = await conn.execute(Q["stats_attempts"])
            attempts = {str(a): int(n) for a, n in await cur.fetchall()}
            cur = await conn.execute(Q["stats_dead_letters"])
            dead, causes = dead_letter_counts(await cur.fetchall())
        return Stats(lanes=lanes, states=states, attempts=attempts, dead_letters=dead,
                     dead_letter_causes=causes, arrivals=arrivals)

    async def cancel(self, delivery_id: int, reason: str = "") -> bool:
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["cancel"], {"id": delivery_id, "reason": reason})
            return await cur.fetchone() is not None

    async def prune(self, finished_before: timedelta, dead_before: timedelta) -> int:
        params = {"finished_s": finished_before.total_seconds(),
                  "dead_s": dead_before.total_seconds()}
        total = 0
        async with self._pool.connection() as conn:
            while True:
                cur = await conn.execute(Q["prune"], params)
                row = await cur.fetchone()
                deleted = int(row[0]) if row else 0
                total += deleted
                if deleted < 5000:
                    return total
