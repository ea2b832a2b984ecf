"""Status callbacks on SQLite: endpoints, and the outbox the timeline's trigger fills
(migration 0008; the trigger is the ``callbacks_trigger`` entry, there while an endpoint is
active)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from postlane.core.records import Callback, CallbackEndpoint, CallbackResult, bound_response
from postlane.store.sqlite._base import Q, SQLiteEngine, _dt, _opt_dt


def _endpoint(row: Sequence[Any]) -> CallbackEndpoint:
    events = () if row[3] == "*" else tuple(row[3].split(","))
    return CallbackEndpoint(row[0], row[1], row[2], events, _dt(row[4]), _opt_dt(row[5]),
                            secret=row[6])


def _callback(row: Sequence[Any]) -> Callback:
    return Callback(row[0], row[1], row[2], row[3], row[4], json.loads(row[5]), row[6], row[7],
                    row[8], _dt(row[9]), url=row[10], secret=row[11])


class CallbacksMixin(SQLiteEngine):
    def add_callback_endpoint(self, url: str, secret: str, api_key_id: int | None,
                              events: Sequence[str]) -> CallbackEndpoint:
        with self._write() as conn:
            row = conn.execute(
                Q["add_callback_endpoint"],
                (url, secret, api_key_id, ",".join(events) or "*")).fetchone()
            conn.execute(Q["callbacks_trigger"])
        return _endpoint(row)

    def list_callback_endpoints(self, api_key_id: int | None = None,
                                *, every_key: bool = True) -> list[CallbackEndpoint]:
        rows = self.conn.execute(
            Q["list_callback_endpoints"], (every_key, api_key_id)).fetchall()
        return [_endpoint(r) for r in rows]

    def disable_callback_endpoint(self, endpoint_id: int,
                                  api_key_id: int | None = None) -> bool:
        with self._write() as conn:
            row = conn.execute(
                Q["disable_callback_endpoint"], (endpoint_id, api_key_id, api_key_id)).fetchone()
            if not conn.execute(Q["any_active_callback_endpoint"]).fetchone():
                conn.execute(Q["drop_callbacks_trigger"])
        return row is not None

    def claim_callbacks(self, limit: int, lease_s: float) -> list[Callback]:
        with self._write() as conn:
            conn.execute(Q["kill_callbacks_of_disabled_endpoints"])
            ids = [r[0] for r in conn.execute(Q["due_callbacks"], (limit,))]
            if not ids:
                return []
            conn.execute(Q["lease_callbacks"], (lease_s, json.dumps(ids)))
            rows = conn.execute(Q["callbacks_by_ids"], (json.dumps(ids),)).fetchall()
        return [_callback(r) for r in rows]

    def finish_callbacks(self, results: Sequence[CallbackResult]) -> int:
        if not results:
            return 0
        applied = 0
        with self._write() as conn:
            for r in results:
                error = bound_response(r.error)
                if r.outcome == "retry":
                    row = conn.execute(Q["retry_callback"],
                                       (r.delay_s, error, r.id, r.attempts)).fetchone()
                else:
                    row = conn.execute(Q["finish_callback"],
                                       (r.outcome, error, r.id, r.attempts)).fetchone()
                    if row is not None:
                        conn.execute(Q["insert_event"], (
                            row[0], f"callback_{r.outcome}", None, json.dumps({
                                "callback": r.id, "endpoint": row[1], "type": row[2],
                                "event_id": f"evt_{row[3]}", "attempts": r.attempts,
                                **({"error": error} if error else {})})))
                applied += row is not None
        return applied

    def list_callbacks(self, state: str | None = None, delivery_id: int | None = None,
                       limit: int = 100) -> list[Callback]:
        rows = self.conn.execute(
            Q["list_callbacks"],
            (state, state, delivery_id, delivery_id, limit)).fetchall()
        return [_callback(r) for r in rows]

    def replay_callbacks(self, ids: Sequence[int] | None = None) -> int:
        with self._write() as conn:
            cur = conn.execute(
                Q["replay_callbacks"], {"ids": None if ids is None else json.dumps(list(ids))})
            return cur.rowcount

    def callback_counts(self) -> dict[str, int]:
        return dict(self.conn.execute(Q["callback_counts"]).fetchall())
