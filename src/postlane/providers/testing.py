"""Providers for tests, demos and benchmarks: they behave as documented, and record.

- ``NoopProvider`` (``noop://``) accepts everything at once: the dispatch benchmark's peer.
- ``RecordingProvider`` (in-process) records every send and can be scripted to answer
  with any outcome, per key or for everything, for a while.
- ``RecordFileProvider`` (``record:///path.db``) records into a SQLite file, so several
  worker processes (and the test that kills them) share one provider-side truth.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sqlite3
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from postlane.core.message import Delivery
from postlane.core.outcomes import Outcome, OutcomeClass
from postlane.providers.base import Capabilities, Provider


class NoopProvider(Provider):
    name = "noop"
    capabilities = Capabilities(deduplicates_by_key=True)

    def __init__(self) -> None:
        self.sent = 0

    async def send(self, delivery: Delivery) -> Outcome:
        self.sent += 1
        return Outcome.accepted(f"noop-{delivery.id}")


@dataclass(frozen=True, slots=True)
class SendRecord:
    key: str
    delivery_id: int
    at: float
    outcome: OutcomeClass


Script = Callable[[Delivery], Outcome | None]


class RecordingProvider(Provider):
    """Records every call; answers from per-key scripts, then a global script, else accepts.

    With ``deduplicate=True`` it honours idempotency keys as a real ESP does: a repeat of
    an accepted key returns the original id and counts as ``duplicates_suppressed``.
    Without it, a repeat is a real second message and counts as ``duplicates``.
    """

    name = "recording"

    def __init__(
        self,
        *,
        deduplicate: bool = True,
        lookup: bool = False,
        latency_s: float = 0.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.capabilities = Capabilities(
            deduplicates_by_key=deduplicate,
            dedup_window=timedelta(hours=24) if deduplicate else None,
            can_lookup_by_key=lookup,
        )
        self.latency_s = latency_s
        self.clock = clock
        self.sends: list[SendRecord] = []
        self.accepted: dict[str, str] = {}
        self.duplicates = 0
        self.duplicates_suppressed = 0
        self._per_key: dict[str, deque[Outcome]] = defaultdict(deque)
        self._script: Script | None = None
        self._ids = itertools.count(1)
        self.sent_event = asyncio.Event()

    def script_key(self, key: str, *outcomes: Outcome) -> None:
        """Answer the next sends of ``key`` with ``outcomes``, in order."""
        self._per_key[key].extend(outcomes)

    def script(self, fn: Script | None) -> None:
        """Answer every send with ``fn(delivery)`` (None from it means: behave normally)."""
        self._script = fn

    def attempts_of(self, key: str) -> list[SendRecord]:
        return [s for s in self.sends if s.key == key]

    async def send(self, delivery: Delivery) -> Outcome:
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        outcome = self._answer(delivery)
        self.sends.append(SendRecord(delivery.key, delivery.id, self.clock(), outcome.kind))
        self.sent_event.set()
        return outcome

    def _answer(self, delivery: Delivery) -> Outcome:
        queued = self._per_key.get(delivery.key)
        scripted = queued.popleft() if queued else (
            self._script(delivery) if self._script else None
        )
        if scripted is not None and scripted.kind is not OutcomeClass.ACCEPTED:
            if scripted.kind is OutcomeClass.AMBIGUOUS:
                # Accept-then-timeout: the provider has it, the caller never hears so.
                self._accept(delivery.key)
            return scripted
        # A scripted acceptance keeps its response (an SMTP "250 ... queued as"); the id is
        # always the recorder's own, so that duplicates are counted the same way.
        return Outcome.accepted(self._accept(delivery.key),
                                response=scripted.response if scripted is not None else None)

    def _accept(self, key: str) -> str:
        if key in self.accepted:
            if self.capabilities.deduplicates_by_key:
                self.duplicates_suppressed += 1
                return self.accepted[key]
            self.duplicates += 1
            return self.accepted[key]
        self.accepted[key] = f"rec-{next(self._ids)}"
        return self.accepted[key]

    async def lookup(self, key: str) -> Outcome | None:
        if key in self.accepted:
            return Outcome.accepted(self.accepted[key])
        return None


class RecordFileProvider(Provider):
    """A recording provider whose memory is a SQLite file shared by processes.

    Options (URL query): ``dedupe=0|1`` (default 1), ``latency_ms``, ``hang_key`` (after
    accepting this key, never answer: the test kills the worker while it waits).
    """

    name = "record"

    def __init__(self, path: str, *, deduplicate: bool = True, latency_s: float = 0.0,
                 hang_key: str | None = None) -> None:
        self.path = path
        self.capabilities = Capabilities(deduplicates_by_key=deduplicate,
                                         dedup_window=timedelta(hours=24) if deduplicate
                                         else None)
        self.latency_s = latency_s
        self.hang_key = hang_key
        self._conn: sqlite3.Connection | None = None
        self._lock = asyncio.Lock()

    async def open(self) -> None:
        self._conn = open_record_file(self.path)

    async def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def send(self, delivery: Delivery) -> Outcome:
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        # Stamped on arrival, as a provider counts requests against its rate limit; the
        # recorder's own queueing (the lock, the file's write lock) is not the sender's.
        arrived = time.time()
        async with self._lock:
            provider_id = await asyncio.to_thread(self._record, delivery, arrived)
        if delivery.key == self.hang_key:
            await asyncio.Event().wait()  # accepted, and the answer never comes
        return Outcome.accepted(provider_id)

    def _record(self, delivery: Delivery, arrived: float) -> str:
        assert self._conn is not None, "provider not opened"
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(
                "INSERT INTO sends (key, delivery_id, at, pid) VALUES (?, ?, ?, ?)",
                (delivery.key, delivery.id, arrived, os.getpid()),
            )
            row = conn.execute("SELECT provider_id FROM accepted WHERE key = ?",
                               (delivery.key,)).fetchone()
            if row is None:
                provider_id = f"rf-{delivery.key}"
                conn.execute("INSERT INTO accepted (key, provider_id, copies) VALUES (?, ?, 1)",
                             (delivery.key, provider_id))
            else:
                provider_id = row[0]
                column = "suppressed" if self.capabilities.deduplicates_by_key else "copies"
                conn.execute(f"UPDATE accepted SET {column} = {column} + 1 WHERE key = ?",
                             (delivery.key,))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return str(provider_id)


def open_record_file(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, timeout=60, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA busy_timeout=60000")
    conn.execute("CREATE TABLE IF NOT EXISTS sends (seq INTEGER PRIMARY KEY, key TEXT NOT NULL, "
                 "delivery_id INTEGER, at REAL NOT NULL, pid INTEGER)")
    conn.execute("CREATE TABLE IF NOT EXISTS accepted (key TEXT PRIMARY KEY, "
                 "provider_id TEXT NOT NULL, copies INTEGER NOT NULL DEFAULT 1, "
                 "suppressed INTEGER NOT NULL DEFAULT 0)")
    return conn


@dataclass(frozen=True, slots=True)
class RecordFileStats:
    sends: int
    accepted: int
    duplicates: int
    """Keys delivered more than once (a real duplicate reached the recipient)."""
    duplicates_suppressed: int
    send_times: list[float]
    keys: dict[str, int]
    """Send attempts per key."""


def read_record_file(path: str) -> RecordFileStats:
    conn = open_record_file(path)
    try:
        times = [r[0] for r in conn.execute("SELECT at FROM sends ORDER BY at")]
        keys = dict(conn.execute("SELECT key, count(*) FROM sends GROUP BY key").fetchall())
        accepted, dups, suppressed = conn.execute(
            "SELECT count(*), COALESCE(sum(copies - 1), 0), COALESCE(sum(suppressed), 0) "
            "FROM accepted").fetchone()
    finally:
        conn.close()
    return RecordFileStats(len(times), accepted, dups, suppressed, times, keys)
