"""The limiter seam: one ceiling per provider account, shared by every lane, process and host.

A limiter hands out *send slots*, GCRA-style (the generic cell rate algorithm): slots are spaced
``1/rate`` apart (``burst`` of them may sit back to back), never in the past and never further
ahead than the caller's horizon. A caller reserves several slots in one round trip and sleeps
until each, so a backlog uses the ceiling fully without a round trip per send and without the
rounding losses of a counter per second.

Why the worker runs it slightly *below* the provider's documented ceiling (headroom, a few
per cent): the limiter guarantees the planned start times, not the moment a request lands at the
provider. Event-loop wake-ups, scheduling, connection reuse and the network all jitter, so two
sends planned exactly ``1/rate`` apart can arrive a little closer together, and the provider
counts what arrives. A small headroom absorbs that jitter; the ceiling is still used at 95 % or
more during a backlog.

A 429 with ``Retry-After`` closes the account's *gate*: until then nobody gets a slot, whichever
worker saw the 429. Early is not failed: a denial requeues without spending an attempt.

A *daily quota* (``DailyQuota``: SES's ``Max24HourSend``, a plan's 50,000 a day) is a second
GCRA on the same slots, held in the same state, so one ``reserve`` satisfies both at once. Why a
paced bucket and not a counter per calendar day or a log of the last 24 hours: a counter lets
the whole quota go out at 00:01 and leaves the afternoon's password resets nothing; a log costs
memory per send. The bucket holds a *stock* (``burst`` of the quota, a quarter by default) that
may go out at the per-second ceiling, and refills at ``(quota - stock) / window``, so a backlog
spreads over the day, and any window of ``window_s`` (24 h) holds at most ``quota`` sends:
``quota + 1`` slots span at least ``(quota - stock + 1)`` intervals, longer than the window.

When the stock runs low the *yielding* lanes (bulk) give way first: they may not draw it below
``reserve`` of its size, so interactive mail still goes out when the newsletter has used the
day. A yielding lane still gets the refill above the reserve; it is slowed, not stopped. It
books no refill ahead of now (its daily horizon is 0): slots booked for later count against the
stock at once, so a bulk batch booking half a second of refill would leave interactive mail
nothing *now*.
"""

from __future__ import annotations

import abc
import math
import time
from dataclasses import dataclass

from postlane.errors import ConfigurationError

MAX_BATCH = 10_000
"""Most slots one ``reserve`` may ask for: a batch, not a schedule (it bounds the script's loop)."""
UNLIMITED_RATE = 1_000_000.0
"""The per-second rate of a limiter given only a daily quota: slots a microsecond apart, i.e.
no per-second ceiling of its own (the Redis limiter's finest spacing)."""
DAY_S = 86_400.0


@dataclass(frozen=True, slots=True)
class DailyQuota:
    """At most ``quota`` sends in any window of ``window_s`` (a rolling day), spread over it."""

    quota: int
    window_s: float = DAY_S
    """A test compresses the day to seconds; production leaves it at 24 hours."""
    burst: float = 0.25
    """Fraction of the quota that may go out back to back (at the per-second ceiling): the
    stock. The rest is paced evenly over the window. Larger: fewer waits in a peak hour, but a
    backlog uses more of the day early."""
    reserve: float = 0.2
    """Fraction of the stock the yielding lanes may not use: kept for the others."""
    yielding: frozenset[str] = frozenset({"bulk"})
    """Lanes that give way when the stock runs low."""

    def __post_init__(self) -> None:
        if not (isinstance(self.quota, int) and self.quota >= 2):
            raise ConfigurationError(f"daily quota must be an integer >= 2, got {self.quota!r}")
        if not (math.isfinite(self.window_s) and self.window_s > 0):
            raise ConfigurationError(f"quota window must be positive seconds, got "
                                     f"{self.window_s!r}")
        if not (math.isfinite(self.burst) and 0 < self.burst < 1):
            raise ConfigurationError(f"quota burst must be a fraction in (0, 1), got "
                                     f"{self.burst!r}")
        if not (math.isfinite(self.reserve) and 0 <= self.reserve < 1):
            raise ConfigurationError(f"quota reserve must be a fraction in [0, 1), got "
                                     f"{self.reserve!r}")

    @property
    def stock(self) -> int:
        """Sends that may go out back to back: at least one, at most ``quota - 1``."""
        return min(self.quota - 1, max(1, math.floor(self.burst * self.quota)))

    @property
    def reserved(self) -> int:
        """Sends of the stock only the non-yielding lanes may use (fewer than the stock)."""
        return math.floor(self.reserve * self.stock)

    def spacing(self, unit: int) -> tuple[int, int, int]:
        """(interval, tolerance, tolerance of a yielding lane) in ``unit`` ticks per second.

        The interval is rounded up: a tick too long costs nothing, one too short could put
        ``quota + 1`` sends in a window.
        """
        interval = math.ceil(self.window_s * unit / (self.quota - self.stock))
        tau = (self.stock - 1) * interval
        return interval, tau, tau - self.reserved * interval


@dataclass(frozen=True, slots=True)
class Reservation:
    """The slots granted by one ``reserve`` call, relative to the moment the limiter decided."""

    delays_s: list[float]
    """One entry per granted slot: seconds from now at which that send may start.
    Non-decreasing; the first may be 0."""
    retry_in_s: float
    """When fewer slots than asked were granted: seconds until asking again (with the same
    horizon) is worthwhile, i.e. the gate's end or when the next free slot enters the horizon.
    0 when everything asked for was granted."""

    @property
    def granted(self) -> int:
        """How many slots were granted."""
        return len(self.delays_s)


