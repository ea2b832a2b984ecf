"""The pure retry policy: every row of the queueing text's failure table as a Decision.

No I/O: the clock (``now``) and the random source (``rand``) are arguments.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from postlane.core.lanes import DEFAULT_LANES, LaneConfig, check_lanes
from postlane.core.message import Delivery
from postlane.core.outcomes import Outcome, OutcomeClass, Phase
from postlane.core.policy import (
    Decision,
    ProviderTraits,
    RetryPolicy,
    backoff_s,
    decide,
    expire_if_useless,
    handler_error,
    lane_policy,
    parse_retry_after,
)
from postlane.core.states import DeadReason, State
from postlane.errors import ConfigurationError

NOW = datetime(2026, 3, 2, 12, 0, 0, tzinfo=UTC)
HOLD = LaneConfig("interactive", 0.7, max_attempts=6, on_ambiguous="hold")
RESEND = LaneConfig("bulk", 0.3, max_attempts=8, on_ambiguous="resend")
POLICY = RetryPolicy(base_s=1.0, cap_s=300.0, throttle_default_s=1.0)

NO_DEDUPE = ProviderTraits(deduplicates_by_key=False, can_lookup_by_key=False)
DEDUPE = ProviderTraits(deduplicates_by_key=True, dedup_window=timedelta(hours=24))
LOOKUP = ProviderTraits(deduplicates_by_key=False, can_lookup_by_key=True)


def delivery(**overrides: Any) -> Delivery:
    fields: dict[str, Any] = {
        "id": 7, "key": "reset:tok-1", "lane": "interactive", "channel": "email",
        "recipient": "alice@example.com", "sender": None, "subject": "Reset",
        "text": "Follow the link.", "html": None, "headers": {}, "metadata": {},
        "import_id": None, "template_id": None, "template_version": None,
        "state": State.SENDING, "attempts": 0, "claims": 1, "run_at": NOW,
        "expires_at": None, "lease_owner": "w1", "lease_expires_at": NOW + timedelta(30),
        "attempt_started_at": NOW, "provider_message_id": None, "dead_reason": None,
        "last_error": None, "created_at": NOW - timedelta(seconds=5), "updated_at": NOW,
        "sent_at": None, "finished_at": None,
    }
    fields.update(overrides)
    return Delivery(**fields)


def fixed(value: float) -> Any:
    """A random source that always answers ``value`` and counts its calls."""
    def rand() -> float:
        rand.calls += 1  # type: ignore[attr-defined]
        return value
    rand.calls = 0  # type: ignore[attr-defined]
    return rand


def check(decision: Decision, state: State, event: str, *, spend: bool,
          delay: float | None, reason: str | None) -> None:
    assert (decision.state, decision.event, decision.spend_attempt, decision.dead_reason) == (
        state, event, spend, reason)
    if delay is None:
        assert decision.delay_s is None
    else:
        assert decision.delay_s == pytest.approx(delay)


# -- backoff -----------------------------------------------------------------------------
@given(attempt=st.integers(0, 200), r=st.floats(0.0, 1.0, exclude_max=True),
       base=st.floats(0.001, 100.0), cap=st.floats(0.001, 10_000.0))
def test_backoff_is_full_jitter_below_the_capped_exponential(
    attempt: int, r: float, base: float, cap: float
) -> None:
    policy = RetryPolicy(base_s=base, cap_s=cap)
    ceiling = min(cap, base * 2.0 ** min(attempt, 60))
    value = backoff_s(attempt, policy, lambda: r)
    assert 0.0 <= value < ceiling
    assert value == pytest.approx(r * ceiling)


def test_backoff_uses_the_injected_random_source_once_per_call() -> None:
    rand = fixed(0.5)
    assert backoff_s(3, POLICY, rand) == pytest.approx(0.5 * 8.0)
    assert rand.calls == 1
    assert backoff_s(0, POLICY, fixed(0.0)) == 0.0
    # Capped: 2**20 seconds is far beyond five minutes.
    assert backoff_s(20, POLICY, fixed(0.5)) == pytest.approx(150.0)
    # A sequence of random values gives that sequence of delays.
    values = iter([0.1, 0.9, 0.25])
    delays = [backoff_s(2, POLICY, lambda: next(values)) for _ in range(3)]
    assert delays == pytest.approx([0.4, 3.6, 1.0])


def test_backoff_does_not_overflow_for_absurd_attempt_numbers() -> None:
    assert backoff_s(10_000, POLICY, fixed(0.5)) == pytest.approx(150.0)


# -- Retry-After -------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "expected"), [
    ("120", 120.0), (" 5 ", 5.0), ("0", 0.0), ("1.5", 1.5),
])
def test_retry_after_in_seconds(value: str, expected: float) -> None:
    assert parse_retry_after(value, NOW) == expected


def test_retry_after_as_an_http_date() -> None:
    assert parse_retry_after("Mon, 02 Mar 2026 12:01:30 GMT", NOW) == pytest.approx(90.0)
    assert parse_retry_after("Mon, 02 Mar 2026 12:00:00 GMT", NOW) == 0.0


def test_retry_after_in_the_past_is_zero() -> None:
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", NOW) == 0.0
    assert parse_retry_after("Mon, 02 Mar 2026 11:59:59 GMT", NOW) == 0.0


@pytest.mark.parametrize("value", [
    None, "", "   ", "soon", "-5", "nan", "NaN", "inf", "Infinity", "-inf", "1e999",
    "Mon, 99 Foo 2026 12:00:00 GMT", "12:00:00", "tomorrow at noon",
])
def test_retry_after_garbage_is_none(value: str | None) -> None:
    assert parse_retry_after(value, NOW) is None


# -- the failure table -------------------------------------------------------------------
def test_accepted_is_sent() -> None:
    d = decide(delivery(), Outcome.accepted("esp-1", "250 OK"), HOLD, NOW)
    check(d, State.SENT, "sent", spend=True, delay=None, reason=None)


def test_429_with_retry_after_requeues_at_the_stated_delay_without_spending() -> None:
    rand = fixed(0.5)
    outcome = Outcome.throttled(30.0, "429 Too Many Requests")
    d = decide(delivery(attempts=2), outcome, HOLD, NOW, policy=POLICY, rand=rand)
    check(d, State.PENDING, "throttled", spend=False, delay=30.0, reason=None)
    assert rand.calls == 0  # the provider's number wins, no jitter
    assert d.detail["attempt"] == 2  # not counted as an attempt
    assert d.detail["response"] == "429 Too Many Requests"


def test_429_never_exhausts_the_budget() -> None:
    # On the last allowed attempt a 429 still requeues: being early is not failing.
    d = decide(delivery(attempts=HOLD.max_attempts - 1), Outcome.throttled(2.0), HOLD, NOW)
    check(d, State.PENDING, "throttled", spend=False, delay=2.0, reason=None)


def test_429_without_retry_after_backs_off_from_the_throttle_default() -> None:
    policy = RetryPolicy(base_s=10.0, cap_s=300.0, throttle_default_s=3.0)
    rand = fixed(0.5)
    d = decide(delivery(), Outcome.throttled(None), HOLD, NOW, policy=policy, rand=rand)
    # Jittered within [0, 2 * throttle_default) (backoff at attempt 1), not the retry base.
    check(d, State.PENDING, "throttled", spend=False, delay=3.0, reason=None)
    assert rand.calls == 1


@pytest.mark.parametrize("attempts", [0, 1, 3])
def test_503_backs_off_with_jitter_and_spends_an_attempt(attempts: int) -> None:
    rand = fixed(0.25)
    d = decide(delivery(attempts=attempts), Outcome.transient("503 Service Unavailable"),
               HOLD, NOW, policy=POLICY, rand=rand)
    ceiling = min(POLICY.cap_s, POLICY.base_s * 2 ** (attempts + 1))
    check(d, State.PENDING, "retry_scheduled", spend=True, delay=0.25 * ceiling, reason=None)
    assert rand.calls == 1
    assert d.detail["attempt"] == attempts + 1


def test_503_with_retry_after_uses_it_and_still_spends() -> None:
    d = decide(delivery(), Outcome.transient("503", retry_after_s=12.0), HOLD, NOW,
               rand=fixed(0.9))
    check(d, State.PENDING, "retry_scheduled", spend=True, delay=12.0, reason=None)


def test_jitter_spreads_retries_of_the_same_attempt() -> None:
    values = itertools.cycle([0.05, 0.5, 0.95])
    delays = {decide(delivery(attempts=2), Outcome.transient("503"), HOLD, NOW,
                     policy=POLICY, rand=lambda: next(values)).delay_s for _ in range(3)}
    assert len(delays) == 3
    assert all(d is not None and 0 <= d < 8.0 for d in delays)


def test_timeout_with_a_deduplicating_provider_retries_with_the_same_key() -> None:
    d = decide(delivery(attempts=1), Outcome.ambiguous("read timeout"), HOLD, NOW,
               traits=DEDUPE, policy=POLICY, rand=fixed(0.5))
    check(d, State.PENDING, "ambiguous_retry", spend=True, delay=0.5 * 4.0, reason=None)


def test_timeout_past_the_providers_dedup_window_is_not_retried_blindly() -> None:
    traits = ProviderTraits(deduplicates_by_key=True, dedup_window=timedelta(minutes=1))
    old = delivery(created_at=NOW - timedelta(minutes=5))
    d = decide(old, Outcome.ambiguous("read timeout"), HOLD, NOW, traits=traits)
    check(d, State.AMBIGUOUS, "ambiguous", spend=True, delay=None, reason=None)
    assert d.detail["resolution"] == "held for an operator"
    # Within the window it is retried.
    young = delivery(created_at=NOW - timedelta(seconds=10))
    assert decide(young, Outcome.ambiguous(), HOLD, NOW, traits=traits).state is State.PENDING


def test_timeout_without_dedupe_or_lookup_is_held_under_lane_policy_hold() -> None:
    d = decide(delivery(), Outcome.ambiguous("read timeout"), HOLD, NOW, traits=NO_DEDUPE)
    check(d, State.AMBIGUOUS, "ambiguous", spend=True, delay=None, reason=None)
    assert d.detail["resolution"] == "held for an operator"
    assert d.detail["response"] == "read timeout"


@pytest.mark.parametrize("outcome", [
    Outcome.transient("not sent: no answer within 10s", phase=Phase.ENVELOPE),
    Outcome.ambiguous("no answer within 10s after the request left", phase=Phase.RESPONSE),
    Outcome.accepted("m-1").at(Phase.RESPONSE),
])
def test_the_decision_names_the_phase_the_attempt_ended_in(outcome: Outcome) -> None:
    d = decide(delivery(), outcome, HOLD, NOW, traits=NO_DEDUPE, rand=fixed(0.5))
    assert d.detail["phase"] == str(outcome.phase)


def test_no_phase_no_phase_in_the_detail() -> None:
    d = decide(delivery(), Outcome.ambiguous("read timeout"), HOLD, NOW, traits=NO_DEDUPE)
    assert "phase" not in d.detail


def test_timeout_without_dedupe_or_lookup_is_resent_under_lane_policy_resend() -> None:
    d = decide(delivery(lane="bulk"), Outcome.ambiguous("read timeout"), RESEND, NOW,
               traits=NO_DEDUPE, policy=POLICY, rand=fixed(0.5))
    check(d, State.PENDING, "ambiguous_resend", spend=True, delay=1.0, reason=None)


def test_timeout_with_a_lookup_capable_provider_goes_to_reconciliation() -> None:
    for lane in (HOLD, RESEND):
        d = decide(delivery(), Outcome.ambiguous("read timeout"), lane, NOW, traits=LOOKUP)
        check(d, State.AMBIGUOUS, "ambiguous", spend=True, delay=None, reason=None)
        assert d.detail["resolution"] == "reconcile by lookup"


def test_ambiguous_retry_respects_the_budget() -> None:
    d = decide(delivery(attempts=HOLD.max_attempts - 1), Outcome.ambiguous(), HOLD, NOW,
               traits=DEDUPE)
    check(d, State.DEAD, "dead_lettered", spend=True, delay=None,
          reason=DeadReason.BUDGET_EXHAUSTED)


@pytest.mark.parametrize("response", [
    "400 Bad Request: malformed address 'bob@@example'",
    "404 Not Found: template welcome-v3 does not exist",
])
def test_400_and_404_dead_letter_at_once_as_permanent(response: str) -> None:
    rand = fixed(0.5)
    d = decide(delivery(attempts=0), Outcome.permanent(response), HOLD, NOW, rand=rand)
    check(d, State.DEAD, "dead_lettered", spend=True, delay=None,
          reason=DeadReason.PERMANENT)
    assert d.detail["response"] == response
    assert rand.calls == 0


@pytest.mark.parametrize("attempts", [0, 5, 50])
def test_a_refusal_with_retry_after_is_retried_then_and_never_dead_lettered(
    attempts: int,
) -> None:
    """A 4xx that names a Retry-After says "later": requeued at that time, unspent, even
    on the last attempt of the budget."""
    rand = fixed(0.5)
    refusal = Outcome(OutcomeClass.PERMANENT, retry_after_s=12.0, response="400 busy")
    d = decide(delivery(attempts=attempts), refusal, HOLD, NOW, rand=rand)
    check(d, State.PENDING, "throttled", spend=False, delay=12.0, reason=None)
    assert rand.calls == 0


@pytest.mark.parametrize(("retry_after", "delay"), [(None, 0.5), (30.0, 30.0)])
@pytest.mark.parametrize("attempts", [0, 5, 50])
def test_account_trouble_requeues_without_spending_an_attempt(
    attempts: int, retry_after: float | None, delay: float,
) -> None:
    """Bad credentials or an unverified sender are not the message's fault: it waits,
    unspent, however many attempts it has behind it (the breaker holds the fleet)."""
    d = decide(delivery(attempts=attempts), Outcome.account("535 bad credentials",
                                                            retry_after), HOLD, NOW,
               policy=POLICY, rand=fixed(0.25))
    check(d, State.PENDING, "account_trouble", spend=False, delay=delay, reason=None)
    assert d.detail["outcome"] == "account" and d.detail["attempt"] == attempts
    assert d.detail["response"] == "535 bad credentials"


def test_account_trouble_past_expiry_expires_without_spending() -> None:
    d = delivery(expires_at=NOW + timedelta(seconds=10))
    decision = decide(d, Outcome.account("401", retry_after_s=60.0), HOLD, NOW)
    check(decision, State.EXPIRED, "expired", spend=False, delay=None,
          reason=DeadReason.EXPIRED)


@given(attempts=st.integers(0, 100), max_attempts=st.integers(1, 10),
       retry_after=st.one_of(st.none(), st.floats(0.0, 3600.0)),
       r=st.floats(0.0, 1.0, exclude_max=True))
def test_account_trouble_is_never_a_dead_letter(
    attempts: int, max_attempts: int, retry_after: float | None, r: float,
) -> None:
    lane = LaneConfig("interactive", 1.0, max_attempts=max_attempts)
    d = decide(delivery(attempts=attempts), Outcome.account("403", retry_after), lane, NOW,
               policy=POLICY, rand=lambda: r)
    assert d.state is State.PENDING and not d.spend_attempt and d.dead_reason is None


def test_budget_exhausted_dead_letters_at_the_lanes_max_attempts() -> None:
    lane = LaneConfig("interactive", 1.0, max_attempts=3)
    # Attempts 1 and 2 fail and are retried; attempt 3 is the last.
    for before in (0, 1):
        d = decide(delivery(attempts=before), Outcome.transient("503"), lane, NOW)
        assert d.state is State.PENDING
    d = decide(delivery(attempts=2), Outcome.transient("503"), lane, NOW)
    check(d, State.DEAD, "dead_lettered", spend=True, delay=None,
          reason=DeadReason.BUDGET_EXHAUSTED)
    assert d.detail["max_attempts"] == 3
    assert d.detail["attempt"] == 3


def test_a_retry_that_would_land_after_expiry_expires_instead() -> None:
    d = delivery(attempts=1, expires_at=NOW + timedelta(seconds=3))
    decision = decide(d, Outcome.transient("503"), HOLD, NOW, policy=POLICY,
                      rand=fixed(0.99))  # delay 0.99 * 4 = 3.96s > 3s left
    check(decision, State.EXPIRED, "expired", spend=True, delay=None,
          reason=DeadReason.EXPIRED)
    assert decision.detail["delay_s"] == pytest.approx(3.96)
    # Short enough, with the whole window as the retry budget: scheduled.
    whole = replace(HOLD, retry_budget=1.0)
    decision = decide(d, Outcome.transient("503"), whole, NOW, policy=POLICY, rand=fixed(0.5))
    check(decision, State.PENDING, "retry_scheduled", spend=True, delay=2.0, reason=None)


# -- the retry budget follows the message's usefulness -----------------------------------
def test_a_retry_past_two_thirds_of_the_validity_window_is_not_made() -> None:
    # Enqueued 5 min ago, valid for 15 min: the default budget (2/3) ends at minute 10,
    # 5 min from now. A retry 4 min out is made; one 6 min out is not (it would still land
    # inside the window: dead-lettered as budget_exhausted, not expired).
    d = delivery(attempts=1, created_at=NOW - timedelta(minutes=5),
                 expires_at=NOW + timedelta(minutes=10))
    ok = decide(d, Outcome.transient("503", retry_after_s=240), HOLD, NOW, policy=POLICY)
    check(ok, State.PENDING, "retry_scheduled", spend=True, delay=240.0, reason=None)
    late = decide(d, Outcome.transient("503", retry_after_s=360), HOLD, NOW, policy=POLICY)
    check(late, State.DEAD, "dead_lettered", spend=True, delay=None,
          reason=DeadReason.BUDGET_EXHAUSTED)
    assert late.detail["why"].startswith("the next attempt would start after the retry budget")
    assert late.detail["retry_budget_ends"] == (NOW + timedelta(minutes=5)).isoformat()
    # Past the window altogether it expires, as before.
    gone = decide(d, Outcome.transient("503", retry_after_s=700), HOLD, NOW, policy=POLICY)
    check(gone, State.EXPIRED, "expired", spend=True, delay=None, reason=DeadReason.EXPIRED)


@pytest.mark.parametrize(("budget", "delay_s", "state"), [
    (0.5, 179.0, State.PENDING),  # budget ends 10 min after enqueue: 3 min left
    (0.5, 181.0, State.DEAD),
    (0.9, 659.0, State.PENDING),  # 18 min after enqueue: 11 min left
    (0.9, 661.0, State.DEAD),
    (1.0, 779.0, State.PENDING),  # the whole window: only expiry (13 min left) stops it
    (1.0, 781.0, State.EXPIRED),
])
def test_a_lane_sets_the_fraction_of_the_window_retries_may_use(
        budget: float, delay_s: float, state: State) -> None:
    d = delivery(attempts=1, created_at=NOW - timedelta(minutes=7),
                 expires_at=NOW + timedelta(minutes=13))  # a 20 min window
    lane = replace(HOLD, retry_budget=budget)
    decision = decide(d, Outcome.transient("503", retry_after_s=delay_s), lane, NOW,
                      policy=POLICY)
    assert decision.state is state


def test_the_lane_default_expiry_bounds_the_budget_too() -> None:
    # No expiry of its own: the lane's default (15 min from enqueue) is the window.
    lane = replace(HOLD, default_expiry=timedelta(minutes=15))
    d = delivery(attempts=1, created_at=NOW - timedelta(minutes=9))
    assert decide(d, Outcome.transient("503", retry_after_s=59), lane, NOW,
                  policy=POLICY).state is State.PENDING
    assert decide(d, Outcome.transient("503", retry_after_s=61), lane, NOW,
                  policy=POLICY).dead_reason == DeadReason.BUDGET_EXHAUSTED


def test_throttles_spend_no_budget_and_may_use_the_whole_window() -> None:
    d = delivery(attempts=1, created_at=NOW - timedelta(minutes=5),
                 expires_at=NOW + timedelta(minutes=10))
    decision = decide(d, Outcome.throttled(420.0), HOLD, NOW, policy=POLICY)
    check(decision, State.PENDING, "throttled", spend=False, delay=420.0, reason=None)


def test_a_retry_budget_outside_zero_to_one_is_refused() -> None:
    for bad in (0.0, -0.5, 1.5, float("nan")):
        with pytest.raises(ConfigurationError, match="retry_budget"):
            check_lanes([replace(HOLD, share=0.7, retry_budget=bad),
                         replace(RESEND, share=0.3)])


def test_a_throttle_past_expiry_expires_without_spending() -> None:
    d = delivery(expires_at=NOW + timedelta(seconds=10))
    decision = decide(d, Outcome.throttled(60.0, "429"), HOLD, NOW)
    check(decision, State.EXPIRED, "expired", spend=False, delay=None,
          reason=DeadReason.EXPIRED)


def test_landing_exactly_at_expiry_is_too_late() -> None:
    d = delivery(expires_at=NOW + timedelta(seconds=5))
    decision = decide(d, Outcome.throttled(5.0), HOLD, NOW)
    assert decision.state is State.EXPIRED


def test_expired_before_sending_is_not_sent() -> None:
    for expires_at in (NOW, NOW - timedelta(seconds=1)):
        decision = expire_if_useless(delivery(expires_at=expires_at), NOW)
        assert decision is not None
        check(decision, State.EXPIRED, "expired", spend=False, delay=None,
              reason=DeadReason.EXPIRED)
    assert expire_if_useless(delivery(expires_at=NOW + timedelta(seconds=1)), NOW) is None
    assert expire_if_useless(delivery(expires_at=None), NOW) is None


def test_handler_error_keeps_the_traceback() -> None:
    tb = ("Traceback (most recent call last):\n" + "  frame\n" * 500
          + "KeyError: 'template'\n")
    decision = handler_error(delivery(attempts=2), tb)
    check(decision, State.DEAD, "dead_lettered", spend=True, delay=None,
          reason=DeadReason.HANDLER_ERROR)
    kept = decision.detail["traceback"]
    assert kept.endswith("KeyError: 'template'\n")  # the end of a traceback is what matters
    assert tb.endswith(kept)
    assert decision.detail["outcome"] == "handler_error"
    assert decision.detail["attempt"] == 3
    short = handler_error(delivery(), "Traceback: boom")
    assert short.detail["traceback"] == "Traceback: boom"


def test_the_response_kept_in_the_event_is_bounded() -> None:
    huge = "<html>" + "x" * 10_000
    decision = decide(delivery(), Outcome.permanent(huge), HOLD, NOW)
    assert decision.detail["response"] == huge[:500]


@given(attempts=st.integers(0, 20), kind=st.sampled_from(["transient", "ambiguous"]),
       r=st.floats(0.0, 1.0, exclude_max=True), max_attempts=st.integers(1, 10))
def test_a_spent_retry_never_outlives_the_budget(
    attempts: int, kind: str, r: float, max_attempts: int
) -> None:
    lane = LaneConfig("interactive", 1.0, max_attempts=max_attempts)
    outcome = Outcome.transient("503") if kind == "transient" else Outcome.ambiguous()
    d = decide(delivery(attempts=attempts), outcome, lane, NOW, traits=DEDUPE,
               policy=POLICY, rand=lambda: r)
    if attempts + 1 >= max_attempts:
        assert (d.state, d.dead_reason) == (State.DEAD, DeadReason.BUDGET_EXHAUSTED)
    else:
        assert d.state is State.PENDING and d.spend_attempt
        assert d.delay_s is not None and 0 <= d.delay_s < POLICY.cap_s


def test_an_absurd_retry_after_on_an_expiring_message_expires_instead_of_overflowing() -> None:
    # "Retry-After: 1000000000000" is valid delta-seconds syntax; now + that is past year 9999.
    seconds = parse_retry_after("1000000000000", NOW)
    assert seconds == 1e12
    d = delivery(expires_at=NOW + timedelta(minutes=15))
    decision = decide(d, Outcome.throttled(seconds, "429"), HOLD, NOW)
    check(decision, State.EXPIRED, "expired", spend=False, delay=None,
          reason=DeadReason.EXPIRED)


# -- each lane's own backoff -------------------------------------------------------------
INTERACTIVE, BULK = DEFAULT_LANES
LONG_INTERACTIVE = replace(INTERACTIVE, max_attempts=20)
LONG_BULK = replace(BULK, max_attempts=20)


@pytest.mark.parametrize(("lane", "attempts", "ceiling"), [
    # The default interactive lane: base 0.25 s, so the first retry comes within 0.5 s.
    (INTERACTIVE, 0, 0.5),
    (INTERACTIVE, 1, 1.0),
    (INTERACTIVE, 4, 8.0),
    (LONG_INTERACTIVE, 10, 30.0),  # capped at 30 s: someone is waiting
    # The default bulk lane: base 1 s, capped at five minutes.
    (BULK, 0, 2.0),
    (BULK, 3, 16.0),
    (LONG_BULK, 12, 300.0),
    # A lane that sets nothing backs off with the worker's policy (base 1 s here).
    (HOLD, 0, 2.0),
    (replace(HOLD, retry_base_s=0.1), 2, 0.8),  # its own base, the worker's cap
    (replace(LONG_INTERACTIVE, retry_cap_s=2.0), 5, 2.0),
])
def test_a_503_backs_off_with_the_lanes_own_base_and_cap(
    lane: LaneConfig, attempts: int, ceiling: float
) -> None:
    d = decide(delivery(attempts=attempts, lane=lane.name), Outcome.transient("503"), lane,
               NOW, policy=POLICY, rand=fixed(0.5))
    check(d, State.PENDING, "retry_scheduled", spend=True, delay=0.5 * ceiling, reason=None)


@pytest.mark.parametrize(("lane", "delay"), [(INTERACTIVE, 0.25), (BULK, 1.0)])
def test_an_ambiguous_retry_backs_off_with_the_lanes_own_base(lane: LaneConfig,
                                                               delay: float) -> None:
    d = decide(delivery(lane=lane.name), Outcome.ambiguous("read timeout"), lane, NOW,
               traits=DEDUPE, policy=POLICY, rand=fixed(0.5))
    check(d, State.PENDING, "ambiguous_retry", spend=True, delay=delay, reason=None)


def test_a_429_without_retry_after_keeps_the_throttle_default_in_every_lane() -> None:
    """A throttle is the account's pace, not the message's: the lane's base does not apply."""
    for lane in DEFAULT_LANES:
        d = decide(delivery(lane=lane.name), Outcome.throttled(None), lane, NOW,
                   policy=POLICY, rand=fixed(0.5))
        check(d, State.PENDING, "throttled", spend=False, delay=1.0, reason=None)


def test_lane_policy_keeps_what_the_lane_does_not_set() -> None:
    assert lane_policy(HOLD, POLICY) is POLICY
    assert lane_policy(INTERACTIVE, POLICY) == RetryPolicy(0.25, 30.0, POLICY.throttle_default_s)
    assert lane_policy(replace(HOLD, retry_cap_s=9.0), POLICY) == RetryPolicy(1.0, 9.0, 1.0)
