"""The shared limiter: one Redis key per provider account, one Lua script per decision.

Every decision reads the clock with Redis ``TIME`` inside the script, so workers on hosts with
skewed clocks still agree on when a slot is, and the read-modify-write is atomic because Redis
runs one script at a time. The script returns delays relative to that shared now; the caller
anchors them at the moment the reply arrives, which is at or after the script ran, so slots err
late, never early.

State, in microseconds of Redis time, is a hash ``<prefix>:<account>`` with ``tat`` (theoretical
arrival time of the next slot), ``dtat`` (the same for the daily quota, see ``base``) and
``gate`` (when a 429 closure ends). The key is PEXPIREd just past the latest of them, so an idle
account leaves nothing behind; an expired key and an idle one mean the same thing.

A Redis failure raises (``redis.exceptions.RedisError``): the limiter fails closed, and the
worker treats it like a denial (requeue without spending an attempt).
"""

from __future__ import annotations

import math
from typing import Any

from postlane.errors import ConfigurationError
from postlane.extras import requires
from postlane.limiter.base import (
    DailyQuota,
    RateLimiter,
    Reservation,
    check_gate_args,
    check_reserve_args,
)

with requires("redis", "the Redis limiter (redis://)"):
    from redis.asyncio import Redis

_US = 1_000_000
MAX_RATE = float(_US)
"""Slots are whole microseconds apart, so one account cannot be limited above 1,000,000/s."""
DEFAULT_KEY_PREFIX = "postlane:limiter"

# Shared preamble: now in microseconds of Redis time. Lua numbers are doubles; integers of
# microseconds since the epoch (~2**51) stay exact.
_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
"""

# KEYS[1] state hash; ARGV: interval_us, tau_us (burst - 1 intervals), n, horizon_us, and for
# the daily quota d_interval_us (0: no quota), d_tau_us (already reduced by the reserve for a
# yielding lane) and d_horizon_us (0 for a yielding lane). Returns {retry_us, delay_us...}.
# The same loop as MemoryLimiter.reserve.
_RESERVE = (
    _NOW
    + """
local interval = tonumber(ARGV[1])
local tau = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local horizon = tonumber(ARGV[4])
local d_interval = tonumber(ARGV[5])
local d_tau = tonumber(ARGV[6])
local d_horizon = tonumber(ARGV[7])
local state = redis.call('HMGET', KEYS[1], 'tat', 'gate', 'dtat')
local gate = tonumber(state[2]) or 0
if gate > now then
  return {gate - now}
end
local tat = tonumber(state[1]) or now
if tat < now then tat = now end
local dtat = tonumber(state[3]) or now
if dtat < now then dtat = now end
local function wait()
  local start = tat - tau
  if start < now then start = now end
  local beyond = start - now - horizon
  if d_interval > 0 then
    local d_start = dtat - d_tau
    if d_start < now then d_start = now end
    if d_start > start then start = d_start end
    beyond = start - now - horizon
    if d_start - now - d_horizon > beyond then beyond = d_start - now - d_horizon end
  end
  return start, beyond
end
local out = {0}
local granted = 0
while granted < n do
  local start, beyond = wait()
  if beyond > 0 then break end
  granted = granted + 1
  out[granted + 1] = start - now
  if start > tat then tat = start end
  tat = tat + interval
  if d_interval > 0 then
    if start > dtat then dtat = start end
    dtat = dtat + d_interval
  end
end
if granted < n then
  local _, beyond = wait()
  out[1] = beyond
end
if granted > 0 then
  local last = tat
  redis.call('HSET', KEYS[1], 'tat', string.format('%.0f', tat))
  if d_interval > 0 then
    redis.call('HSET', KEYS[1], 'dtat', string.format('%.0f', dtat))
    if dtat > last then last = dtat end
  else
    local kept = tonumber(state[3]) or 0
    if kept > last then last = kept end
  end
  if gate > last then last = gate end
  redis.call('PEXPIRE', KEYS[1], math.ceil((last - now) / 1000) + 1000)
end
return out
"""
)

# KEYS[1] state hash; ARGV: d_interval_us, d_tau_us, remaining. Raises dtat so that at most
# ``remaining`` slots of the daily stock are free now; never lowers it.
_LIMIT_STOCK = (
    _NOW
    + """
local d_interval = tonumber(ARGV[1])
local floor = now + tonumber(ARGV[2]) + d_interval - tonumber(ARGV[3]) * d_interval
local state = redis.call('HMGET', KEYS[1], 'tat', 'gate', 'dtat')
local dtat = tonumber(state[3]) or 0
if floor > dtat then
  redis.call('HSET', KEYS[1], 'dtat', string.format('%.0f', floor))
  local last = floor
  local tat = tonumber(state[1]) or 0
  local gate = tonumber(state[2]) or 0
  if tat > last then last = tat end
  if gate > last then last = gate end
  redis.call('PEXPIRE', KEYS[1], math.ceil((last - now) / 1000) + 1000)
end
return 0
"""
)

# KEYS[1] state hash; ARGV: until_us. Extends the gate, never shortens it. Returns gate - now.
_CLOSE_GATE = (
    _NOW
    + """
