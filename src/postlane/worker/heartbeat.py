"""The worker's heartbeat: every ``heartbeat_interval_s`` the caretaker writes who this worker
is (host, pid, version, lanes and shares, provider, sends in flight) and the outcomes it
decided since the last beat, counted per lane and minute, in one transaction
(``WorkerStore.record_heartbeat``). The dashboard's workers page reads the first, its
outcomes-over-time page the second; both outlive any one ``serve`` process.

A clean stop writes the last counts and removes the heartbeat; a worker that dies leaves
its row to age, and the page shows it as gone (``core.records.GONE_AFTER_BEATS``).
"""

from __future__ import annotations

import logging
import os
import socket
from collections import Counter
from collections.abc import Callable, Mapping

from postlane import __version__
from postlane.core.message import Delivery
from postlane.core.outcomes import OutcomeClass
from postlane.core.policy import Decision
from postlane.core.records import WorkerHeartbeat
from postlane.core.states import State
from postlane.store.roles import WorkerStore
from postlane.worker.clock import Clock

log = logging.getLogger("postlane.worker")


def outcome_series(decision: Decision) -> str | None:
    """Which of ``core.records.OUTCOME_SERIES`` a decided outcome counts in, if any. A
    transient failure that ends a delivery's budget counts as the dead letter it became."""
    if decision.state is State.SENT:
        return "sent"
    if decision.state in (State.DEAD, State.EXPIRED):
        return "dead"
    if decision.state is State.AMBIGUOUS:
        return "ambiguous"
    if decision.event == "throttled":
        return "throttled"
    if decision.detail.get("outcome") == OutcomeClass.TRANSIENT:
        return "transient"
    return None


class Heartbeat:
    def __init__(self, store: WorkerStore, *, owner: str, provider: str,
                 lanes: Mapping[str, float], in_flight: Callable[[], int], interval_s: float,
                 clock: Clock) -> None:
        self.store = store
        self.owner = owner
        self.provider = provider
        self.lanes = dict(lanes)
        self.in_flight = in_flight
        self.interval_s = interval_s
        self.clock = clock
        self.counts: Counter[tuple[str, str]] = Counter()
        """(lane, outcome) -> decided since the last beat was written."""
        self._last: float | None = None

    def observe(self, delivery: Delivery, decision: Decision) -> None:
        """A ``Worker`` observer: count the outcome; never blocks."""
        series = outcome_series(decision)
        if series is not None:
            self.counts[(delivery.lane, series)] += 1

    def record(self) -> WorkerHeartbeat:
        return WorkerHeartbeat(
            owner=self.owner, host=socket.gethostname(), pid=os.getpid(),
            version=__version__, provider=self.provider, lanes=self.lanes,
            in_flight=self.in_flight(), interval_s=self.interval_s)

    async def maybe_beat(self) -> None:
        """Beat when ``interval_s`` has passed on the worker's clock (at once the first
        time)."""
        now = self.clock.monotonic()
        if self._last is None or now - self._last >= self.interval_s:
            self._last = now
            await self.beat()

    async def beat(self) -> None:
        counts, self.counts = self.counts, Counter()
        try:
            await self.store.record_heartbeat(self.record(), counts)
        except BaseException:
            self.counts.update(counts)  # counted again with the next beat
            raise

    async def stop(self) -> None:
        """A clean stop: the last counts written, the heartbeat removed. A database that is
        down now leaves the row to age into "gone", as for a worker that died."""
        try:
            if self.counts:
                await self.beat()
            await self.store.forget_worker(self.owner)
        except Exception as exc:
            log.warning("could not remove this worker's heartbeat (%s: %s)",
                        type(exc).__name__, exc)
