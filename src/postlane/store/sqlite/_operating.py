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
from postlane.store.base import (
    DEAD_LETTER_COLUMNS,
    dead_letter_conditions,
    dead_letter_counts,
    delivery_conditions,
    delivery_source,
    find_conditions,
)
from postlane.store.sqlite._base import (
    _COLS,
    _INSERT_EVENT,
    NOW,
    ROWS,
    SQLiteEngine,
    _dt,
    _opt_dt,
    _read,
    tolerating_bad_text,
)


class OperatingMixin(SQLiteEngine):
    # -- controls shared by the fleet ------------------------------------------------------
    def get_controls(self) -> dict[str, Control]:
        rows = self.conn.execute(
            "SELECT name, value, version, updated_at FROM postlane_controls"
        ).fetchall()
        return {r[0]: Control(r[0], json.loads(r[1]), r[2], _dt(r[3])) for r in rows}

    def set_control(self, name: str, value: Mapping[str, Any] | None) -> None:
        with self._write() as conn:
            if value is None:
                conn.execute("DELETE FROM postlane_controls WHERE name = ?", (name,))
                return
            conn.execute(
                f"INSERT INTO postlane_controls (name, value, updated_at) "
                f"VALUES (?, ?, {NOW}) ON CONFLICT (name) DO UPDATE SET "
                f"value = excluded.value, version = version + 1, updated_at = {NOW}",
                (name, json.dumps(dict(value))),
            )

    def compare_and_set_control(
        self, name: str, expected_version: int | None, value: Mapping[str, Any]
    ) -> bool:
        with self._write() as conn:
            if expected_version is None:
                row = conn.execute(
                    f"INSERT INTO postlane_controls (name, value, updated_at) "
                    f"VALUES (?, ?, {NOW}) ON CONFLICT (name) DO NOTHING RETURNING name",
                    (name, json.dumps(dict(value))),
                ).fetchone()
            else:
                row = conn.execute(
                    f"UPDATE postlane_controls SET value = ?, version = version + 1, "
                    f"updated_at = {NOW} WHERE name = ? AND version = ? RETURNING name",
                    (json.dumps(dict(value)), name, expected_version),
                ).fetchone()
            return row is not None

    # -- reading and operating -------------------------------------------------------------
    @tolerating_bad_text
    def get(self, id_or_key: int | str) -> Delivery | None:
        column = "id" if isinstance(id_or_key, int) else "idempotency_key"
        row = self.conn.execute(
            f"SELECT {_COLS} FROM {ROWS} WHERE {column} = ?", (id_or_key,)
        ).fetchone()
        return _read(self.conn, row) if row else None

    def timeline(self, delivery_id: int) -> list[Event]:
        rows = self.conn.execute(
            "SELECT id, delivery_id, at, kind, state, data FROM postlane_events "
            "WHERE delivery_id = ? ORDER BY id", (delivery_id,)
        ).fetchall()
        return [Event(r[0], r[1], _dt(r[2]), r[3], r[4], json.loads(r[5])) for r in rows]

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
        rows = self.conn.execute(
            f"SELECT {DEAD_LETTER_COLUMNS} FROM postlane_dead_letters dl "
            f"JOIN {ROWS} d ON d.id = dl.delivery_id WHERE {where} "
            f"ORDER BY dl.dead_at, dl.delivery_id LIMIT :limit", {**params, "limit": limit},
        ).fetchall()
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
                row = conn.execute(
                    f"""UPDATE postlane_dead_letters
                    SET replayed_at = {NOW}, replayed_by = ?, replay_count = replay_count + 1
                    WHERE delivery_id = ? AND discarded_at IS NULL AND EXISTS (
                        SELECT 1 FROM postlane_deliveries d WHERE d.id = delivery_id
                          AND d.state IN ('dead', 'expired'))
                    RETURNING replay_count""", (by, delivery_id),
                ).fetchone()
                if row is None:
                    continue
                conn.execute(
                    f"UPDATE postlane_deliveries SET state = 'pending', attempts = 0, "
                    f"run_at = {NOW}, dead_reason = NULL, finished_at = NULL, "
                    f"updated_at = {NOW} WHERE id = ?", (delivery_id,),
                )
                conn.execute(_INSERT_EVENT, (delivery_id, "replayed", "pending",
                                             json.dumps({"by": by, "replay": row[0]})))
                replayed.add(delivery_id)
        self.wake()
        return replayed

    def discard_dead_letter(self, delivery_id: int, reason: str, by: str) -> bool:
        with self._write() as conn:
            row = conn.execute(
                f"""UPDATE postlane_dead_letters SET discarded_at = {NOW}, discard_reason = ?
                WHERE delivery_id = ? AND discarded_at IS NULL AND EXISTS (
                    SELECT 1 FROM postlane_deliveries d WHERE d.id = delivery_id
                      AND d.state IN ('dead', 'expired'))
                RETURNING delivery_id""", (reason, delivery_id),
            ).fetchone()
            if row is not None:
                conn.execute(_INSERT_EVENT, (delivery_id, "discarded", None,
                                             json.dumps({"by": by, "reason": reason})))
            return row is not None

    @tolerating_bad_text
    def find_deliveries(
        self, *, key: str | None = None, recipient: str | None = None,
        import_id: str | None = None, limit: int = 100,
    ) -> list[Delivery]:
        conditions, params = find_conditions(key, recipient, import_id, ":{}")
        rows = self.conn.execute(
            f"SELECT {_COLS} FROM {ROWS} WHERE {conditions} "
            f"ORDER BY id DESC LIMIT :limit", {**params, "limit": limit},
        ).fetchall()
        return [_read(self.conn, r) for r in rows]

    @tolerating_bad_text
    def list_deliveries(
        self, selection: DeliveryFilter = DeliveryFilter(), *, before: int | None = None,
        upto_id: int | None = None, limit: int = 100,
    ) -> list[Delivery]:
        where, params = delivery_conditions(selection, lambda name: f":{name}",
                                            before=before, upto_id=upto_id)
        rows = self.conn.execute(
            f"SELECT {_COLS} FROM {ROWS} WHERE {where} "
            f"ORDER BY id DESC LIMIT :limit", {**params, "limit": limit},
        ).fetchall()
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
            done = [row[0] for row in conn.execute(
                f"UPDATE postlane_deliveries SET state = 'cancelled', "
                f"finished_at = {NOW}, updated_at = {NOW} "
                f"WHERE id IN (SELECT value FROM json_each(?)) AND state = 'pending' "
                f"RETURNING id", (json.dumps(list(ids)),))]
            data = json.dumps({"reason": reason, "by": by})
            conn.executemany(_INSERT_EVENT, [(i, "cancelled", "cancelled", data)
                                             for i in done])
        return set(done)

    def discard_dead_letters(self, ids: Sequence[int], reason: str, by: str) -> set[int]:
        if not ids:
            return set()
        discarded = set()
        data = json.dumps({"by": by, "reason": reason})
        with self._write() as conn:
            for delivery_id in sorted(set(ids)):
                row = conn.execute(
                    f"""UPDATE postlane_dead_letters SET discarded_at = {NOW},
                    discard_reason = ? WHERE delivery_id = ? AND discarded_at IS NULL
                    AND EXISTS (SELECT 1 FROM postlane_deliveries d
                                WHERE d.id = delivery_id AND d.state IN ('dead', 'expired'))
                    RETURNING delivery_id""", (reason, delivery_id),
                ).fetchone()
                if row is not None:
                    conn.execute(_INSERT_EVENT, (delivery_id, "discarded", None, data))
                    discarded.add(delivery_id)
        return discarded

    def stats(self) -> Stats:
        conn = self.conn
        lanes = {name: LaneStats(0, 0.0) for name in self.limits.lanes}
        for lane, depth, age in conn.execute(
            f"SELECT lane, count(*), {NOW} - min(created_at) FROM postlane_deliveries "
            f"WHERE state IN ('pending', 'sending') GROUP BY lane"
        ):
            lanes[lane] = LaneStats(int(depth), max(0.0, float(age or 0)))
        # One pass over every row kept gives both the states and the arrivals per lane.
        states = {str(s): 0 for s in State}
        arrivals = {name: 0 for name in self.limits.lanes}
        for lane, state, n in conn.execute(
            "SELECT lane, state, count(*) FROM postlane_deliveries GROUP BY lane, state"
        ):
            states[state] = states.get(state, 0) + int(n)
            arrivals[lane] = arrivals.get(lane, 0) + int(n)
        for lane, n in conn.execute("SELECT lane, deliveries FROM postlane_pruned"):
            arrivals[lane] = arrivals.get(lane, 0) + int(n)
        attempts = {str(a): int(n) for a, n in conn.execute(
            "SELECT attempts + 1, count(*) FROM postlane_deliveries "
            "WHERE state IN ('pending', 'sending') GROUP BY 1 ORDER BY 1"
        )}
        dead, causes = dead_letter_counts(conn.execute(
            "SELECT dl.reason, dl.cause, count(*) FROM postlane_dead_letters dl "
            "JOIN postlane_deliveries d ON d.id = dl.delivery_id "
            "WHERE dl.discarded_at IS NULL AND d.state IN ('dead', 'expired') "
            "GROUP BY dl.reason, dl.cause"
        ).fetchall())
        return Stats(lanes=lanes, states=states, attempts=attempts, dead_letters=dead,
                     dead_letter_causes=causes, arrivals=arrivals)

    def cancel(self, delivery_id: int, reason: str = "") -> bool:
        with self._write() as conn:
            row = conn.execute(
                f"UPDATE postlane_deliveries SET state = 'cancelled', finished_at = {NOW}, "
                f"updated_at = {NOW} WHERE id = ? AND state IN ('pending', 'ambiguous') "
                f"RETURNING id", (delivery_id,)
            ).fetchone()
            if row:
                conn.execute(_INSERT_EVENT, (delivery_id, "cancelled", "cancelled",
                                             json.dumps({"reason": reason})))
            return row is not None

    def prune(self, finished_before: timedelta, dead_before: timedelta) -> int:
        total = 0
        while True:
            with self._write() as conn:
                rows = conn.execute(
                    f"""SELECT id, lane FROM postlane_deliveries
                        WHERE finished_at IS NOT NULL AND (
                            (state IN ('sent', 'expired', 'cancelled', 'suppressed')
                                AND finished_at < {NOW} - ?)
                            OR (state = 'dead' AND finished_at < {NOW} - ?))
                        LIMIT 5000""",
                    (finished_before.total_seconds(), dead_before.total_seconds()),
                ).fetchall()
                ids = [r[0] for r in rows]
                batch = json.dumps(ids)
                # Arrivals per lane are kept + pruned: retention must not turn that
                # counter back.
                conn.executemany(
                    "INSERT INTO postlane_pruned (lane, deliveries) VALUES (?, ?) "
                    "ON CONFLICT (lane) DO UPDATE SET "
                    "deliveries = deliveries + excluded.deliveries",
                    list(Counter(r[1] for r in rows).items()))
                # The timeline and the messages have no foreign key (checked on
                # every insert); a delivery, its message and its events go together.
                conn.execute("DELETE FROM postlane_events WHERE delivery_id IN "
                             "(SELECT value FROM json_each(?))", (batch,))
                conn.execute("DELETE FROM postlane_messages WHERE id IN "
                             "(SELECT value FROM json_each(?))", (batch,))
                conn.execute("DELETE FROM postlane_deliveries WHERE id IN "
                             "(SELECT value FROM json_each(?))", (batch,))
            total += len(ids)
            if len(ids) < 5000:
                return total
