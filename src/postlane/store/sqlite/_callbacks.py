"""Status callbacks on SQLite: endpoints, and the outbox the timeline's trigger fills
(migration 0008)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from postlane.core.records import Callback, CallbackEndpoint, CallbackResult, bound_response
from postlane.store.sqlite._base import _INSERT_EVENT, NOW, SQLiteEngine, _dt, _opt_dt

_ENDPOINT_COLS = "id, url, api_key_id, events, created_at, disabled_at, secret"
_CALLBACK_COLS = ("c.id, c.endpoint_id, c.event_id, c.delivery_id, c.type, c.payload, c.state, "
                  "c.attempts, c.last_error, c.created_at, e.url, e.secret")

_TRIGGER = """
CREATE TRIGGER IF NOT EXISTS postlane_events_callbacks
AFTER INSERT ON postlane_events
WHEN NEW.state IN ('sent', 'dead', 'expired', 'suppressed')
  OR NEW.kind IN ('provider:bounced', 'provider:complained')
BEGIN
    INSERT OR IGNORE INTO postlane_callbacks
        (endpoint_id, event_id, delivery_id, type, payload, run_at, created_at)
    SELECT e.id, NEW.id, NEW.delivery_id, t.type, json_object(
        'type', t.type,
        'timestamp', strftime('%Y-%m-%dT%H:%M:%fZ', NEW.at, 'unixepoch'),
        'data', json_object(
            'event_id', 'evt_' || NEW.id,
            'delivery_id', NEW.delivery_id,
            'key', m.idempotency_key,
            'lane', d.lane,
            'state', d.state,
            'provider', json_extract(NEW.data, '$.provider'),
            'provider_message_id', d.provider_message_id,
            'cause', COALESCE(json_extract(NEW.data, '$.response'),
                              json_extract(NEW.data, '$.why'),
                              json_extract(NEW.data, '$.reason'),
                              json_extract(NEW.data, '$.bounce_type'), d.dead_reason),
            'dead_reason', CASE WHEN NEW.state IN ('dead', 'expired') THEN d.dead_reason END,
            'attempt', json_extract(NEW.data, '$.attempt'))),
        NEW.at, NEW.at
    FROM (SELECT CASE
            WHEN NEW.state = 'sent' THEN 'delivery.sent'
            WHEN NEW.state IN ('dead', 'expired') THEN 'delivery.dead_lettered'
            WHEN NEW.state = 'suppressed' THEN 'delivery.suppressed'
            WHEN NEW.kind = 'provider:bounced' THEN 'delivery.bounced'
            ELSE 'delivery.complained' END AS type) t
    JOIN postlane_deliveries d ON d.id = NEW.delivery_id
    JOIN postlane_messages m ON m.id = NEW.delivery_id  -- the key and producer (0007)
    JOIN postlane_callback_endpoints e
      ON e.disabled_at IS NULL
     AND (e.api_key_id IS NULL OR m.producer = 'apikey:' || e.api_key_id)
     AND (e.events = '*' OR instr(',' || e.events || ',', ',' || t.type || ',') > 0);
