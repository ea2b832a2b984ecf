"""Send pacing against the global limiter: reserve slots for a batch in one round trip, then
hold each send until its slot, and never use a slot late.

Why not late: the limiter guarantees planned start times. After an event-loop stall (or a slow
limiter answer, or a slow gate check) every send whose slot passed meanwhile would go out at
once, on top of the on-time sends of other tasks and processes, and overfill the provider's
one-second window. Such a send takes a fresh slot instead: a per-second slot only, as the late
one spent the send's unit of the daily quota already, and a second unit would be lost to the
day.

Why a late slot is used after all when the limiter has no per-second ceiling (a daily quota
alone): there is no one-second window to overfill, and a fresh slot would cost a second unit
of the day's quota, the late one being spent already.

Why bulk lanes book less far ahead: every lane shares one ceiling, and a slot booked is gone.
If the bulk lane booked as far ahead as the interactive one, the horizon would be full of
digests whenever a reset arrived, and the reset would race the bulk lane's poller for each
slot that frees (each lost race costs it a whole booking of digests: seconds, now and then).
A yielding lane books only ``YIELDING_HORIZON_SHARE`` of the horizon, so the rest of it is
always free for the others: a reset takes a slot at once, about half a horizon out.

Every failed limiter call (Redis down) is counted in ``counters["limiter_errors"]``
(``postlane_limiter_errors_total``): the callers log it and release the deliveries unspent.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable

from postlane.limiter.base import UNLIMITED_RATE, RateLimiter
from postlane.worker.clock import Clock

YIELDING_HORIZON_SHARE = 0.5
"""The share of the horizon a yielding (bulk) lane books ahead."""

LONG_GATE_S = 2.0
"""A gate (someone's 429) shut for longer than this is not waited out: the batch goes back to
the store, unspent, rather than holding claims and slots."""


class Pacer:
    def __init__(self, limiter: RateLimiter | None, lanes: Iterable[str],
                 counters: Counter[str], *, horizon_s: float, late_slot_s: float,
                 clock: Clock, yielding: Iterable[str] = ()) -> None:
        self.limiter = limiter
        self.counters = counters
        self.horizon_s = horizon_s
        self._yielding = frozenset(yielding)
        """Lanes that leave the far part of the horizon to the others (the bulk lanes)."""
        self.late_slot_s = late_slot_s
        self.clock = clock
        # One limiter poller per lane: without it every waiting batch polls the limiter at
        # each freed slot (a thundering herd of round trips per send).
        self._reserve_locks = {name: asyncio.Lock() for name in lanes}
        self.quota_wait_s = {name: 0.0 for name in self._reserve_locks}
        """Per lane, the wait of its last long denial: a daily quota's is not the gate's (0)."""
        self._gate_check_s = 0.0  # recent worst round trip of a gate check (decaying)

    async def reserve(self, lane: str, n: int, *, spend_quota: bool = True
                      ) -> tuple[list[float], float] | None:
        """Send slots for up to ``n`` deliveries as (delays from now, uncertainty); None when
        the gate stays shut (or the daily quota refuses: ``quota_wait_s``) for long. The
        limiter decided somewhere within the round trip, so a slot counted from its answer may
        be late by up to that round trip: the uncertainty. ``spend_quota``: see
        ``RateLimiter.reserve``."""
        if self.limiter is None:
            return [0.0] * n, 0.0
        async with self._reserve_locks[lane]:
            self.quota_wait_s[lane] = 0.0
            while True:
                asked = self.clock.monotonic()
                try:
                    reservation = await self.limiter.reserve(n, self.horizon_for(lane), lane,
                                                             spend_quota=spend_quota)
                except Exception:
                    self.counters["limiter_errors"] += 1
                    raise
                if reservation.delays_s:
                    return reservation.delays_s, self.clock.monotonic() - asked
                if reservation.retry_in_s > LONG_GATE_S:
                    self.quota_wait_s[lane] = reservation.retry_in_s
                    return None
                self.counters["limiter_waits"] += 1
                await self.clock.sleep(reservation.retry_in_s)

    def horizon_for(self, lane: str) -> float:
        """How far ahead ``lane`` books send slots (see the module docstring)."""
        if lane in self._yielding:
            return self.horizon_s * YIELDING_HORIZON_SHARE
        return self.horizon_s

    async def gate_remaining(self) -> float:
        if self.limiter is None:
            return 0.0
        try:
            return await self.limiter.gate_remaining_s()
        except Exception:
            self.counters["limiter_errors"] += 1
            raise

    async def close_gate(self, seconds: float) -> None:
        """The provider said 429 with a Retry-After: nobody on the account sends until then."""
        if self.limiter is not None:
            try:
                await self.limiter.close_gate(seconds)
            except Exception:
                self.counters["limiter_errors"] += 1
                raise

    async def wait_for_slot(self, lane: str, delay_s: float, uncertainty_s: float) -> bool:
        """Sleep until the reserved slot; False when the gate is closed (someone's 429).

        A slot possibly missed by more than ``late_slot_s`` is not used (see the module
        docstring): the send reserves a fresh one. The gate is checked ahead of the slot by
        the recent worst round trip of that check (decaying, capped at ``late_slot_s``), so
        the check does not make the send late, and before that test, so a slower check still
        counts.
        """
        if self.limiter is None and delay_s <= 0:
            return True  # no gate to check, no slot to wait for: what the loop below returns
        clock = self.clock
        deadline = clock.monotonic() + delay_s
        while True:
            early = deadline - self._gate_check_s
            if early > clock.monotonic():
                await clock.sleep(early - clock.monotonic())
            # A slot granted before someone's 429 closed the gate is not used while it is shut.
            asked = clock.monotonic()
            closed = await self.gate_remaining()
            self._gate_check_s = min(max(clock.monotonic() - asked, self._gate_check_s * 0.95),
                                     self.late_slot_s)
            if closed:
                return False
            if deadline > clock.monotonic():
                await clock.sleep(deadline - clock.monotonic())
            late = clock.monotonic() - deadline + uncertainty_s
            if (self.limiter is None or late <= self.late_slot_s
                    or self.limiter.rate >= UNLIMITED_RATE):
                return True
            self.counters["late_slots"] += 1
            reserved = await self.reserve(lane, 1, spend_quota=False)
            if reserved is None:
                return False
            (delay_s,), uncertainty_s = reserved
            deadline = clock.monotonic() + delay_s
