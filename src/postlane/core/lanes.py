"""Lanes: reserved shares of the worker's send slots, lent when idle, never taken.

A lane owns a floor of ``share * concurrency`` slots. A lane with work may borrow the idle
slots of another only while that lane has no ready work; the moment the owner's work
arrives, no new borrowed send starts, so a bulk burst cannot hold the slots a password
reset needs, and a trickle of urgent mail cannot starve the bulk lane below its floor.

A lane also carries its own patience: how soon a failed send is retried and how long one
attempt may wait for the provider. Someone is waiting for a password reset, so its lane
retries within half a second and gives up on a silent provider after a few seconds; a
digest can wait out a provider's bad minute.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Literal

from postlane.core.durations import parse_duration
from postlane.core.fallback import DEFAULT_FALLBACK, FallbackPolicy, parse_policy
from postlane.errors import ConfigurationError

AmbiguityPolicy = Literal["hold", "resend"]


@dataclass(frozen=True, slots=True)
class LaneConfig:
    name: str
    share: float
    """Fraction of the worker's slots this lane owns (0 < share <= 1)."""
    max_attempts: int = 8
    default_expiry: timedelta | None = None
    """Applied at enqueue when a message brings no expiry of its own."""
    on_ambiguous: AmbiguityPolicy = "hold"
    """When the provider may have accepted and can neither deduplicate nor be asked:
    ``hold`` parks the delivery for an operator; ``resend`` accepts a possible duplicate."""
    retry_base_s: float | None = None
    """Backoff base: the retry after attempt ``k`` waits up to ``base * 2**k`` (full jitter),
    so the first retry comes within ``2 * base``. None: the worker's ``RetryPolicy``."""
    retry_cap_s: float | None = None
    """Longest backoff between two attempts. None: the worker's ``RetryPolicy``."""
    attempt_timeout_s: float | None = None
    """Longest wait for the provider's answer to one attempt; past it the attempt is
    ambiguous. None: the worker's ``attempt_timeout_s``."""
    bulk: bool = False
    """Mail people subscribed to rather than asked for (digests, newsletters): its messages
    carry one-click unsubscribe headers (``core.unsubscribe``). Transactional lanes never
    do. The default ``bulk`` lane is bulk; ``--bulk-lanes`` names others."""
    retry_budget: float = 2 / 3
    """Fraction of a message's validity window (enqueue to expiry) its retries may use: a
    retry that would start later is not made, and the message is dead-lettered
    (``budget_exhausted``) while what is left of the window still lets the user ask again
    (the seed text: "roughly two-thirds of the token lifetime"). Throttled and account
    waits spend no attempt and may use the whole window."""
    sms_fallback: FallbackPolicy = DEFAULT_FALLBACK
    """When a message of this lane that carries an SMS fallback gets it (``core.fallback``)."""


DEFAULT_CONCURRENCY = 200
"""Sends in flight at once per worker, shared by the lanes: twice the claim batch (100), so
the next claim goes on while a batch is sent. The worker, its CLI and ``postlane check``
read it here."""

DEFAULT_LANES: tuple[LaneConfig, ...] = (
    LaneConfig("interactive", 0.7, max_attempts=6, default_expiry=timedelta(minutes=15),
               retry_base_s=0.25, retry_cap_s=30.0, attempt_timeout_s=3.0),
    LaneConfig("bulk", 0.3, max_attempts=8, default_expiry=timedelta(hours=24),
               retry_base_s=1.0, retry_cap_s=300.0, attempt_timeout_s=10.0, bulk=True),
)


def parse_lane_shares(text: str, base: Sequence[LaneConfig] = DEFAULT_LANES) -> list[LaneConfig]:
    """``interactive=70,bulk=30`` -> lane configs (percentages must add up to 100)."""
    by_name = {lane.name: lane for lane in base}
    lanes = []
    for part in text.split(","):
        name, sep, pct = part.strip().partition("=")
        if not sep or not name:
            raise ConfigurationError(f"lane share {part!r} is not NAME=PERCENT")
        try:
            value = float(pct)
        except ValueError:
            raise ConfigurationError(f"lane share {part!r}: {pct!r} is not a number") from None
        if not 0 < value <= 100:
            raise ConfigurationError(f"lane share {part!r} must be in (0, 100]")
        template = by_name.get(name, LaneConfig(name, 0.0))
        lanes.append(replace(template, name=name, share=value / 100))
    check_lanes(lanes)
    return lanes


