"""Acknowledgement batching: outcomes are decided one by one but written many per statement.

A send reports its outcome here without awaiting (so a stop that cancels the send cannot lose
it); the acker writes what has gathered every ``ack_interval_s``, or at once when a batch is
full. Each write is guarded by the lease (``set_state_if_sending_many``): an outcome whose
lease another worker took over is dropped, never written over that worker's. When the store
is down the outcomes stay in memory, in order, and are written once it is back.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

from postlane.core.records import Claim, Transition
from postlane.core.states import State
from postlane.store.roles import WorkerStore
from postlane.worker.clock import Clock

log = logging.getLogger("postlane.worker")


class Acker:
    def __init__(self, store: WorkerStore, owner: str, held: dict[int, Claim],
                 counters: Counter[str], *, batch_size: int, interval_s: float,
                 clock: Clock) -> None:
        self.store = store
        self.owner = owner
        self.held = held
        """The worker's claims by id (shared): a written outcome ends its claim."""
        self.counters = counters
        self.batch_size = batch_size
        self.interval_s = interval_s
        self.clock = clock
        self.pending: list[Transition] = []
        """Outcomes reported and not yet written."""
        self.lock = asyncio.Lock()
        """Held for a whole flush: a stop waits on it, so a flush is never cut in half."""
        self._wakeup = asyncio.Event()

    def add(self, transition: Transition) -> None:
        self.pending.append(transition)
        if len(self.pending) >= self.batch_size:
            self._wakeup.set()

    def wake(self) -> None:
        self._wakeup.set()

    async def step(self) -> bool:
        """One turn of the acker's loop: wait for a full batch or the interval, then write."""
        await self.clock.wait(self._wakeup, self.interval_s)
        self._wakeup.clear()
        await self.flush()
        return False

    async def flush(self) -> None:
        async with self.lock:
            if not self.pending:
                return
            batch, self.pending = self.pending, []
            try:
                applied = await self.store.set_state_if_sending_many(self.owner, batch)
            except BaseException:
                self.pending[:0] = batch
                raise
            for transition in batch:
                self.held.pop(transition.id, None)
                if transition.id not in applied:
                    self.counters["lease_lost"] += 1
                    log.warning("delivery %d: outcome %s dropped, the lease was taken over",
                                transition.id, transition.event)
                else:
                    self.counters[f"state:{transition.state}"] += 1

    def release_unreported(self) -> None:
        """At the very end of a stop: deliveries still held that no outcome was reported for
        were claimed but never sent (a claim or a slot wait cut short by the stop). Give them
        back unspent rather than leave them leased until the lease expires."""
        reported = {t.id for t in self.pending}
        for claim in list(self.held.values()):
            if claim.id not in reported:
                self.pending.append(Transition(
                    claim.id, claim.claims, State.PENDING, "released", delay_s=0.0,
                    spend_attempt=False, detail={"why": "released at shutdown"}))
