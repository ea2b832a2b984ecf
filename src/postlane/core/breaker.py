"""When failures look provider-wide, stop claiming instead of burning every retry budget.

This module is the pure part: a window of recent outcomes that says when to open, and
the shared breaker record (stored as a fleet control) that says what state it is in.
The worker does the I/O (``postlane.worker.breaker``).

Account-level trouble (bad credentials, an unverified sender, no sender) opens the breaker
on the first such answer, without waiting for a window of failures: one answer already says
that every send on the account will fail the same way. The provider's words are kept as the
record's ``cause`` (addresses redacted, bounded) until the breaker closes, so ``postlane
status`` and the dashboard say *why* nothing is sent.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from typing import Any

from postlane.core.redaction import redact_addresses

CONTROL_PREFIX = "breaker:"
CAUSE_LIMIT = 300
"""How much of the provider's answer is kept as the breaker's cause."""


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
    cause: str = ""
    """Account-level trouble in the provider's words (empty for a failure pattern): kept
    through probes and re-opens until the breaker closes."""

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> BreakerRecord:
        return cls(str(value["state"]), float(value["until"]), float(value["cooldown_s"]),
                   value.get("probe_owner"), str(value.get("reason", "")),
                   str(value.get("cause", "")))

    def as_json(self) -> dict[str, Any]:
        return {"state": self.state, "until": self.until, "cooldown_s": self.cooldown_s,
                "probe_owner": self.probe_owner, "reason": self.reason, "cause": self.cause}


def opened(now: float, config: BreakerConfig, reason: str,
           previous: BreakerRecord | None = None) -> BreakerRecord:
    """Open (or re-open after a failed probe, doubling the cool-down up to its cap)."""
    cooldown = config.cooldown_s
    if previous is not None:
        cooldown = min(config.max_cooldown_s, previous.cooldown_s * 2)
    return BreakerRecord("open", now + cooldown, cooldown, None, reason,
                         previous.cause if previous is not None else "")


def account_trouble(now: float, config: BreakerConfig, response: str | None,
                    retry_after_s: float | None = None,
                    previous: BreakerRecord | None = None) -> BreakerRecord:
    """Open for account-level trouble (or re-open after a probe that met it again), with the
    cause recorded; a Retry-After the provider gave is the earliest probe."""
    cause = account_cause(response)
    verb = "probe failed: " if previous is not None else ""
    record = opened(now, config, f"{verb}account trouble: {cause}", previous)
    if retry_after_s is not None and now + retry_after_s > record.until:
        record = replace(record, until=now + retry_after_s)
    return replace(record, cause=cause)


def account_cause(response: str | None) -> str:
    """The provider's answer as a breaker cause: one line, bounded, addresses redacted (an
    SES sandbox names the unverified recipient)."""
    text = " ".join((response or "no detail given").split())
    text = redact_addresses(text)
    return text if len(text) <= CAUSE_LIMIT else text[:CAUSE_LIMIT - 3] + "..."


def abandoned(record: BreakerRecord, now: float) -> BreakerRecord:
    """Re-open after a probe that never reported (its worker died or stalled): due at once,
    cool-down unchanged. A vanished prober says nothing about the provider; doubling here
    would keep the fleet idle for a doubled cool-down (up to two minutes) on top of the
    probe timeout whenever a worker is killed mid-probe."""
    return BreakerRecord("open", now, record.cooldown_s, None, "probe abandoned",
                         record.cause)


def probing(record: BreakerRecord, now: float, owner: str,
            config: BreakerConfig) -> BreakerRecord:
    return BreakerRecord("half_open", now + config.probe_timeout_s, record.cooldown_s, owner,
                         record.reason, record.cause)


def probe_now(record: BreakerRecord, now: float) -> BreakerRecord:
    """An operator's "probe now": the open breaker is due at once (the cause fixed, nobody
    should wait out the cool-down); the next worker to look wins the probe as usual."""
    return replace(record, until=min(record.until, now))
