"""The on-call view on SQLite: workers' heartbeats and outcomes per minute (migration 0011).
The messages browser's and the bulk actions' queries are ``_operating``'s, shared with the
HTTP API."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from postlane.core.records import OutcomeMinute, WorkerHeartbeat, WorkerSeen
from postlane.store.sqlite._base import Q, SQLiteEngine, _dt

KEEP_MINUTES_S = 2 * 86400
"""Outcome minutes older than this are dropped as new ones are written."""
KEEP_GONE_S = 86400
"""A worker that stopped heart-beating is listed (as gone) this long, then dropped."""


class OnCallMixin(SQLiteEngine):
    def record_heartbeat(self, heartbeat: WorkerHeartbeat,
                         outcomes: Mapping[tuple[str, str], int]) -> None:
        with self._write() as conn:
            conn.execute(
                Q["record_heartbeat"],
                (heartbeat.owner, heartbeat.host, heartbeat.pid, heartbeat.version,
                 heartbeat.provider, json.dumps(dict(heartbeat.lanes)),
                 heartbeat.in_flight, heartbeat.interval_s))
            conn.execute(Q["drop_gone_workers"], (KEEP_GONE_S,))
            counted = [(lane, outcome, n) for (lane, outcome), n
                       in sorted(outcomes.items()) if n]
            if not counted:
                return
            conn.executemany(Q["count_outcomes"], counted)
            conn.execute(Q["drop_old_outcome_minutes"], (KEEP_MINUTES_S,))

    def forget_worker(self, owner: str) -> None:
        with self._write() as conn:
            conn.execute(Q["forget_worker"], (owner,))

    def list_workers(self) -> list[WorkerSeen]:
        rows = self.conn.execute(Q["list_workers"]).fetchall()
        return [_seen(row) for row in rows]

    def outcome_minutes(self, window: timedelta) -> list[OutcomeMinute]:
        rows = self.conn.execute(Q["outcome_minutes"], (window.total_seconds(),)).fetchall()
        return [OutcomeMinute(int(m), lane, o, int(n)) for m, lane, o, n in rows]


def _seen(row: Sequence[Any]) -> WorkerSeen:
    (owner, host, pid, version, provider, lanes, in_flight, interval_s, started_at,
     heartbeat_at, age_s) = row
    return WorkerSeen(
        WorkerHeartbeat(owner, host, int(pid), version, provider,
                        {str(k): float(v) for k, v in json.loads(lanes).items()},
                        int(in_flight), float(interval_s)),
        _dt(started_at), _dt(heartbeat_at), max(0.0, float(age_s)))
