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
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass

from postlane.errors import ConfigurationError

MAX_BATCH = 10_000
"""Most slots one ``reserve`` may ask for: a batch, not a schedule (it bounds the script's loop)."""


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

    def __init__(self, *, rate: float, burst: int = 1) -> None:
        if not (isinstance(rate, int | float) and math.isfinite(rate) and rate > 0):
            raise ConfigurationError(f"limiter rate must be a positive number, got {rate!r}")
        if not (isinstance(burst, int) and burst >= 1):
            raise ConfigurationError(f"limiter burst must be an integer >= 1, got {burst!r}")
        self.rate = float(rate)
        self.burst = burst

    @abc.abstractmethod
    async def reserve(self, n: int = 1, horizon_s: float = 1.0) -> Reservation:
        """Atomically reserve up to ``n`` send slots.

        Slots are spaced ``1/rate`` apart, never in the past and never more than ``horizon_s``
        ahead of now; fewer than ``n`` are granted when the horizon is reached, none while the
        gate is closed. ``horizon_s=0`` means "only if a slot is free right now".
        """

    @abc.abstractmethod
    async def close_gate(self, until_s_from_now: float) -> None:
        """Close the account's gate for every worker for ``until_s_from_now`` seconds.

        Called on a provider's 429 with ``Retry-After``. Extends an existing closure, never
        shortens it, so a late or duplicate 429 cannot reopen the gate early.
        """

    @abc.abstractmethod
    async def gate_remaining_s(self) -> float:
        """Seconds until the gate opens; 0 when it is open."""

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