def parse_lane_durations(text: str, lanes: Sequence[LaneConfig], what: str) -> dict[str, float]:
    """``interactive=3s,bulk=20s`` -> seconds per lane; one bare duration (``10s``) sets every
    lane. ``what`` names the option in errors."""
    if "=" not in text:
        return {name: _positive_seconds(value, what)
                for name, value in per_lane_text(text, lanes, what).items()}
    hint = f"write it as {lanes[0].name}=3s or as one duration for every lane"
    return {name: _positive_seconds(value, f"{what} {name + '=' + value!r}")
            for name, value in per_lane_text(text, lanes, what, hint=hint).items()}


def with_lane_timings(
    lanes: Sequence[LaneConfig], *, attempt_timeout: str | None = None,
    retry_base: str | None = None, retry_cap: str | None = None,
) -> tuple[LaneConfig, ...]:
    """The lanes with per-lane durations given as text (``interactive=3s,bulk=10s``, or one
    duration for every lane) applied, as the command line and configuration file give them."""
    def given(text: str | None, what: str) -> dict[str, float]:
        return parse_lane_durations(text, lanes, what) if text else {}

    timeouts = given(attempt_timeout, "--attempt-timeout")
    bases = given(retry_base, "--retry-base")
    caps = given(retry_cap, "--retry-cap")
    result = tuple(replace(
        lane,
        attempt_timeout_s=timeouts.get(lane.name, lane.attempt_timeout_s),
        retry_base_s=bases.get(lane.name, lane.retry_base_s),
        retry_cap_s=caps.get(lane.name, lane.retry_cap_s),
    ) for lane in lanes)
    for lane in result:
        check_lane_timings(lane)
    return result


def with_bulk_lanes(lanes: Sequence[LaneConfig], names: str) -> tuple[LaneConfig, ...]:
    """The lanes with exactly those named (comma-separated; empty: none) marked bulk."""
    wanted = {n.strip() for n in names.split(",") if n.strip()}
    known = {lane.name for lane in lanes}
    unknown = sorted(wanted - known)
    if unknown:
        raise ConfigurationError(f"--bulk-lanes names {unknown[0]!r}, which is not a "
                                 f"configured lane ({', '.join(sorted(known))})")
    return tuple(replace(lane, bulk=lane.name in wanted) for lane in lanes)


def per_lane_text(text: str, lanes: Sequence[LaneConfig], what: str, *,
                  hint: str | None = None) -> dict[str, str]:
    """``interactive=X,bulk=Y`` -> ``{lane: text}``; one bare value sets every lane. The one
    parser of per-lane options; ``hint`` ends the error for a part that names no lane."""
    names = [lane.name for lane in lanes]
    if "=" not in text:
        return dict.fromkeys(names, text.strip())
    values: dict[str, str] = {}
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep or name.strip() not in names:
            raise ConfigurationError(f"{what} {part.strip()!r} does not name a configured lane "
                                     f"({', '.join(names)})" + (f"; {hint}" if hint else ""))
        values[name.strip()] = value.strip()
    return values


def with_lane_policies(
    lanes: Sequence[LaneConfig], *, retry_budget: str | None = None,
    sms_fallback: str | None = None,
) -> tuple[LaneConfig, ...]:
    """The lanes with ``--retry-budget`` (``interactive=0.5``: the fraction of a message's
    validity window its retries may use) and ``--sms-fallback`` (``interactive=dead+unsent@2m``,
    ``bulk=none``) applied."""
    budgets = per_lane_text(retry_budget, lanes, "--retry-budget") if retry_budget else {}
    fallbacks = per_lane_text(sms_fallback, lanes, "--sms-fallback") if sms_fallback else {}
    result = []
    for lane in lanes:
        budget = lane.retry_budget
        if lane.name in budgets:
            try:
                budget = float(budgets[lane.name])
            except ValueError:
                raise ConfigurationError(f"--retry-budget {lane.name}: "
                                         f"{budgets[lane.name]!r} is not a number") from None
        policy = (parse_policy(fallbacks[lane.name]) if lane.name in fallbacks
                  else lane.sms_fallback)
        result.append(replace(lane, retry_budget=budget, sms_fallback=policy))
        check_retry_budget(result[-1])
    return tuple(result)


