"""Operating SQLite: the fleet's controls, reading deliveries and dead letters, replay,
discard, stats, cancel and prune.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

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
    find_conditions,
)
from postlane.store.sqlite._base import (
    Q,
    SQLiteEngine,
    _dt,
    _opt_dt,
    _read,
    tolerating_bad_text,
)


class OperatingMixin(SQLiteEngine):
    # -- controls shared by the fleet ------------------------------------------------------
    def get_controls(self) -> dict[str, Control]:
        rows = self.conn.execute(Q["get_controls"]).fetchall()
        return {r[0]: Control(r[0], json.loads(r[1]), r[2], _dt(r[3])) for r in rows}

    def set_control(self, name: str, value: Mapping[str, Any] | None) -> None:
        with self._write() as conn:
            if value is None:
                conn.execute(Q["delete_control"], (name,))
                return
            conn.execute(Q["set_control"], (name, json.dumps(dict(value))))

    def compare_and_set_control(
        self, name: str, expected_version: int | None, value: Mapping[str, Any]
    ) -> bool:
        with self._write() as conn:
            if expected_version is None:
                row = conn.execute(Q["create_control"],
                                   (name, json.dumps(dict(value)))).fetchone()
            else:
                row = conn.execute(Q["update_control_at_version"],
                                   (json.dumps(dict(value)), name, expected_version)).fetchone()
            return row is not None

    # -- reading and operating -------------------------------------------------------------
    @tolerating_bad_text
    def get(self, id_or_key: int | str) -> Delivery | None:
        name = "delivery_by_id" if isinstance(id_or_key, int) else "delivery_by_key"
        row = self.conn.execute(Q[name], (id_or_key,)).fetchone()
        return _read(self.conn, row) if row else None

    def timeline(self, delivery_id: int) -> list[Event]:
        rows = self.conn.execute(Q["timeline"], {"id": delivery_id}).fetchall()
        return machine.timeline(
            delivery_id, [(Event(r[0], r[1], _dt(r[2]), r[3], r[4], json.loads(r[5])),
                           (_opt_dt(r[6]), r[7], r[8])) for r in rows if r[0] is not None],
            next((machine.DeliveryColumns(_dt(r[2]), r[4], _opt_dt(r[6]), r[7], r[8])
                  for r in rows if r[0] is None), None))

    def dead_letter(self, delivery_id: int) -> DeadLetter | None:
        found = self._dead_letters("dl.delivery_id = :id", {"id": delivery_id}, 1)
        return found[0] if found else None

    def list_dead_letters(
        self, selection: DeadLetterFilter = DeadLetterFilter(), limit: int = 100
    ) -> list[DeadLetter]:
        where, params = dead_letter_conditions(selection, lambda name: f":{name}",
                                               lambda when: when.timestamp())
        return self._dead_letters(where, params, limit)

    def _dead_letters(self, where: str, params: dict[str, Any],
                      limit: int) -> list[DeadLetter]:
        rows = self.conn.execute(_where("dead_letters", where),
                                 {**params, "limit": limit}).fetchall()
        return [
            DeadLetter(r[0], r[1], json.loads(r[2]), r[3], json.loads(r[4]), _dt(r[5]),
                       _opt_dt(r[6]), r[7], _opt_dt(r[8]), r[9], r[10], r[11], r[12])
            for r in rows
        ]

    def replay_dead_letters(self, ids: Sequence[int], by: str) -> set[int]:
        if not ids:
            return set()
        replayed = set()
        with self._write() as conn:
            for delivery_id in ids:
                row = conn.execute(Q["mark_dead_letter_replayed"], (by, delivery_id)).fetchone()
                if row is None:
                    continue
                conn.execute(Q["replay_delivery"], (delivery_id,))
                conn.execute(Q["insert_event"], (delivery_id, "replayed", "pending",
                                                 json.dumps({"by": by, "replay": row[0]})))
                replayed.add(delivery_id)
        self.wake()
        return replayed

    def discard_dead_letter(self, delivery_id: int, reason: str, by: str) -> bool:
        with self._write() as conn:
            row = conn.execute(Q["discard_dead_letter"], (reason, delivery_id)).fetchone()
            if row is not None:
                conn.execute(Q["insert_event"], (delivery_id, "discarded", None,
                                                 json.dumps({"by": by, "reason": reason})))
            return row is not None

    @tolerating_bad_text
    def find_deliveries(
        self, *, key: str | None = None, recipient: str | None = None,
        import_id: str | None = None, limit: int = 100,
    ) -> list[Delivery]:
        conditions, params = find_conditions(key, recipient, import_id, ":{}")
        rows = self.conn.execute(_where("deliveries_where", conditions),
                                 {**params, "limit": limit}).fetchall()
        return [_read(self.conn, r) for r in rows]

    @tolerating_bad_text
    def list_deliveries(
        self, selection: DeliveryFilter = DeliveryFilter(), *, before: int | None = None,
        upto_id: int | None = None, limit: int = 100,
    ) -> list[Delivery]:
        where, params = delivery_conditions(selection, lambda name: f":{name}",
                                            before=before, upto_id=upto_id)
        rows = self.conn.execute(_where("deliveries_where", where),
                                 {**params, "limit": limit}).fetchall()
        return [_read(self.conn, r) for r in rows]

    def count_deliveries(
        self, selection: DeliveryFilter = DeliveryFilter(), *, upto_id: int | None = None,
        cap: int | None = None,
    ) -> tuple[int, int]:
        where, params = delivery_conditions(selection, lambda name: f":{name}",
                                            upto_id=upto_id)
        rows = f"SELECT id FROM {delivery_source(selection)} WHERE {where}"
        if cap is not None:  # no order: any cap + 1 rows tell "more than cap"
            rows += " LIMIT :cap"
            params["cap"] = cap + 1
        count, top = self.conn.execute(
            f"SELECT count(*), COALESCE(max(id), 0) FROM ({rows})", params).fetchone()
        return int(count), int(top)

    def cancel_many(self, ids: Sequence[int], reason: str, by: str) -> set[int]:
        if not ids:
            return set()
        with self._write() as conn:
            done = [row[0] for row in conn.execute(Q["cancel_many"], (json.dumps(list(ids)),))]
            data = json.dumps({"reason": reason, "by": by})
            conn.executemany(Q["insert_event"], [(i, "cancelled", "cancelled", data)
                                                 for i in done])
        return set(done)

    def discard_dead_letters(self, ids: Sequence[int], reason: str, by: str) -> set[int]:
        if not ids:
            return set()
        discarded = set()
        data = json.dumps({"by": by, "reason": reason})
        with self._write() as conn:
            for delivery_id in sorted(set(ids)):
                row = conn.execute(Q["discard_dead_letter"], (reason, delivery_id)).fetchone()
                if row is not None:
                    conn.execute(Q["insert_event"], (delivery_id, "discarded", None, data))
                    discarded.add(delivery_id)
        return discarded

    def stats(self) -> Stats:
        conn = self.conn
        lanes = {name: LaneStats(0, 0.0) for name in self.limits.lanes}
        for lane, depth, age in conn.execute(Q["lane_depths"]):
            lanes[lane] = LaneStats(int(depth), max(0.0, float(age or 0)))
        states = {str(s): 0 for s in State}
        arrivals = {name: 0 for name in self.limits.lanes}
        for lane, state, n in conn.execute(Q["lane_states"]):
            states[state] = states.get(state, 0) + int(n)
            arrivals[lane] = arrivals.get(lane, 0) + int(n)
        for lane, n in conn.execute(Q["pruned_by_lane"]):
            arrivals[lane] = arrivals.get(lane, 0) + int(n)
        attempts = {str(a): int(n) for a, n in conn.execute(Q["attempts_in_flight"])}
        dead, causes = dead_letter_counts(conn.execute(Q["dead_letter_counts"]).fetchall())
        return Stats(lanes=lanes, states=states, attempts=attempts, dead_letters=dead,
                     dead_letter_causes=causes, arrivals=arrivals)

    def cancel(self, delivery_id: int, reason: str = "") -> bool:
        with self._write() as conn:
            row = conn.execute(Q["cancel"], (delivery_id,)).fetchone()
            if row:
                conn.execute(Q["insert_event"], (delivery_id, "cancelled", "cancelled",
                                                 json.dumps({"reason": reason})))
            return row is not None

    def prune(self, finished_before: timedelta, dead_before: timedelta) -> int:
        total = 0
        while True:
            with self._write() as conn:
                rows = conn.execute(Q["prunable"], (finished_before.total_seconds(),
                                                    dead_before.total_seconds())).fetchall()
                ids = [r[0] for r in rows]
                batch = json.dumps(ids)
                conn.executemany(Q["count_pruned"], list(Counter(r[1] for r in rows).items()))
                for name in ("prune_events", "prune_messages", "prune_deliveries"):
                    conn.execute(Q[name], (batch,))
            total += len(ids)
            if len(ids) < 5000:
                return total


def _where(name: str, where: str) -> str:
    """Entry ``name`` with its ``__WHERE__`` filled by a filter assembled from its parts."""
    return Q[name].replace("__WHERE__", where)