local state = redis.call('HMGET', KEYS[1], 'tat', 'gate', 'dtat')
local tat = tonumber(state[1]) or 0
local gate = tonumber(state[2]) or 0
local dtat = tonumber(state[3]) or 0
local wanted = now + tonumber(ARGV[1])
if wanted > gate and wanted > now then
  gate = wanted
  redis.call('HSET', KEYS[1], 'gate', string.format('%.0f', gate))
  local last = gate
  if tat > last then last = tat end
  if dtat > last then last = dtat end
  redis.call('PEXPIRE', KEYS[1], math.ceil((last - now) / 1000) + 1000)
end
if gate > now then return gate - now end
return 0
"""
)

# KEYS[1] state hash. Returns microseconds until the gate opens, 0 when open.
_GATE_REMAINING = (
    _NOW
    + """
local gate = tonumber(redis.call('HGET', KEYS[1], 'gate')) or 0
if gate > now then return gate - now end
return 0
"""
)


class RedisLimiter(RateLimiter):
    """GCRA in Redis, shared by every process and host that uses the same key.

    Pass a client you own (``owns_client=False``, the default: ``close`` leaves it open) or use
    ``from_url``. The scripts are registered once here and run by EVALSHA afterwards.
    """

    def __init__(
        self,
        client: Redis,
        *,
        rate: float | None,
        burst: int = 1,
        quota: DailyQuota | None = None,
        account: str = "default",
        key_prefix: str = DEFAULT_KEY_PREFIX,
        owns_client: bool = False,
    ) -> None:
        if not account:
            raise ConfigurationError("limiter account must be a non-empty string")
        super().__init__(rate=rate, burst=burst, quota=quota)
        self.account = account
        self.key = f"{key_prefix}:{account}"
        self._client = client
        self._owns_client = owns_client
        self._reserve = client.register_script(_RESERVE)
        self._close_gate = client.register_script(_CLOSE_GATE)
        self._gate_remaining = client.register_script(_GATE_REMAINING)
        self._limit_stock = client.register_script(_LIMIT_STOCK)

    def _ceilings_changed(self) -> None:
        if self.rate > MAX_RATE:
            raise ConfigurationError(
                f"the Redis limiter spaces slots in whole microseconds; rate {self.rate!r}/s is "
                f"above {MAX_RATE:.0f}/s"
            )
        # Rounded up: never above the ceiling, at most 1 µs per slot below it.
        self._interval_us = math.ceil(_US / self.rate)
        self._tau_us = (self.burst - 1) * self._interval_us
        self._daily = self.quota.spacing(_US) if self.quota is not None else None

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        rate: float | None,
        burst: int = 1,
        quota: DailyQuota | None = None,
        account: str = "default",
        key_prefix: str = DEFAULT_KEY_PREFIX,
    ) -> RedisLimiter:
        """Open a client of our own from ``redis://host:port/db``; ``close`` closes it.

        Socket timeouts are bounded so a stalled Redis becomes an error (a denial), not a
        worker that hangs with a message in hand.
        """
        try:
            client = Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=5.0)
        except ValueError as exc:
            raise ConfigurationError(f"cannot use limiter URL: {exc}") from exc
        # Connections are lazy: if the checks below refuse, nothing was opened.
        return cls(
            client,
            rate=rate,
            burst=burst,
            quota=quota,
            account=account,
            key_prefix=key_prefix,
            owns_client=True,
        )

    async def reserve(self, n: int = 1, horizon_s: float = 1.0,
                      lane: str | None = None, *, spend_quota: bool = True) -> Reservation:
        check_reserve_args(n, horizon_s)
        horizon_us = round(horizon_s * _US)
        d_interval = d_tau = 0
        d_horizon = horizon_us
        if spend_quota and self._daily is not None and self.quota is not None:
            d_interval, d_tau, yielding_tau = self._daily
            if lane in self.quota.yielding:  # see MemoryLimiter.reserve
                d_tau, d_horizon = yielding_tau, 0
        raw: Any = await self._reserve(
            keys=[self.key],
            args=[self._interval_us, self._tau_us, n, horizon_us, d_interval, d_tau, d_horizon],
        )
        values = [int(v) for v in raw]
        return Reservation([v / _US for v in values[1:]], values[0] / _US)

    async def limit_stock(self, remaining: int) -> None:
        if self._daily is None:
            return
        interval, tau, _ = self._daily
        await self._limit_stock(keys=[self.key], args=[interval, tau, max(0, remaining)])

    async def close_gate(self, until_s_from_now: float) -> None:
        check_gate_args(until_s_from_now)
        raw: Any = await self._close_gate(keys=[self.key],
                                          args=[math.ceil(until_s_from_now * _US)])
        self._saw_gate(int(raw) / _US)

    async def gate_remaining_s(self) -> float:
        raw: Any = await self._gate_remaining(keys=[self.key])
        remaining = int(raw) / _US
        self._saw_gate(remaining)
        return remaining

    async def close(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    def __repr__(self) -> str:
        return (f"RedisLimiter(key={self.key!r}, rate={self.rate!r}, burst={self.burst!r}, "
                f"quota={self.quota!r})")
