"""Housekeeping, every ``controls_interval_s``: read the fleet's controls (pauses, breaker),
rescue expired leases, reconcile ambiguous deliveries, create the SMS fallbacks that fell
due and settle import canaries (``worker.housekeeping``) every ``rescue_interval_s``, write
the worker's heartbeat every ``heartbeat_interval_s`` (``worker.heartbeat``), and in
``drain`` mode notice when everything is done.

Rescue runs on every worker: a worker that died holding leases cannot rescue its own, and a
fleet where only one host rescues stalls when that host is the one down. The guarded SQL makes
concurrent rescues harmless.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from postlane.store.roles import WorkerStore
from postlane.worker.breaker import FleetBreaker
from postlane.worker.clock import Clock
from postlane.worker.controls import FleetControls
from postlane.worker.heartbeat import Heartbeat
from postlane.worker.housekeeping import Housekeeping
from postlane.worker.reconciler import Reconciler

log = logging.getLogger("postlane.worker")


class Caretaker:
    def __init__(
        self, store: WorkerStore, *, controls: FleetControls, breakers: Sequence[FleetBreaker],
        reconciler: Reconciler, rescue_interval_s: float, interval_s: float,
        drain: Callable[[], Awaitable[bool]] | None, wake: Callable[[], None], clock: Clock,
        housekeeping: Housekeeping | None = None,
        heartbeat: Heartbeat | None = None,
    ) -> None:
        self.store = store
        self.controls = controls
        self.breakers = list(breakers)
        """One per provider of the worker (the primary's first)."""
        self.reconciler = reconciler
        self.rescue_interval_s = rescue_interval_s
        self.interval_s = interval_s
        self.drain = drain
        """In drain mode: whether all is done (the worker may exit); None otherwise."""
        self.wake = wake
        self.clock = clock
        self.housekeeping = housekeeping
        """SMS fallbacks and import canaries, on the rescue interval."""
        self.heartbeat = heartbeat
        self._last_rescue: float | None = None

    async def step(self) -> bool:
        """One turn of the caretaker's loop: a round, then the interval; True once drained."""
        if await self.care():
            return True
        await self.clock.sleep(self.interval_s)
        return False

    async def care(self) -> bool:
        """One round of housekeeping; True when a drain is complete."""
        await self.controls.refresh()
        for breaker in self.breakers:
            await breaker.refresh(self.controls.breaker(breaker.account))
        now = self.clock.monotonic()
        if self._last_rescue is None or now - self._last_rescue >= self.rescue_interval_s:
            self._last_rescue = now
            await self.rescue()
            await self.reconciler.reconcile()
            if self.housekeeping is not None:
                await self.housekeeping.care()
        if self.heartbeat is not None:
            await self.heartbeat.maybe_beat()
        return self.drain is not None and await self.drain()

    async def rescue(self) -> None:
        """Expired leases back to pending (or ambiguous, when the send may have left)."""
        rescued = await self.store.rescue_expired_leases()
        if rescued.requeued or rescued.ambiguous:
            log.warning("rescued expired leases: %d requeued, %d ambiguous",
                        len(rescued.requeued), len(rescued.ambiguous))
            self.wake()
