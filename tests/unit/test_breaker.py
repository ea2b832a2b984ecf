"""The breaker: the pure failure window and records, and the fleet breaker's state machine
over an in-memory control table with a fake clock (no I/O)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from postlane.core.breaker import (
    CONTROL_PREFIX,
    BreakerConfig,
    BreakerRecord,
    FailureWindow,
    abandoned,
    account_trouble,
    opened,
    probing,
)
from postlane.core.outcomes import Outcome
from postlane.core.policy import Decision
from postlane.core.states import DeadReason, State
from postlane.store.base import Control
from postlane.worker.breaker import FleetBreaker

CONFIG = BreakerConfig(window_s=10.0, min_failures=5, failure_ratio=0.5, cooldown_s=5.0,
                       max_cooldown_s=30.0, probe_timeout_s=20.0)


# -- the window --------------------------------------------------------------------------
def test_opens_only_with_enough_failures() -> None:
    window = FailureWindow(CONFIG)
    for i in range(4):
        window.record(100.0 + i * 0.1, True)
        assert not window.should_open(100.0 + i * 0.1)
    window.record(100.5, True)
    assert window.should_open(100.5)


def test_opens_only_above_the_failure_ratio() -> None:
    window = FailureWindow(CONFIG)
    for i in range(6):
        window.record(100.0 + i * 0.01, False)
    for i in range(5):
        window.record(100.1 + i * 0.01, True)
    assert not window.should_open(100.2)  # 5 of 11 < 50 %
    window = FailureWindow(CONFIG)
    for i in range(5):
        window.record(100.0 + i * 0.01, False)
        window.record(100.0 + i * 0.01, True)
    assert window.should_open(100.1)  # 5 of 10 = 50 %


def test_forgets_outcomes_outside_the_window() -> None:
    window = FailureWindow(CONFIG)
    for i in range(4):
        window.record(100.0 + i, True)
    # The first failure is 10.5 s old when the fifth arrives: four in the window.
    window.record(110.5, True)
    assert not window.should_open(110.5)
    window.record(110.6, True)
    assert window.should_open(110.6)
    # Much later, everything has aged out, even without new outcomes.
    assert not window.should_open(200.0)
    # Successes age out too: they no longer dilute a later burst of failures.
    window = FailureWindow(CONFIG)
    for i in range(100):
        window.record(100.0 + i * 0.01, False)
    for i in range(5):
        window.record(120.0 + i * 0.01, True)
    assert window.should_open(120.1)


def test_clear_forgets_everything() -> None:
    window = FailureWindow(CONFIG)
    for i in range(5):
        window.record(100.0 + i * 0.01, True)
    window.clear()
    assert not window.should_open(100.1)
    window.record(100.2, True)
    assert not window.should_open(100.2)


@given(events=st.lists(st.tuples(st.floats(0, 5), st.booleans()), max_size=80),
       now_gap=st.floats(0, 20))
def test_window_matches_a_recount(events: list[tuple[float, bool]], now_gap: float) -> None:
    """The O(1) running count agrees with counting the window from scratch."""
    window = FailureWindow(CONFIG)
    t = 0.0
    seen: list[tuple[float, bool]] = []
    for gap, failed in events:
        t += gap
        window.record(t, failed)
        seen.append((t, failed))
    now = t + now_gap
    inside = [failed for at, failed in seen if at >= now - CONFIG.window_s]
    failures = sum(inside)
    expected = failures >= CONFIG.min_failures and failures >= 0.5 * len(inside)
    assert window.should_open(now) == expected


# -- records -----------------------------------------------------------------------------
def test_opened_doubles_the_cooldown_up_to_its_cap() -> None:
    first = opened(1000.0, CONFIG, "5+ failures")
    assert (first.state, first.until, first.cooldown_s) == ("open", 1005.0, 5.0)
    again = opened(1010.0, CONFIG, "probe failed", first)
    assert (again.until, again.cooldown_s) == (1020.0, 10.0)
    capped = opened(1020.0, CONFIG, "probe failed", BreakerRecord("open", 0.0, 20.0))
    assert capped.cooldown_s == CONFIG.max_cooldown_s == 30.0


def test_probing_and_json_round_trip() -> None:
    record = probing(opened(1000.0, CONFIG, "why"), 1006.0, "w1", CONFIG)
    assert (record.state, record.until, record.probe_owner, record.reason) == (
        "half_open", 1026.0, "w1", "why")
    assert BreakerRecord.from_json(record.as_json()) == record


# -- the fleet breaker over an in-memory control table -----------------------------------
class Controls:
    """Just the control-table part of a Store, in memory."""

    def __init__(self) -> None:
        self.rows: dict[str, Control] = {}

    async def get_controls(self) -> dict[str, Control]:
        return dict(self.rows)

    async def set_control(self, name: str, value: Mapping[str, Any] | None) -> None:
        if value is None:
            self.rows.pop(name, None)
            return
        version = self.rows[name].version + 1 if name in self.rows else 1
        self.rows[name] = Control(name, dict(value), version, datetime.now(UTC))

    async def compare_and_set_control(
        self, name: str, expected_version: int | None, value: Mapping[str, Any]
    ) -> bool:
        current = self.rows.get(name)
        if (current.version if current else None) != expected_version:
            return False
        await self.set_control(name, value)
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


NAME = CONTROL_PREFIX + "acct"
PENDING = Decision(State.PENDING, "retry_scheduled", delay_s=1.0)
SENT = Decision(State.SENT, "sent")


def breaker(controls: Controls, clock: Clock, owner: str = "w1") -> FleetBreaker:
    return FleetBreaker(controls, "acct", owner, CONFIG, clock=clock)  # type: ignore[arg-type]


async def test_throttles_are_not_failures() -> None:
    controls, clock = Controls(), Clock()
    b = breaker(controls, clock)
    for _ in range(50):
        clock.now += 0.01
        await b.observe(Outcome.throttled(1.0, "429"),
                        Decision(State.PENDING, "throttled", spend_attempt=False))
    assert controls.rows == {}
    assert await b.may_claim() == (True, False)


@pytest.mark.parametrize(("outcome", "decision"), [
    (Outcome.transient("503"), PENDING),
    (Outcome.ambiguous("timeout"), Decision(State.AMBIGUOUS, "ambiguous")),
    (Outcome.permanent("400"), Decision(State.DEAD, "dead_lettered",
                                        dead_reason=DeadReason.PERMANENT)),
])
async def test_transient_ambiguous_and_dead_letters_are_failures(
    outcome: Outcome, decision: Decision
) -> None:
    controls, clock = Controls(), Clock()
    b = breaker(controls, clock)
    for _ in range(CONFIG.min_failures):
        clock.now += 0.01
        await b.observe(outcome, decision)
    assert NAME in controls.rows
    assert controls.rows[NAME].value["state"] == "open"


async def test_successes_keep_it_closed() -> None:
    controls, clock = Controls(), Clock()
    b = breaker(controls, clock)
    for _ in range(20):
        clock.now += 0.01
        await b.observe(Outcome.accepted("x"), SENT)
        await b.observe(Outcome.transient("503"), PENDING)
        await b.observe(Outcome.accepted("x"), SENT)
    assert controls.rows == {}


async def open_breaker(controls: Controls, clock: Clock, b: FleetBreaker) -> None:
    for _ in range(CONFIG.min_failures):
        clock.now += 0.01
        await b.observe(Outcome.transient("503"), PENDING)
    assert controls.rows[NAME].value["state"] == "open"


async def test_open_stops_claims_then_one_probe_closes_it() -> None:
    controls, clock = Controls(), Clock()
    a, other = breaker(controls, clock, "w1"), breaker(controls, clock, "w2")
    await open_breaker(controls, clock, a)
    await other.refresh(controls.rows.get(NAME))
    assert await a.may_claim() == (False, False)
    assert await other.may_claim() == (False, False)

    clock.now += CONFIG.cooldown_s + 0.1
    assert await a.may_claim() == (True, True)  # a won the half-open compare-and-set
    await other.refresh(controls.rows.get(NAME))
    assert await other.may_claim() == (False, False)  # only one probe in the fleet
    assert await a.may_claim() == (False, False)  # and only one from a

    a.probe_claimed([_delivery(42)])
    await a.observe(Outcome.accepted("x"), SENT, 42)
    assert NAME not in controls.rows  # closed
    assert await a.may_claim() == (True, False)


async def test_a_failed_probe_reopens_with_a_doubled_cooldown() -> None:
    controls, clock = Controls(), Clock()
    b = breaker(controls, clock)
    await open_breaker(controls, clock, b)
    clock.now += CONFIG.cooldown_s + 0.1
    assert await b.may_claim() == (True, True)
    b.probe_claimed([_delivery(7)])
    await b.observe(Outcome.transient("503"), PENDING, 7)
    record = BreakerRecord.from_json(controls.rows[NAME].value)
    assert (record.state, record.cooldown_s) == ("open", 2 * CONFIG.cooldown_s)
    assert record.until == pytest.approx(clock.now + 2 * CONFIG.cooldown_s)
    clock.now += CONFIG.cooldown_s + 0.1
    assert await b.may_claim() == (False, False)  # still cooling down
    clock.now += CONFIG.cooldown_s
    assert await b.may_claim() == (True, True)


async def claimed_probe(ids: list[int]) -> tuple[Controls, FleetBreaker]:
    """An open breaker past its cool-down whose worker claimed ``ids`` as the probe."""
    controls, clock = Controls(), Clock()
    b = breaker(controls, clock)
    await open_breaker(controls, clock, b)
    clock.now += CONFIG.cooldown_s + 0.1
    assert await b.may_claim() == (True, True)
    b.probe_claimed([_delivery(i) for i in ids])
    return controls, b


async def test_a_probe_closes_on_its_first_accepted_delivery() -> None:
    controls, b = await claimed_probe([7, 8, 9])
    # One delivery of the probe timing out proves nothing while the others are out.
    await b.observe(Outcome.ambiguous("no answer within 2s"), PENDING, 7)
    assert BreakerRecord.from_json(controls.rows[NAME].value).state == "half_open"
    await b.observe(Outcome.accepted("x"), SENT, 8)
    assert NAME not in controls.rows  # closed
    await b.observe(Outcome.transient("503"), PENDING, 9)  # a straggler: stays closed
    assert NAME not in controls.rows


async def test_a_probe_reopens_only_when_every_delivery_failed() -> None:
    controls, b = await claimed_probe([7, 8, 9])
    for id_ in (7, 8):
        await b.observe(Outcome.transient("503"), PENDING, id_)
        assert BreakerRecord.from_json(controls.rows[NAME].value).state == "half_open"
    await b.observe(Outcome.transient("503"), PENDING, 9)
    record = BreakerRecord.from_json(controls.rows[NAME].value)
    assert (record.state, record.cooldown_s) == ("open", 2 * CONFIG.cooldown_s)


async def test_an_empty_probe_lets_another_lane_probe() -> None:
    controls, clock = Controls(), Clock()
    b = breaker(controls, clock)
    await open_breaker(controls, clock, b)
    clock.now += CONFIG.cooldown_s + 0.1
    assert await b.may_claim() == (True, True)
    b.probe_claimed([])  # that lane had nothing ready
    assert await b.may_claim() == (True, True)


async def test_an_abandoned_probe_reopens_the_breaker() -> None:
    controls, clock = Controls(), Clock()
    prober, other = breaker(controls, clock, "w1"), breaker(controls, clock, "w2")
    await open_breaker(controls, clock, prober)
    clock.now += CONFIG.cooldown_s + 0.1
    assert await prober.may_claim() == (True, True)
    # The prober dies; after the probe timeout another worker re-opens the breaker.
    clock.now += CONFIG.probe_timeout_s + 0.1
    await other.refresh(controls.rows.get(NAME))
    assert await other.may_claim() == (False, False)
    record = BreakerRecord.from_json(controls.rows[NAME].value)
    assert (record.state, record.reason) == ("open", "probe abandoned")
    # A vanished prober says nothing about the provider: probe again at once, and the
    # cool-down is not doubled.
    assert record.cooldown_s == CONFIG.cooldown_s
    assert await other.may_claim() == (True, True)


async def test_stragglers_do_not_count_while_open() -> None:
    controls, clock = Controls(), Clock()
    b = breaker(controls, clock)
    await open_breaker(controls, clock, b)
    version = controls.rows[NAME].version
    for _ in range(20):
        await b.observe(Outcome.transient("503"), PENDING)
    assert controls.rows[NAME].version == version


def _delivery(id_: int) -> Any:
    class D:
        id = id_
    return D()


# -- account-level trouble ---------------------------------------------------------------
ACCOUNT_WAIT = Decision(State.PENDING, "account_trouble", spend_attempt=False, delay_s=0.5)


async def test_account_trouble_opens_at_once_with_the_cause(
    caplog: pytest.LogCaptureFixture,
) -> None:
    controls, clock = Controls(), Clock()
    b = breaker(controls, clock)
    with caplog.at_level("ERROR", logger="postlane.breaker"):
        await b.observe(Outcome.account("auth: 535 5.7.8 Authentication credentials invalid"),
                        ACCOUNT_WAIT, 1)
    record = BreakerRecord.from_json(controls.rows[NAME].value)
    assert (record.state, record.until) == ("open", clock.now + CONFIG.cooldown_s)
    assert record.cause == "auth: 535 5.7.8 Authentication credentials invalid"
    assert record.reason == f"account trouble: {record.cause}"
    assert await b.may_claim() == (False, False)
    alerts = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ALERT")]
    assert len(alerts) == 1 and "535" in alerts[0] and NAME in alerts[0]


async def test_account_trouble_keeps_no_address_and_a_bounded_cause() -> None:
    controls, clock = Controls(), Clock()
    b = breaker(controls, clock)
    await b.observe(Outcome.account("MessageRejected: Email address is not verified. The "
                                    "following identities failed the check: "
                                    "bob.smith@example.com " + "x" * 1000), ACCOUNT_WAIT)
    cause = BreakerRecord.from_json(controls.rows[NAME].value).cause
    assert "bob.smith@example.com" not in cause and "b***@example.com" in cause
    assert len(cause) <= 300


async def test_account_trouble_waits_for_the_providers_retry_after() -> None:
    controls, clock = Controls(), Clock()
    b = breaker(controls, clock)
    await b.observe(Outcome.account("401", retry_after_s=60.0), ACCOUNT_WAIT)
    record = BreakerRecord.from_json(controls.rows[NAME].value)
    assert record.until == clock.now + 60.0 and record.cooldown_s == CONFIG.cooldown_s


async def test_a_probe_that_meets_account_trouble_again_keeps_the_cause() -> None:
    controls, clock = Controls(), Clock()
    b = breaker(controls, clock)
    await b.observe(Outcome.account("535 bad credentials"), ACCOUNT_WAIT)
    clock.now += CONFIG.cooldown_s + 0.1
    assert await b.may_claim() == (True, True)
    assert BreakerRecord.from_json(controls.rows[NAME].value).cause == "535 bad credentials"
    b.probe_claimed([_delivery(5), _delivery(6)])
    await b.observe(Outcome.account("535 bad credentials"), ACCOUNT_WAIT, 5)
    await b.observe(Outcome.account("535 still bad"), ACCOUNT_WAIT, 6)
    record = BreakerRecord.from_json(controls.rows[NAME].value)
    assert (record.state, record.cooldown_s) == ("open", 2 * CONFIG.cooldown_s)
    assert record.cause == "535 still bad"
    assert record.reason == "probe failed: account trouble: 535 still bad"
    # Fixed: the next probe is accepted and the breaker closes, forgetting the cause.
    clock.now += 2 * CONFIG.cooldown_s + 0.1
    assert await b.may_claim() == (True, True)
    b.probe_claimed([_delivery(7)])
    await b.observe(Outcome.accepted("m"), SENT, 7)
    assert NAME not in controls.rows


def test_an_abandoned_probe_keeps_the_account_cause() -> None:
    record = account_trouble(1000.0, CONFIG, "401 bad token")
    assert abandoned(probing(record, 1006.0, "w1", CONFIG), 1030.0).cause == "401 bad token"
    assert BreakerRecord.from_json(record.as_json()) == record
