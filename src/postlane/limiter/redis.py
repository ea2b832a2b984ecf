"""The shared limiter: one Redis key per provider account, one Lua script per decision.

Every decision reads the clock with Redis ``TIME`` inside the script, so workers on hosts with
skewed clocks still agree on when a slot is, and the read-modify-write is atomic because Redis
runs one script at a time. The script returns delays relative to that shared now; the caller
anchors them at the moment the reply arrives, which is at or after the script ran, so slots err
late, never early.

State, in microseconds of Redis time, is a hash ``<prefix>:<account>`` with ``tat`` (theoretical
arrival time of the next slot) and ``gate`` (when a 429 closure ends). The key is PEXPIREd just
past the later of the two, so an idle account leaves nothing behind; an expired key and an idle
one mean the same thing.

A Redis failure raises (``redis.exceptions.RedisError``): the limiter fails closed, and the
worker treats it like a denial (requeue without spending an attempt).
"""

from __future__ import annotations

import math
from typing import Any

from postlane.errors import ConfigurationError
from postlane.extras import requires
from postlane.limiter.base import RateLimiter, Reservation, check_gate_args, check_reserve_args

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

# KEYS[1] state hash; ARGV: interval_us, tau_us (burst - 1 intervals), n, horizon_us.
# Returns {retry_us, delay_us...}.
_RESERVE = (
    _NOW
    + """
local interval = tonumber(ARGV[1])
local tau = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local horizon = tonumber(ARGV[4])
local state = redis.call('HMGET', KEYS[1], 'tat', 'gate')
local gate = tonumber(state[2]) or 0
if gate > now then
  return {gate - now}
end
local tat = tonumber(state[1]) or now
if tat < now then tat = now end
local out = {0}
local granted = 0
while granted < n do
  local start = tat - tau
  if start < now then start = now end
  if start - now > horizon then break end
  granted = granted + 1
  out[granted + 1] = start - now
  tat = tat + interval
end
if granted < n then
  local start = tat - tau
  if start < now then start = now end
  out[1] = start - now - horizon
end
if granted > 0 then
  redis.call('HSET', KEYS[1], 'tat', string.format('%.0f', tat))
  redis.call('PEXPIRE', KEYS[1], math.ceil((tat - now) / 1000) + 1000)
end
return out
"""
)

# KEYS[1] state hash; ARGV: until_us. Extends the gate, never shortens it. Returns gate - now.
_CLOSE_GATE = (
    _NOW
    + """
local state = redis.call('HMGET', KEYS[1], 'tat', 'gate')
local tat = tonumber(state[1]) or 0
local gate = tonumber(state[2]) or 0
local wanted = now + tonumber(ARGV[1])
if wanted > gate and wanted > now then
  gate = wanted
  redis.call('HSET', KEYS[1], 'gate', string.format('%.0f', gate))
  local last = gate
  if tat > last then last = tat end
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
    ``from_url``. The three scripts are registered once here and run by EVALSHA afterwards.
    """

    def __init__(
        self,
        client: Redis,
        *,
        rate: float,
        burst: int = 1,
        account: str = "default",
        key_prefix: str = DEFAULT_KEY_PREFIX,
        owns_client: bool = False,
    ) -> None:
        super().__init__(rate=rate, burst=burst)
        if self.rate > MAX_RATE:
            raise ConfigurationError(
                f"the Redis limiter spaces slots in whole microseconds; rate {rate!r}/s is above "
                f"{MAX_RATE:.0f}/s"
            )
        if not account:
            raise ConfigurationError("limiter account must be a non-empty string")
        self.account = account
        self.key = f"{key_prefix}:{account}"
        self._client = client
        self._owns_client = owns_client
        # Rounded up: never above the ceiling, at most 1 µs per slot below it.
        self._interval_us = math.ceil(_US / self.rate)
        self._tau_us = (self.burst - 1) * self._interval_us
        self._reserve = client.register_script(_RESERVE)
        self._close_gate = client.register_script(_CLOSE_GATE)
        self._gate_remaining = client.register_script(_GATE_REMAINING)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        rate: float,
        burst: int = 1,
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
            account=account,
            key_prefix=key_prefix,
            owns_client=True,
        )

    async def reserve(self, n: int = 1, horizon_s: float = 1.0) -> Reservation:
        check_reserve_args(n, horizon_s)
        raw: Any = await self._reserve(
            keys=[self.key],
            args=[self._interval_us, self._tau_us, n, round(horizon_s * _US)],
        )
        values = [int(v) for v in raw]
        return Reservation([v / _US for v in values[1:]], values[0] / _US)

    async def close_gate(self, until_s_from_now: float) -> None:
        check_gate_args(until_s_from_now)
        await self._close_gate(keys=[self.key], args=[math.ceil(until_s_from_now * _US)])

    async def gate_remaining_s(self) -> float:
        raw: Any = await self._gate_remaining(keys=[self.key])
        return int(raw) / _US

    async def close(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    def __repr__(self) -> str:
        return f"RedisLimiter(key={self.key!r}, rate={self.rate!r}, burst={self.burst!r})"
