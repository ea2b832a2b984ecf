"""When failures look provider-wide, stop claiming instead of burning every retry budget.

This module is the pure part: a window of recent outcomes that says when to open, and
the shared breaker record (stored as a fleet control) that says what state it is in.
The worker does the I/O (``postlane.worker.breaker``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

CONTROL_PREFIX = "breaker:"


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    window_s: float = 10.0
    min_failures: int = 10
    failure_ratio: float = 0.5
    cooldown_s: float = 5.0
    max_cooldown_s: float = 120.0
    probe_timeout_s: float = 30.0
    probes: int = 3
    """Deliveries sent as one probe: the first accepted closes the breaker, all of them
    failing re-opens it. One alone is a noisy test: a healthy provider that times out 5 % of
    sends failed it one time in twenty and doubled the cool-down (an 80 s pause in the chaos
    run after the outage had ended)."""


class FailureWindow:
    """Outcomes seen in the last ``window_s`` seconds; failures are transient, ambiguous
    and dead-letter arrivals (throttles are not failures)."""

    def __init__(self, config: BreakerConfig) -> None:
        self.config = config
        self._events: deque[tuple[float, bool]] = deque()
        self._failures = 0  # running count, so a decision is O(1) at thousands of sends/s

    def record(self, now: float, failed: bool) -> None:
        self._events.append((now, failed))
        self._failures += failed
        self._trim(now)

    def should_open(self, now: float) -> bool:
        self._trim(now)
        enough = self._failures >= self.config.min_failures
        return enough and self._failures >= self.config.failure_ratio * len(self._events)

    def clear(self) -> None:
        self._events.clear()
        self._failures = 0

    def _trim(self, now: float) -> None:
        horizon = now - self.config.window_s
        while self._events and self._events[0][0] < horizon:
            self._failures -= self._events.popleft()[1]


@dataclass(frozen=True, slots=True)
class BreakerRecord:
    """The fleet-wide state of one account's breaker; absent means closed."""

    state: str  # "open" | "half_open"
    until: float
    """Open: when a probe may be tried. Half-open: when an unfinished probe is abandoned."""
    cooldown_s: float
    probe_owner: str | None = None
    reason: str = ""

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> BreakerRecord:
        return cls(str(value["state"]), float(value["until"]), float(value["cooldown_s"]),
                   value.get("probe_owner"), str(value.get("reason", "")))

    def as_json(self) -> dict[str, Any]:
        return {"state": self.state, "until": self.until, "cooldown_s": self.cooldown_s,
                "probe_owner": self.probe_owner, "reason": self.reason}


def opened(now: float, config: BreakerConfig, reason: str,
           previous: BreakerRecord | None = None) -> BreakerRecord:
    """Open (or re-open after a failed probe, doubling the cool-down up to its cap)."""
    cooldown = config.cooldown_s
    if previous is not None:
        cooldown = min(config.max_cooldown_s, previous.cooldown_s * 2)
    return BreakerRecord("open", now + cooldown, cooldown, None, reason)


def abandoned(record: BreakerRecord, now: float) -> BreakerRecord:
    """Re-open after a probe that never reported (its worker died or stalled): due at once,
    cool-down unchanged. A vanished prober says nothing about the provider; doubling here
    would keep the fleet idle for a doubled cool-down (up to two minutes) on top of the
    probe timeout whenever a worker is killed mid-probe."""
    return BreakerRecord("open", now, record.cooldown_s, None, "probe abandoned")


def probing(record: BreakerRecord, now: float, owner: str,
            config: BreakerConfig) -> BreakerRecord:
    return BreakerRecord("half_open", now + config.probe_timeout_s, record.cooldown_s, owner,
                         record.reason)
