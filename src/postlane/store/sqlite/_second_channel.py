"""The second channel and careful imports on SQLite: SMS fallbacks (``core.fallback``) and
import canaries (``core.canary``). Each write is one ``BEGIN IMMEDIATE`` transaction, so the
guards read and write under SQLite's one writer lock."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from postlane.core.canary import HELD_BEYOND
from postlane.core.fallback import CANDIDATE_STATES
from postlane.core.message import Delivery, Message
from postlane.core.producers import FALLBACK_PRODUCER
from postlane.core.records import ChannelStats, FallbackPair, ImportCanary
from postlane.store.base import CHANNEL_STATS as _CHANNEL_STATS
from postlane.store.base import channel_stats as _channel_stats
from postlane.store.sqlite._base import (
    Q,
    SQLiteEngine,
    _dt,
    _opt_dt,
    _read,
    tolerating_bad_text,
)
from postlane.store.sqlite._producing import insert_one


def _pair(row: Sequence[Any]) -> FallbackPair:
    return FallbackPair(row[0], row[1], row[2], _dt(row[3]))


class SecondChannelMixin(SQLiteEngine):
    # -- SMS fallbacks ---------------------------------------------------------------------
    @tolerating_bad_text
    def list_fallback_candidates(
        self, unsent_after_s: float | None, limit: int = 100
    ) -> list[Delivery]:
        rows = self.conn.execute(Q["fallback_candidates"], {"after_s": unsent_after_s,
                                                          "limit": limit}).fetchall()
        return [_read(self.conn, r) for r in rows]

    def create_sms_fallback(
        self, email_id: int, states: Sequence[str], message: Message | None, reason: str
    ) -> FallbackPair | None:
        assert set(states) <= set(CANDIDATE_STATES)
        with self._write() as conn:
            row = conn.execute(Q["fallback_email"], (email_id,)).fetchone()
            if row is None or row[0] not in states:
                return None
            state, email_key = row
            if conn.execute(Q["has_sms_fallback"], (email_id,)).fetchone():
                return None
            sms_id: int | None = None
            if message is not None:
                sms_id = insert_one(conn, message, FALLBACK_PRODUCER,
                                    compare_content=False).id
            pair = conn.execute(Q["insert_sms_fallback"],
                                (email_id, sms_id, reason)).fetchone()
            _pair_events(conn, email_id, state, email_key, sms_id, message, reason)
        if sms_id is not None:
            self.wake()
        return _pair(pair)

    def channel_stats(self) -> ChannelStats:
        return _channel_stats(self.conn.execute(_CHANNEL_STATS).fetchall())

    def sms_fallback_pair(self, delivery_id: int) -> FallbackPair | None:
        row = self.conn.execute(Q["sms_fallback_pair"], (delivery_id, delivery_id)).fetchone()
        return _pair(row) if row else None

    # -- import canaries -------------------------------------------------------------------
    def start_import_canary(
        self, import_id: str, size: int, keys: Sequence[str]
    ) -> ImportCanary:
        with self._write() as conn:
            conn.execute(
                Q["start_import_canary"], (import_id, size, json.dumps(list(keys))))
        canary = _canary(self.conn, import_id)
        assert canary is not None
        return canary

    def get_import_canary(self, import_id: str) -> ImportCanary | None:
        return _canary(self.conn, import_id)

    def list_waiting_canaries(self, limit: int = 100) -> list[ImportCanary]:
        ids = [r[0] for r in self.conn.execute(Q["waiting_canaries"], (limit,))]
        found = [_canary(self.conn, import_id) for import_id in ids]
        return [c for c in found if c is not None]

    def settle_import_canary(self, import_id: str, passed: bool, reason: str) -> bool:
        with self._write() as conn:
            row = conn.execute(
                Q["settle_import_canary"],
                ("passed" if passed else "failed", reason, import_id)).fetchone()
            if row is None:
                return False
            if passed:
                _release(conn, import_id, "the import's canary passed")
        if passed:
            self.wake()
        return True

    def release_import_hold(self, import_id: str) -> int:
        with self._write() as conn:
            conn.execute(Q["release_import_canary"], (import_id,))
            released = _release(conn, import_id, "released by an operator")
        self.wake()
        return released


def _pair_events(conn: sqlite3.Connection, email_id: int, state: str, email_key: str,
                 sms_id: int | None, message: Message | None, reason: str) -> None:
    if message is None or sms_id is None:
        conn.execute(Q["insert_event"], (email_id, "sms_fallback_skipped", state, json.dumps(
            {"reason": reason, "why": f"the fallback policy does not fall back on {reason}"})))
        return
    sms = dict(message.metadata.get("sms", {}))
    conn.execute(Q["insert_event"], (email_id, "sms_fallback", state, json.dumps(
        {"sms_id": sms_id, "sms_key": message.key, "reason": reason, **sms})))
    conn.execute(Q["insert_event"], (sms_id, "fallback_of", "pending", json.dumps(
        {"email_id": email_id, "email_key": email_key, "reason": reason, **sms})))


def _canary(conn: sqlite3.Connection, import_id: str) -> ImportCanary | None:
    row = conn.execute(Q["import_canary"], (import_id,)).fetchone()
    if row is None:
        return None
    keys = tuple(json.loads(row[2]))
    states: dict[str, int] = {}
    failures = []
    for state, count, failure in conn.execute(
            Q["canary_states"], {"import_id": import_id, "keys": json.dumps(list(keys))}):
        states[state] = count
        if failure:
            failures.append(failure)
    held = conn.execute(Q["canary_held"], {"import_id": import_id,
                                           "beyond_s": HELD_BEYOND.total_seconds()}
                        ).fetchone()[0]
    return ImportCanary(row[0], row[1], keys, row[3], row[4], _dt(row[5]), _opt_dt(row[6]),
                        states, min(failures) if failures else None, held)


def _release(conn: sqlite3.Connection, import_id: str, why: str) -> int:
    rows = conn.execute(
        Q["release_canary_held"],
        {"import_id": import_id, "beyond_s": HELD_BEYOND.total_seconds()}).fetchall()
    conn.executemany(Q["insert_event"],
                     [(r[0], "released", "pending", json.dumps({"why": why})) for r in rows])
    return len(rows)