END
"""
"""Callbacks are enqueued with the timeline event that causes them, in its transaction. The
trigger exists only while an endpoint is active (created with the first, dropped with the
last, in the same transaction): SQLite runs a row trigger's program for every insert, about
3 µs even for an event its WHEN clause skips, and claims, acks and enqueues all write events.
"""


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
                "INSERT INTO postlane_callback_endpoints (url, secret, api_key_id, events, "
                f"created_at) VALUES (?, ?, ?, ?, {NOW}) RETURNING {_ENDPOINT_COLS}",
                (url, secret, api_key_id, ",".join(events) or "*")).fetchone()
            conn.execute(_TRIGGER)
        return _endpoint(row)

    def list_callback_endpoints(self, api_key_id: int | None = None,
                                *, every_key: bool = True) -> list[CallbackEndpoint]:
        rows = self.conn.execute(
            f"SELECT {_ENDPOINT_COLS} FROM postlane_callback_endpoints "
            "WHERE ? OR api_key_id IS ? ORDER BY id", (every_key, api_key_id)).fetchall()
        return [_endpoint(r) for r in rows]

    def disable_callback_endpoint(self, endpoint_id: int,
                                  api_key_id: int | None = None) -> bool:
        with self._write() as conn:
            row = conn.execute(
                f"UPDATE postlane_callback_endpoints SET disabled_at = {NOW} "
                "WHERE id = ? AND disabled_at IS NULL AND (? IS NULL OR api_key_id = ?) "
                "RETURNING id", (endpoint_id, api_key_id, api_key_id)).fetchone()
            if not conn.execute("SELECT 1 FROM postlane_callback_endpoints "
                                "WHERE disabled_at IS NULL LIMIT 1").fetchone():
                conn.execute("DROP TRIGGER IF EXISTS postlane_events_callbacks")
        return row is not None

    def claim_callbacks(self, limit: int, lease_s: float) -> list[Callback]:
        with self._write() as conn:
            conn.execute(
                "UPDATE postlane_callbacks SET state = 'dead', finished_at = "
                f"{NOW}, last_error = 'endpoint disabled' WHERE state = 'pending' AND "
                "endpoint_id IN (SELECT id FROM postlane_callback_endpoints "
                "WHERE disabled_at IS NOT NULL)")
            ids = [r[0] for r in conn.execute(
                f"SELECT id FROM postlane_callbacks WHERE state = 'pending' AND run_at <= "
                f"{NOW} ORDER BY run_at, id LIMIT ?", (limit,))]
            if not ids:
                return []
            marks = ",".join("?" * len(ids))
            conn.execute(
                f"UPDATE postlane_callbacks SET run_at = {NOW} + ?, attempts = attempts + 1 "
                f"WHERE id IN ({marks})", (lease_s, *ids))
            rows = conn.execute(
                f"SELECT {_CALLBACK_COLS} FROM postlane_callbacks c JOIN "
                "postlane_callback_endpoints e ON e.id = c.endpoint_id "
                f"WHERE c.id IN ({marks}) ORDER BY c.id", ids).fetchall()
        return [_callback(r) for r in rows]

    def finish_callbacks(self, results: Sequence[CallbackResult]) -> int:
        if not results:
            return 0
        applied = 0
        with self._write() as conn:
            for r in results:
                error = bound_response(r.error)
                if r.outcome == "retry":
                    row = conn.execute(
                        f"UPDATE postlane_callbacks SET run_at = {NOW} + ?, last_error = ? "
                        "WHERE id = ? AND attempts = ? AND state = 'pending' "
                        "RETURNING delivery_id", (r.delay_s, error, r.id, r.attempts)
                    ).fetchone()
                else:
                    row = conn.execute(
                        f"UPDATE postlane_callbacks SET state = ?, finished_at = {NOW}, "
                        "last_error = COALESCE(?, last_error) WHERE id = ? AND attempts = ? "
                        "AND state = 'pending' RETURNING delivery_id, endpoint_id, type, "
                        "event_id", (r.outcome, error, r.id, r.attempts)).fetchone()
                    if row is not None:
                        conn.execute(_INSERT_EVENT, (
                            row[0], f"callback_{r.outcome}", None, json.dumps({
                                "callback": r.id, "endpoint": row[1], "type": row[2],
                                "event_id": f"evt_{row[3]}", "attempts": r.attempts,
                                **({"error": error} if error else {})})))
                applied += row is not None
        return applied

    def list_callbacks(self, state: str | None = None, delivery_id: int | None = None,
                       limit: int = 100) -> list[Callback]:
        rows = self.conn.execute(
            f"SELECT {_CALLBACK_COLS} FROM postlane_callbacks c JOIN "
            "postlane_callback_endpoints e ON e.id = c.endpoint_id "
            "WHERE (? IS NULL OR c.state = ?) AND (? IS NULL OR c.delivery_id = ?) "
            "ORDER BY c.id DESC LIMIT ?",
            (state, state, delivery_id, delivery_id, limit)).fetchall()
        return [_callback(r) for r in rows]

    def replay_callbacks(self, ids: Sequence[int] | None = None) -> int:
        with self._write() as conn:
            cur = conn.execute(
                f"UPDATE postlane_callbacks SET state = 'pending', run_at = {NOW}, "
                "attempts = 0, finished_at = NULL, replay_count = replay_count + 1 "
                "WHERE state = 'dead' AND (:ids IS NULL OR id IN "
                "(SELECT value FROM json_each(:ids)))",
                {"ids": None if ids is None else json.dumps(list(ids))})
            return cur.rowcount

    def callback_counts(self) -> dict[str, int]:
        return dict(self.conn.execute(
            "SELECT state, count(*) FROM postlane_callbacks GROUP BY state").fetchall())
