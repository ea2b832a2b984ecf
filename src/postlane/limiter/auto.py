"""``--rate auto``: the ceilings read from the provider's account, and kept up to date.

SES raises an account's limits as its reputation grows (and may lower them); a ceiling typed
into a config file is wrong the day after. The worker reads the account once before it starts
(so a provider that cannot say is a clear error at start, not a silent "no limit") and then
every ``REFRESH_S``; a failed refresh keeps the last limits, since a wrong-but-recent ceiling is
better than none.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from postlane.errors import ConfigurationError
from postlane.limiter.base import UNLIMITED_RATE, DailyQuota, RateLimiter

log = logging.getLogger("postlane.limiter")

REFRESH_S = 300.0
"""How often the account's limits are read again: SES changes them in hours, not seconds."""


@dataclass(frozen=True, slots=True)
class AccountLimits:
    """What a provider says about its account (SESv2 ``GetAccount``'s ``SendQuota``)."""

    max_send_rate: float | None
    """Sends per second; None when the provider sets none."""
    max_24h_send: int | None
    """Sends in any 24 hours; None when unlimited (SES says -1)."""
    sent_last_24h: int | None = None
    """What the account sent in the last 24 hours, by anyone: the daily stock is never more
    than the quota less this."""


@dataclass(frozen=True, slots=True)
class QuotaShape:
    """How a daily quota read from the provider is spent (``--quota-burst``,
    ``--quota-reserve``)."""

    burst: float = 0.25
    reserve: float = 0.2

    def __post_init__(self) -> None:
        DailyQuota(2, burst=self.burst, reserve=self.reserve)  # refuses what it would refuse


def ceilings_of(limits: AccountLimits, *, headroom: float,
                shape: QuotaShape) -> tuple[float | None, DailyQuota | None]:
    """The limiter's (rate, quota) for an account. The headroom applies to the per-second rate
    only: it absorbs timing jitter, and a daily count has none."""
    rate = None
    if limits.max_send_rate is not None and limits.max_send_rate > 0:
        rate = limits.max_send_rate * (1 - headroom)
    quota = None
    if limits.max_24h_send is not None and limits.max_24h_send >= 2:
        quota = DailyQuota(limits.max_24h_send, burst=shape.burst, reserve=shape.reserve)
    if rate is None and quota is None:
        raise ConfigurationError("--rate auto: the provider reports no limit for this account; "
                                 "give the ceiling explicitly, e.g. --rate 200/s")
    return rate, quota


async def apply_limits(limiter: RateLimiter, limits: AccountLimits, *, headroom: float,
                       shape: QuotaShape) -> None:
    """Set the limiter's ceilings from the account's, logging what changed, and let no more of
    the daily stock go now than the account has left (it counts sends this limiter did not
    see: a restart of an in-process limiter, another sender)."""
    rate, quota = ceilings_of(limits, headroom=headroom, shape=shape)
    if not (math.isclose(limiter.rate, rate or UNLIMITED_RATE) and limiter.quota == quota):
        limiter.set_ceilings(rate=rate, burst=limiter.burst, quota=quota)
        log.info("provider account limits: %s/s, %s per 24 h (sent in the last 24 h: %s); "
                 "limiter now %.4g/s%s", limits.max_send_rate, limits.max_24h_send,
                 limits.sent_last_24h, limiter.rate,
                 f", {quota.quota} per 24 h" if quota else "")
    if quota is not None and limits.max_24h_send and limits.sent_last_24h is not None:
        await limiter.limit_stock(limits.max_24h_send - limits.sent_last_24h)


async def follow_limits(
    limiter: RateLimiter,
    read: Callable[[], Awaitable[AccountLimits]],
    *,
    headroom: float,
    shape: QuotaShape = QuotaShape(),
    every_s: float = REFRESH_S,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> None:
    """Read the account's limits every ``every_s`` and apply them, until cancelled."""
    while True:
        await sleep(every_s)
        try:
            await apply_limits(limiter, await read(), headroom=headroom, shape=shape)
        except Exception as exc:  # the provider's API is down: keep the last limits
            log.warning("could not refresh the provider account's limits (%s: %s); "
                        "keeping %.4g/s%s", type(exc).__name__, exc, limiter.rate,
                        f", {limiter.quota.quota} per 24 h" if limiter.quota else "")


__all__ = ["REFRESH_S", "AccountLimits", "QuotaShape", "apply_limits", "ceilings_of",
           "follow_limits"]
