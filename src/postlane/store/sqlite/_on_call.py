"""The on-call view on SQLite: the messages browser (keyset pages, counts), bulk cancel and
discard, workers' heartbeats and outcomes per minute (migration 0011)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from postlane.core.records import (
    DeliverySummary,
    MessageFilter,
    OutcomeMinute,
    WorkerHeartbeat,
    WorkerSeen,
)
from postlane.store.base import SUMMARY_COLUMNS, message_conditions, summary
from postlane.store.sqlite._base import _INSERT_EVENT, NOW, SQLiteBase, _dt

_SUMMARY = SUMMARY_COLUMNS.format(created="d.created_at", updated="d.updated_at")
KEEP_MINUTES_S = 2 * 86400
"""Outcome minutes older than this are dropped as new ones are written."""
KEEP_GONE_S = 86400
"""A worker that stopped heart-beating is listed (as gone) this long, then dropped."""


class OnCallMixin(SQLiteBase):
    # -- the messages browser --------------------------------------------------------------
    async def list_deliveries(self, selection: MessageFilter, *, before_id: int | None = None,
                              limit: int = 50) -> list[DeliverySummary]:
        where, params = message_conditions(selection, lambda name: f":{name}", before_id)

        def _list() -> list[DeliverySummary]:
            rows = self.conn.execute(
                f"SELECT {_SUMMARY} FROM postlane_deliveries d WHERE {where} "
                f"ORDER BY d.id DESC LIMIT :limit", {**params, "limit": limit}).fetchall()
            return [summary(_text(row)) for row in rows]
        return await self._run(self._tolerating_bad_text, _list)

    async def count_deliveries(self, selection: MessageFilter, *, cap: int) -> int:
        where, params = message_conditions(selection, lambda name: f":{name}")

        def _count() -> int:
            row = self.conn.execute(
                f"SELECT count(*) FROM (SELECT 1 FROM postlane_deliveries d WHERE {where} "
                f"LIMIT :cap)", {**params, "cap": cap + 1}).fetchone()
            return int(row[0]) if row else 0
        return await self._run(_count)

    async def cancel_if_pending_many(self, ids: Sequence[int], reason: str,
                                     by: str) -> set[int]:
        def _cancel() -> set[int]:
            cancelled = set()
            data = json.dumps({"reason": reason, "by": by})
            with self._write() as conn:
                for delivery_id in sorted(set(ids)):
                    row = conn.execute(
                        f"UPDATE postlane_deliveries SET state = 'cancelled', "
                        f"finished_at = {NOW}, updated_at = {NOW} "
                        f"WHERE id = ? AND state = 'pending' RETURNING id", (delivery_id,),
                    ).fetchone()
                    if row is not None:
                        conn.execute(_INSERT_EVENT, (delivery_id, "cancelled", "cancelled",
                                                     data))
                        cancelled.add(delivery_id)
            return cancelled
        return await self._run(_cancel) if ids else set()

    async def discard_dead_letters(self, ids: Sequence[int], reason: str,
                                   by: str) -> set[int]:
        def _discard() -> set[int]:
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
        return await self._run(_discard) if ids else set()

    # -- workers and their outcomes --------------------------------------------------------
    async def record_heartbeat(self, heartbeat: WorkerHeartbeat,
                               outcomes: Mapping[tuple[str, str], int]) -> None:
        def _beat() -> None:
            with self._write() as conn:
                conn.execute(
                    f"INSERT INTO postlane_workers (owner, host, pid, version, provider, lanes, "
                    f"in_flight, interval_s, started_at, heartbeat_at) "
                    f"VALUES (?, ?, ?, ?, ?, ?, ?, ?, {NOW}, {NOW}) ON CONFLICT (owner) DO "
                    f"UPDATE SET lanes = excluded.lanes, in_flight = excluded.in_flight, "
                    f"interval_s = excluded.interval_s, heartbeat_at = {NOW}",
                    (heartbeat.owner, heartbeat.host, heartbeat.pid, heartbeat.version,
                     heartbeat.provider, json.dumps(dict(heartbeat.lanes)),
                     heartbeat.in_flight, heartbeat.interval_s))
                conn.execute(f"DELETE FROM postlane_workers WHERE heartbeat_at < {NOW} - ?",
                             (KEEP_GONE_S,))
                counted = [(lane, outcome, n) for (lane, outcome), n
                           in sorted(outcomes.items()) if n]
                if not counted:
                    return
                conn.executemany(
                    f"INSERT INTO postlane_outcome_minutes (minute, lane, outcome, count) "
                    f"VALUES (CAST({NOW} / 60 AS INTEGER) * 60, ?, ?, ?) "
                    f"ON CONFLICT (minute, lane, outcome) DO UPDATE SET "
                    f"count = count + excluded.count", counted)
                conn.execute(f"DELETE FROM postlane_outcome_minutes WHERE minute < {NOW} - ?",
                             (KEEP_MINUTES_S,))
        await self._run(_beat)

    async def forget_worker(self, owner: str) -> None:
        def _forget() -> None:
            with self._write() as conn:
                conn.execute("DELETE FROM postlane_workers WHERE owner = ?", (owner,))
        await self._run(_forget)

    async def list_workers(self) -> list[WorkerSeen]:
        def _list() -> list[WorkerSeen]:
            rows = self.conn.execute(
                f"SELECT owner, host, pid, version, provider, lanes, in_flight, interval_s, "
                f"started_at, heartbeat_at, {NOW} - heartbeat_at FROM postlane_workers "
                f"ORDER BY host, pid, owner").fetchall()
            return [_seen(row) for row in rows]
        return await self._run(_list)

    async def outcome_minutes(self, window: timedelta) -> list[OutcomeMinute]:
        def _read() -> list[OutcomeMinute]:
            rows = self.conn.execute(
                f"SELECT minute, lane, outcome, count FROM postlane_outcome_minutes "
                f"WHERE minute >= {NOW} - ? ORDER BY minute, lane, outcome",
                (window.total_seconds(),)).fetchall()
            return [OutcomeMinute(int(m), lane, o, int(n)) for m, lane, o, n in rows]
        return await self._run(_read)


def _text(row: Sequence[Any]) -> list[Any]:
    """A row read while tolerating bad text: undecodable text shown replaced, not failing
    the page (``SQLiteBase._tolerating_bad_text``)."""
    return [v.object.decode(errors="replace") if isinstance(v, UnicodeDecodeError) else v
            for v in row]


def _seen(row: Sequence[Any]) -> WorkerSeen:
    (owner, host, pid, version, provider, lanes, in_flight, interval_s, started_at,
     heartbeat_at, age_s) = row
    return WorkerSeen(
        WorkerHeartbeat(owner, host, int(pid), version, provider,
                        {str(k): float(v) for k, v in json.loads(lanes).items()},
                        int(in_flight), float(interval_s)),
        _dt(started_at), _dt(heartbeat_at), max(0.0, float(age_s)))