class RateLimiter(abc.ABC):
    """A global send ceiling for one provider account.

    ``reserve`` is atomic across everyone sharing the account, so two workers never get the same
    slot; with ``burst=1`` any two slots are at least ``1/rate`` apart, so no one-second window
    holds more than ``rate`` planned sends.
    """

    rate: float
    """Tokens per second: the ceiling the limiter enforces."""
    burst: int
    """How many tokens may be used back to back (1 = perfectly spaced)."""

    quota: DailyQuota | None
    """The account's daily quota, if it has one."""

    def __init__(self, *, rate: float | None, burst: int = 1,
                 quota: DailyQuota | None = None) -> None:
        self._gate_seen_until = 0.0  # time.monotonic() until which this process saw it shut
        self.set_ceilings(rate=rate, burst=burst, quota=quota)

    def set_ceilings(self, *, rate: float | None, burst: int = 1,
                     quota: DailyQuota | None = None) -> None:
        """Change the ceilings in place (``--rate auto`` follows the provider's account).

        ``rate=None`` means no per-second ceiling (``UNLIMITED_RATE``); then a quota is needed.
        The shared state stays: sends already counted still count.
        """
        if rate is None:
            if quota is None:
                raise ConfigurationError("a limiter needs a rate, a daily quota or both")
            rate = UNLIMITED_RATE
        if not (isinstance(rate, int | float) and math.isfinite(rate) and rate > 0):
            raise ConfigurationError(f"limiter rate must be a positive number, got {rate!r}")
        if not (isinstance(burst, int) and burst >= 1):
            raise ConfigurationError(f"limiter burst must be an integer >= 1, got {burst!r}")
        if quota is not None and not isinstance(quota, DailyQuota):
            raise ConfigurationError(f"limiter quota must be a DailyQuota, got {quota!r}")
        self.rate = float(rate)
        self.burst = burst
        self.quota = quota
        self._ceilings_changed()

    @abc.abstractmethod
    def _ceilings_changed(self) -> None:
        """Recompute what an engine derives from ``rate``, ``burst`` and ``quota``."""

    @abc.abstractmethod
    async def reserve(self, n: int = 1, horizon_s: float = 1.0,
                      lane: str | None = None, *, spend_quota: bool = True) -> Reservation:
        """Atomically reserve up to ``n`` send slots for ``lane``.

        Slots are spaced ``1/rate`` apart and within the daily quota, never in the past and
        never more than ``horizon_s`` ahead of now; fewer than ``n`` are granted when the
        horizon is reached, none while the gate is closed. ``horizon_s=0`` means "only if a
        slot is free right now". A lane the quota names as yielding gets no slot that would
        take the quota's stock below its reserve.

        ``spend_quota=False``: per-second slots only, the daily quota neither consulted nor
        spent. For a send whose unit of the day was spent already by a slot it could not use
        (the pacer's late slot): a fresh slot must not cost the day a second unit.
        """

    @abc.abstractmethod
    async def limit_stock(self, remaining: int) -> None:
        """Let no more than ``remaining`` sends of the daily quota go out now (the provider
        counted sends this limiter did not see: another sender, a restart). Only ever lowers
        the stock; sends this limiter counted already are not counted twice. No-op without a
        quota."""

    @abc.abstractmethod
    async def close_gate(self, until_s_from_now: float) -> None:
        """Close the account's gate for every worker for ``until_s_from_now`` seconds.

        Called on a provider's 429 with ``Retry-After``. Extends an existing closure, never
        shortens it, so a late or duplicate 429 cannot reopen the gate early.
        """

    @abc.abstractmethod
    async def gate_remaining_s(self) -> float:
        """Seconds until the gate opens; 0 when it is open."""

    def gate_seen_s(self) -> float:
        """Seconds the gate is known to stay shut from what this process has seen (its own
        429s and the answers of ``gate_remaining_s``), with no round trip.

        Why: the worker checks the shared gate a little ahead of each slot, and the request
        leaves a few loop iterations later. A 429 answered to another send of this process in
        between must still hold that request back, so the send task reads this, without an
        await, just before it calls the provider. A 429 seen only by another process reaches
        this one at its next gate check: requests already past it are in flight, as on any
        network.
        """
        return max(0.0, self._gate_seen_until - time.monotonic())

    def _saw_gate(self, remaining_s: float) -> None:
        """Remember a gate closure this process closed or was told of (see ``gate_seen_s``)."""
        if remaining_s > 0:
            self._gate_seen_until = max(self._gate_seen_until, time.monotonic() + remaining_s)

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections; the shared state stays (and expires on its own)."""

    async def __aenter__(self) -> RateLimiter:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def check_reserve_args(n: int, horizon_s: float) -> None:
    """Refuse arguments that would make a reservation meaningless (shared by the engines)."""
    if not (isinstance(n, int) and 1 <= n <= MAX_BATCH):
        raise ValueError(f"reserve n must be an integer in 1..{MAX_BATCH}, got {n!r}")
    if not (math.isfinite(horizon_s) and horizon_s >= 0):
        raise ValueError(f"reserve horizon_s must be a finite number >= 0, got {horizon_s!r}")


def check_gate_args(until_s_from_now: float) -> None:
    """Refuse a gate duration that is negative or not a number."""
    if not (math.isfinite(until_s_from_now) and until_s_from_now >= 0):
        raise ValueError(
            f"close_gate needs a finite number of seconds >= 0, got {until_s_from_now!r}"
        )