def _positive_seconds(text: str, what: str) -> float:
    try:
        seconds = parse_duration(text).total_seconds()
    except ValueError as exc:
        raise ConfigurationError(f"{what}: {exc}") from None
    if seconds <= 0:
        raise ConfigurationError(f"{what}: must be positive")
    return seconds


def check_lanes(lanes: Sequence[LaneConfig]) -> None:
    names = [lane.name for lane in lanes]
    if not lanes:
        raise ConfigurationError("at least one lane is needed")
    if len(set(names)) != len(names):
        raise ConfigurationError(f"lane names repeat: {names}")
    total = sum(lane.share for lane in lanes)
    if abs(total - 1.0) > 1e-6:
        raise ConfigurationError(
            f"lane shares add up to {total * 100:.0f}%, not 100% ({', '.join(names)})"
        )
    for lane in lanes:
        if lane.max_attempts < 1:
            raise ConfigurationError(f"lane {lane.name}: max_attempts must be at least 1")
        check_retry_budget(lane)
        check_lane_timings(lane)


def check_retry_budget(lane: LaneConfig) -> None:
    if not (math.isfinite(lane.retry_budget) and 0 < lane.retry_budget <= 1):
        raise ConfigurationError(f"lane {lane.name}: retry_budget must be a fraction in "
                                 f"(0, 1], got {lane.retry_budget!r}")


def check_lane_timings(lane: LaneConfig) -> None:
    """The lane's own retry base, cap and attempt timeout, where set, are usable."""
    for what in ("retry_base_s", "retry_cap_s", "attempt_timeout_s"):
        value = getattr(lane, what)
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ConfigurationError(f"lane {lane.name}: {what} must be a positive number "
                                     f"of seconds, got {value!r}")
    if (lane.retry_base_s is not None and lane.retry_cap_s is not None
            and lane.retry_cap_s < lane.retry_base_s):
        raise ConfigurationError(f"lane {lane.name}: retry cap {lane.retry_cap_s:g}s is "
                                 f"below its retry base {lane.retry_base_s:g}s")


def slot_floors(lanes: Sequence[LaneConfig], concurrency: int) -> dict[str, int]:
    """Each lane's reserved slots; every lane gets at least one, the total is ``concurrency``."""
    if concurrency < len(lanes):
        raise ConfigurationError(
            f"concurrency {concurrency} is below the number of lanes ({len(lanes)})"
        )
    floors = {lane.name: max(1, int(lane.share * concurrency)) for lane in lanes}
    # Hand out (or take back) the rounding remainder, largest share first.
    ordered = sorted(lanes, key=lambda lane: -lane.share)
    i = 0
    while sum(floors.values()) != concurrency:
        name = ordered[i % len(ordered)].name
        if sum(floors.values()) < concurrency:
            floors[name] += 1
        elif floors[name] > 1:
            floors[name] -= 1
        i += 1
    return floors


def may_start(
    lane: str,
    in_flight: Mapping[str, int],
    floors: Mapping[str, int],
    wanting: Mapping[str, bool],
) -> bool:
    """Whether ``lane`` may start one more send now.

    Within its floor, always. Beyond it, only into a slot of a lane that neither uses it
    nor has work waiting (``wanting``), so a lender gets its floor back at its next send.
    """
    return start_capacity(lane, in_flight, floors, wanting) > 0


def start_capacity(
    lane: str,
    in_flight: Mapping[str, int],
    floors: Mapping[str, int],
    wanting: Mapping[str, bool],
) -> int:
    """How many more sends ``lane`` may start now, by the rule of ``may_start``: what is
    left of its floor, then the other lanes' idle slots it may borrow. What others lend
    does not change as this lane starts sends, so the count is one sum (a worker asks
    before every claim; counting one ``may_start`` at a time cost a batch's worth of
    calls each time)."""
    spare = 0
    for other, floor in floors.items():
        if other == lane:
            continue
        # A slot already lent to a third lane is not idle: it cannot be lent twice.
        spare -= max(0, in_flight.get(other, 0) - floor)
        if wanting.get(other, False):
            continue
        spare += max(0, floor - in_flight.get(other, 0))
    return max(0, floors[lane] + max(0, spare) - in_flight.get(lane, 0))
