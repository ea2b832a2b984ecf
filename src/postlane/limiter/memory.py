"""The in-process limiter: for the embedded mode, where one process owns the account.

State is integers (theoretical arrival times of the per-second and the daily bucket, and the
gate's end) in nanoseconds of a monotonic clock, so spacing is exact and wall-clock jumps cannot
open a burst. ``reserve`` never awaits while it holds the state, so it is atomic under asyncio;
a lock makes it safe across threads too. The loop is the Redis script's, line for line.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from postlane.limiter.base import (
    DailyQuota,
    RateLimiter,
    Reservation,
    check_gate_args,
    check_reserve_args,
)

_NS = 1_000_000_000


class MemoryLimiter(RateLimiter):
    """GCRA in one process. ``clock`` (seconds, monotonic) is injectable for tests."""

    def __init__(
        self,
        *,
        rate: float | None,
        burst: int = 1,
        quota: DailyQuota | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._tat_ns: int | None = None
        self._daily_tat_ns: int | None = None
        self._gate_ns: int | None = None
        self._lock = threading.Lock()
        super().__init__(rate=rate, burst=burst, quota=quota)

    def _ceilings_changed(self) -> None:
        # Rounded up: a spacing a nanosecond too long costs nothing, one too short breaks the
        # ceiling.
        self._interval_ns = math.ceil(_NS / self.rate)
        self._tau_ns = (self.burst - 1) * self._interval_ns
        self._daily = self.quota.spacing(_NS) if self.quota is not None else None

    def _now_ns(self) -> int:
        return round(self._clock() * _NS)

    async def reserve(self, n: int = 1, horizon_s: float = 1.0,
                      lane: str | None = None, *, spend_quota: bool = True) -> Reservation:
        check_reserve_args(n, horizon_s)
        horizon_ns = round(horizon_s * _NS)
        with self._lock:
            now = self._now_ns()
            if self._gate_ns is not None and self._gate_ns > now:
                return Reservation([], (self._gate_ns - now) / _NS)
            daily = self._daily if spend_quota else None
            d_interval = d_tau = 0
            d_horizon = horizon_ns
            if daily is not None and self.quota is not None:
                d_interval, d_tau, yielding_tau = daily
                if lane in self.quota.yielding:
                    # A yielding lane books no refill ahead: slots it booked for later would
                    # count against the reserve *now*, and interactive mail would find none.
                    d_tau, d_horizon = yielding_tau, 0
            # A TAT in the past is an idle bucket: slots are never handed out in the past.
            tat = now if self._tat_ns is None else max(self._tat_ns, now)
            d_tat = now if self._daily_tat_ns is None else max(self._daily_tat_ns, now)

            def wait() -> tuple[int, int]:
                """(start of the next slot, how far it is beyond what the caller accepts)."""
                start = max(now, tat - self._tau_ns)
                beyond = start - now - horizon_ns
                if d_interval:
                    d_start = max(now, d_tat - d_tau)
                    start = max(start, d_start)
                    beyond = max(beyond, start - now - horizon_ns, d_start - now - d_horizon)
                return start, beyond

            delays: list[float] = []
            while len(delays) < n:
                start, beyond = wait()
                if beyond > 0:
                    break
                delays.append((start - now) / _NS)
                tat = max(tat, start) + self._interval_ns
                if d_interval:
                    d_tat = max(d_tat, start) + d_interval
            if delays:
                self._tat_ns = tat
                if d_interval:
                    self._daily_tat_ns = d_tat
            retry_ns = 0 if len(delays) == n else wait()[1]
        return Reservation(delays, retry_ns / _NS)

    async def limit_stock(self, remaining: int) -> None:
        if self._daily is None:
            return
        interval, tau, _ = self._daily
        with self._lock:
            now = self._now_ns()
            floor = now + tau + interval - max(0, remaining) * interval
            if self._daily_tat_ns is None or floor > self._daily_tat_ns:
                self._daily_tat_ns = floor

    async def close_gate(self, until_s_from_now: float) -> None:
        check_gate_args(until_s_from_now)
        with self._lock:
            until = self._now_ns() + math.ceil(until_s_from_now * _NS)
            if self._gate_ns is None or until > self._gate_ns:
                self._gate_ns = until

    async def gate_remaining_s(self) -> float:
        return self.gate_seen_s()

    def gate_seen_s(self) -> float:
        """Exact here: the state is in this process."""
        with self._lock:
            if self._gate_ns is None:
                return 0.0
            return max(0, self._gate_ns - self._now_ns()) / _NS

    async def close(self) -> None:
        return None

    def __repr__(self) -> str:
        return f"MemoryLimiter(rate={self.rate!r}, burst={self.burst!r}, quota={self.quota!r})"
