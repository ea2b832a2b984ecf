"""The retry policy as pure decisions: outcome + delivery + lane + clock -> next state.

No I/O and no hidden randomness: the clock and the random source are arguments, so every
row of the seed texts' failure table is a unit test.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

from postlane.core.causes import cause_of
from postlane.core.fastinit import frozen_init
from postlane.core.lanes import LaneConfig
from postlane.core.message import Delivery
from postlane.core.outcomes import Outcome, OutcomeClass
from postlane.core.states import DeadReason, State


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """The worker-wide backoff; a lane that sets its own base or cap overrides it
    (``lane_policy``)."""

    base_s: float = 1.0
    cap_s: float = 300.0
    throttle_default_s: float = 1.0
    """Delay after a 429 that named no Retry-After (jittered like any backoff)."""


def lane_policy(lane: LaneConfig, policy: RetryPolicy) -> RetryPolicy:
    """The backoff ``lane`` retries with: its own base and cap where it sets them, so a reset
    is retried within a second while a digest backs off for minutes."""
    if lane.retry_base_s is None and lane.retry_cap_s is None:
        return policy
    return RetryPolicy(
        base_s=policy.base_s if lane.retry_base_s is None else lane.retry_base_s,
        cap_s=policy.cap_s if lane.retry_cap_s is None else lane.retry_cap_s,
        throttle_default_s=policy.throttle_default_s,
    )


@dataclass(frozen=True, slots=True)
class ProviderTraits:
    """What the policy needs to know of the provider (a subset of its capabilities)."""

    deduplicates_by_key: bool = False
    dedup_window: timedelta | None = None
    can_lookup_by_key: bool = False


@frozen_init
@dataclass(frozen=True, slots=True)
class Decision:
    state: State
    event: str
    spend_attempt: bool = True
    delay_s: float | None = None
    dead_reason: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


def backoff_s(attempt: int, policy: RetryPolicy, rand: Callable[[], float]) -> float:
    """Full jitter: ``uniform(0, min(cap, base * 2**attempt))``; ``rand`` returns [0, 1)."""
    ceiling = min(policy.cap_s, policy.base_s * float(2 ** min(attempt, 60)))
    return float(rand() * ceiling)


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """Retry-After as seconds from ``now``: delta-seconds or an HTTP date; None if unusable."""
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        return max(0.0, (when - now).total_seconds())
    if not math.isfinite(seconds) or seconds < 0:  # NaN, inf ("1e999") or negative
        return None
    return seconds


def effective_expiry(delivery: Delivery, lane: LaneConfig | None) -> datetime | None:
    """The message's own expiry, else its lane's default counted from enqueue: a message that
    names no validity window still has a retry budget bounded by its usefulness."""
    if delivery.expires_at is not None:
        return delivery.expires_at
    if lane is not None and lane.default_expiry is not None:
        return delivery.created_at + lane.default_expiry
    return None


def expire_if_useless(delivery: Delivery, now: datetime,
                      lane: LaneConfig | None = None) -> Decision | None:
    """Before a send: a message past its validity window is not sent at all."""
    expires_at = effective_expiry(delivery, lane)
    if expires_at is not None and now >= expires_at:
        return Decision(State.EXPIRED, "expired", spend_attempt=False,
                        dead_reason=DeadReason.EXPIRED,
                        detail={"why": "past expires_at before sending"})
    return None


def decide(
    delivery: Delivery,
    outcome: Outcome,
    lane: LaneConfig,
    now: datetime,
    *,
    traits: ProviderTraits = ProviderTraits(),
    policy: RetryPolicy = RetryPolicy(),
    rand: Callable[[], float] = random.random,
) -> Decision:
    """The next state of ``delivery`` after ``outcome``. ``delivery.attempts`` counts
    attempts *before* this one. ``policy`` is the worker-wide backoff; the lane's own base
    and cap win over it."""
    detail: dict[str, Any] = {"outcome": str(outcome.kind), "attempt": delivery.attempts + 1}
    if outcome.response is not None:
        detail["response"] = outcome.response[:500]
    if outcome.phase is not None:
        detail["phase"] = str(outcome.phase)
    kind = outcome.kind

    if kind is OutcomeClass.ACCEPTED:
        return Decision(State.SENT, "sent", detail=detail)

    if kind is OutcomeClass.PERMANENT and outcome.retry_after_s is None:
        detail["cause"] = str(cause_of(DeadReason.PERMANENT, outcome.response, outcome.cause))
        return Decision(State.DEAD, "dead_lettered", dead_reason=DeadReason.PERMANENT,
                        detail=detail)

    policy = lane_policy(lane, policy)  # only a requeue needs it (not the common "sent")
    if kind in (OutcomeClass.THROTTLED, OutcomeClass.PERMANENT, OutcomeClass.ACCOUNT):
        # Early is not failed: no attempt spent; the provider's Retry-After wins. A refusal
        # that names a Retry-After says "later", not "never". Account-level trouble is not
        # the message's fault: it waits, unspent, while the breaker holds the fleet.
        detail["attempt"] = delivery.attempts
        delay = outcome.retry_after_s
        if delay is None:
            delay = backoff_s(1, RetryPolicy(policy.throttle_default_s, policy.cap_s), rand)
        event = "account_trouble" if kind is OutcomeClass.ACCOUNT else "throttled"
        return _requeue(delivery, lane, now, delay, event, spend=False, detail=detail)

    attempts_after = delivery.attempts + 1

    if kind is OutcomeClass.AMBIGUOUS:
        if traits.deduplicates_by_key and _within_dedup_window(delivery, now, traits):
            return _retry(delivery, attempts_after, now, outcome, lane, policy, rand,
                          "ambiguous_retry", detail)
        if traits.can_lookup_by_key:
            return Decision(State.AMBIGUOUS, "ambiguous", detail={**detail,
                            "resolution": "reconcile by lookup"})
        if lane.on_ambiguous == "resend":
            return _retry(delivery, attempts_after, now, outcome, lane, policy, rand,
                          "ambiguous_resend", detail)
        return Decision(State.AMBIGUOUS, "ambiguous",
                        detail={**detail, "resolution": "held for an operator"})

    # TRANSIENT
    return _retry(delivery, attempts_after, now, outcome, lane, policy, rand,
                  "retry_scheduled", detail)


def handler_error(delivery: Delivery, traceback_text: str) -> Decision:
    """An exception inside the worker or adapter: a bug, not a provider answer."""
    return Decision(State.DEAD, "dead_lettered", dead_reason=DeadReason.HANDLER_ERROR,
                    detail={"outcome": "handler_error", "attempt": delivery.attempts + 1,
                            "traceback": traceback_text[-1500:]})


def _retry(
    delivery: Delivery, attempts_after: int, now: datetime, outcome: Outcome,
    lane: LaneConfig, policy: RetryPolicy, rand: Callable[[], float], event: str,
    detail: dict[str, Any],
) -> Decision:
    if attempts_after >= lane.max_attempts:
        return Decision(State.DEAD, "dead_lettered", dead_reason=DeadReason.BUDGET_EXHAUSTED,
                        detail={**detail, "max_attempts": lane.max_attempts})
    delay = outcome.retry_after_s
    if delay is None:
        delay = backoff_s(attempts_after, policy, rand)
    budget_end = retry_budget_end(delivery, lane)
    expires_at = effective_expiry(delivery, lane)
    seconds_left = None if budget_end is None else (budget_end - now).total_seconds()
    if (seconds_left is not None and delay > seconds_left and expires_at is not None
            and delay < (expires_at - now).total_seconds()):
        # Past the retry budget but still within the validity window: stop while the reader
        # can still ask for a fresh message (past the window it simply expires, below).
        return Decision(State.DEAD, "dead_lettered", dead_reason=DeadReason.BUDGET_EXHAUSTED,
                        detail={**detail, "why": "the next attempt would start after the "
                                f"retry budget ({lane.retry_budget:.0%} of the validity window)",
                                "delay_s": round(delay, 3),
                                "retry_budget_ends": budget_end.isoformat()
                                if budget_end is not None else None})
    return _requeue(delivery, lane, now, delay, event, spend=True, detail=detail)


def retry_budget_end(delivery: Delivery, lane: LaneConfig) -> datetime | None:
    """When retries must stop: ``lane.retry_budget`` of the validity window, counted from
    enqueue. None for a message without an expiry (only the attempt cap bounds it)."""
    expires_at = effective_expiry(delivery, lane)
    if expires_at is None:
        return None
    return delivery.created_at + (expires_at - delivery.created_at) * lane.retry_budget


def _requeue(
    delivery: Delivery, lane: LaneConfig, now: datetime, delay: float, event: str, *,
    spend: bool, detail: dict[str, Any],
) -> Decision:
    expires_at = effective_expiry(delivery, lane)
    # Compared in seconds: ``now + timedelta(delay)`` overflows for an absurd Retry-After.
    if expires_at is not None and delay >= (expires_at - now).total_seconds():
        return Decision(State.EXPIRED, "expired", spend_attempt=spend,
                        dead_reason=DeadReason.EXPIRED,
                        detail={**detail, "why": "the next attempt would land after expires_at",
                                "delay_s": round(delay, 3)})
    return Decision(State.PENDING, event, spend_attempt=spend, delay_s=delay,
                    detail={**detail, "delay_s": round(delay, 3)})


def _within_dedup_window(delivery: Delivery, now: datetime, traits: ProviderTraits) -> bool:
    if traits.dedup_window is None:
        return True
    return now - delivery.created_at < traits.dedup_window
