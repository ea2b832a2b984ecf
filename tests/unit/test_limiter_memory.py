"""The in-process limiter against a fake clock: spacing, horizon, burst, gate, retry hints."""

from __future__ import annotations

import asyncio
import math
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from postlane.errors import ConfigurationError
from postlane.limiter import (
    MAX_BATCH,
    MemoryLimiter,
    RateLimiter,
    RedisLimiter,
    Reservation,
    open_limiter,
)

# Delays are floats computed from integer nanoseconds; comparisons allow this much slack.
EPS = 1e-9


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += seconds


def limiter(
    rate: float = 10.0, burst: int = 1, start: float = 1000.0
) -> tuple[MemoryLimiter, FakeClock]:
    clock = FakeClock(start)
    return MemoryLimiter(rate=rate, burst=burst, clock=clock), clock


# -- spacing ------------------------------------------------------------------------------------


async def test_first_reservation_starts_now_and_is_spaced_one_interval_apart() -> None:
    lim, _ = limiter(rate=10)
    res = await lim.reserve(5)
    assert res.delays_s == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])
    assert res.retry_in_s == 0
    assert res.granted == 5


async def test_next_reservation_continues_after_the_last_slot() -> None:
    lim, clock = limiter(rate=10)
    await lim.reserve(5)
    clock.advance(0.05)
    res = await lim.reserve(2)
    # Slots 0.5 and 0.6 after the first call, seen from 0.05 later.
    assert res.delays_s == pytest.approx([0.45, 0.55])


async def test_slots_are_never_in_the_past_after_idling() -> None:
    lim, clock = limiter(rate=10)
    await lim.reserve(3)
    clock.advance(60)
    res = await lim.reserve(3)
    assert res.delays_s == pytest.approx([0.0, 0.1, 0.2])


async def test_unused_time_is_not_banked_with_burst_one() -> None:
    lim, clock = limiter(rate=10)
    await lim.reserve(1)
    clock.advance(5)
    first, second = (await lim.reserve(1)), (await lim.reserve(1))
    assert first.delays_s == [0.0]
    assert second.delays_s == pytest.approx([0.1])


async def test_uneven_rate_rounds_spacing_up_never_down() -> None:
    lim, _ = limiter(rate=3)
    res = await lim.reserve(4)
    gaps = [b - a for a, b in zip(res.delays_s, res.delays_s[1:], strict=False)]
    assert all(g >= 1 / 3 for g in gaps)
    assert all(g < 1 / 3 + 1e-8 for g in gaps)


async def test_concurrent_tasks_never_share_a_slot() -> None:
    lim, _ = limiter(rate=100)
    results = await asyncio.gather(*(lim.reserve(3, horizon_s=10) for _ in range(50)))
    slots = sorted(d for r in results for d in r.delays_s)
    assert len(slots) == 150
    assert all(b - a >= 0.01 - EPS for a, b in pairwise(slots))


# -- horizon and partial grants -----------------------------------------------------------------


async def test_horizon_caps_the_grant_and_retry_says_when_the_next_slot_is_in_reach() -> None:
    lim, _ = limiter(rate=10)
    res = await lim.reserve(20, horizon_s=1.0)
    # 0.0 .. 1.0 inclusive: the slot exactly at the horizon is granted.
    assert len(res.delays_s) == 11
    assert res.delays_s[-1] == pytest.approx(1.0)
    # Next free slot is at 1.1; with a 1 s horizon it is reachable 0.1 s from now.
    assert res.retry_in_s == pytest.approx(0.1)


async def test_nothing_granted_when_the_next_slot_is_beyond_the_horizon() -> None:
    lim, clock = limiter(rate=10)
    await lim.reserve(11, horizon_s=1.0)  # books 0.0 .. 1.0
    clock.advance(0.02)
    res = await lim.reserve(1, horizon_s=0.5)
    assert res.delays_s == []
    # Next slot at 1.1, i.e. 1.08 from now; within a 0.5 s horizon 0.58 s from now.
    assert res.retry_in_s == pytest.approx(0.58)
    # A denied call books nothing: the same slot is still next.
    clock.advance(0.58)
    again = await lim.reserve(1, horizon_s=0.5)
    assert again.delays_s == pytest.approx([0.5])


async def test_zero_horizon_grants_only_a_slot_that_is_free_now() -> None:
    lim, clock = limiter(rate=10)
    assert (await lim.reserve(3, horizon_s=0)).delays_s == [0.0]
    denied = await lim.reserve(1, horizon_s=0)
    assert denied.delays_s == []
    assert denied.retry_in_s == pytest.approx(0.1)
    clock.advance(0.1)
    assert (await lim.reserve(1, horizon_s=0)).delays_s == [0.0]


async def test_partial_grant_reports_a_positive_retry() -> None:
    lim, _ = limiter(rate=4)
    res = await lim.reserve(10, horizon_s=0.6)
    assert res.delays_s == pytest.approx([0.0, 0.25, 0.5])
    assert res.retry_in_s == pytest.approx(0.15)  # next slot 0.75 - 0.6


# -- burst ---------------------------------------------------------------------------------------


async def test_burst_allows_back_to_back_slots_then_spacing() -> None:
    lim, _ = limiter(rate=10, burst=3)
    res = await lim.reserve(5)
    assert res.delays_s == pytest.approx([0.0, 0.0, 0.0, 0.1, 0.2])


async def test_burst_refills_at_the_rate() -> None:
    lim, clock = limiter(rate=10, burst=3)
    await lim.reserve(3)  # burst spent
    clock.advance(0.15)  # one and a half intervals back
    res = await lim.reserve(3)
    assert res.delays_s == pytest.approx([0.0, 0.05, 0.15])
    clock.advance(10)
    assert (await lim.reserve(4)).delays_s == pytest.approx([0.0, 0.0, 0.0, 0.1])


# -- the gate ------------------------------------------------------------------------------------


async def test_closed_gate_grants_nothing_and_says_how_long() -> None:
    lim, clock = limiter(rate=10)
    assert await lim.gate_remaining_s() == 0
    await lim.close_gate(2.0)
    assert await lim.gate_remaining_s() == pytest.approx(2.0)
    res = await lim.reserve(5)
    assert res.delays_s == []
    assert res.retry_in_s == pytest.approx(2.0)
    clock.advance(0.5)
    assert (await lim.reserve(1)).retry_in_s == pytest.approx(1.5)


async def test_gate_is_extended_never_shortened() -> None:
    lim, clock = limiter(rate=10)
    await lim.close_gate(2.0)
    clock.advance(0.5)
    await lim.close_gate(1.0)  # ends at 1.5 from now: earlier than 2.0, ignored
    assert await lim.gate_remaining_s() == pytest.approx(1.5)
    await lim.close_gate(3.0)
    assert await lim.gate_remaining_s() == pytest.approx(3.0)
    await lim.close_gate(0)
    assert await lim.gate_remaining_s() == pytest.approx(3.0)


async def test_gate_opens_on_time_and_slots_resume_now() -> None:
    lim, clock = limiter(rate=10)
    await lim.reserve(2)
    await lim.close_gate(1.0)
    clock.advance(0.999)
    assert (await lim.reserve(1)).delays_s == []
    clock.advance(0.001)
    assert await lim.gate_remaining_s() == 0
    res = await lim.reserve(2)
    assert res.delays_s == pytest.approx([0.0, 0.1])
    assert res.retry_in_s == 0


# -- arguments and construction ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "horizon"),
    [(0, 1.0), (-1, 1.0), (MAX_BATCH + 1, 1.0), (1, -0.1), (1, math.inf), (1, math.nan)],
)
async def test_reserve_refuses_meaningless_arguments(n: int, horizon: float) -> None:
    lim, _ = limiter()
    with pytest.raises(ValueError):
        await lim.reserve(n, horizon_s=horizon)


@pytest.mark.parametrize("seconds", [-1.0, math.nan, math.inf])
async def test_close_gate_refuses_meaningless_durations(seconds: float) -> None:
    lim, _ = limiter()
    with pytest.raises(ValueError):
        await lim.close_gate(seconds)


@pytest.mark.parametrize(
    ("rate", "burst"), [(0, 1), (-5, 1), (math.inf, 1), (math.nan, 1), (10, 0), (10, -1)]
)
def test_bad_rate_or_burst_is_a_configuration_error(rate: float, burst: int) -> None:
    with pytest.raises(ConfigurationError):
        MemoryLimiter(rate=rate, burst=burst)


async def test_open_limiter_memory() -> None:
    for url in (None, "memory://"):
        lim = open_limiter(url, rate=50, burst=2)
        assert isinstance(lim, MemoryLimiter)
        assert isinstance(lim, RateLimiter)
        assert (lim.rate, lim.burst) == (50, 2)
        await lim.close()


async def test_open_limiter_redis_is_lazy_and_keyed_by_account() -> None:
    lim = open_limiter("redis://127.0.0.1:6379/3", rate=20, account="ses-eu")
    assert isinstance(lim, RedisLimiter)
    assert lim.key == "postlane:limiter:ses-eu"
    assert lim.rate == 20
    await lim.close()


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://localhost/db",
        "memory://somewhere",
        "redis://",
        "",
        "nonsense",
        "redis://:hunter2@/0",
    ],
)
def test_open_limiter_refuses_other_urls(url: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        open_limiter(url, rate=10)
    assert "limiter URL" in str(info.value)
    assert "hunter2" not in str(info.value)


def test_open_limiter_checks_rate_for_redis_too() -> None:
    with pytest.raises(ConfigurationError):
        open_limiter("redis://127.0.0.1:6379/0", rate=0)


# -- the guarantee, as a property ----------------------------------------------------------------

_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("reserve"),
            st.floats(min_value=0, max_value=3, allow_nan=False),  # clock advance before
            st.integers(min_value=1, max_value=12),  # n
            st.floats(min_value=0, max_value=2, allow_nan=False),  # horizon
        ),
        st.tuples(
            st.just("gate"),
            st.floats(min_value=0, max_value=3, allow_nan=False),
            st.just(0),
            st.floats(min_value=0, max_value=2, allow_nan=False),  # gate length
        ),
    ),
    max_size=60,
)


def _run(rate: float, burst: int, ops: list[tuple[str, float, int, float]]) -> list[float]:
    """Play ``ops`` against a fake clock; check each reservation; return absolute slot times."""
    lim, clock = limiter(rate=rate, burst=burst, start=0.0)
    slots: list[float] = []

    async def play() -> None:
        for kind, advance, n, arg in ops:
            clock.advance(advance)
            if kind == "gate":
                await lim.close_gate(arg)
                continue
            res = await lim.reserve(n, horizon_s=arg)
            d = res.delays_s
            assert len(d) <= n
            assert all(0 <= x <= arg + EPS for x in d)
            assert d == sorted(d)
            if len(d) == n:
                assert res.retry_in_s == 0
            else:
                assert res.retry_in_s > 0
            slots.extend(clock.now + x for x in d)

    asyncio.run(play())
    return slots


@settings(max_examples=300, deadline=None)
@given(rate=st.floats(min_value=0.5, max_value=1000), ops=_ops)
def test_property_burst_one_slots_are_never_closer_than_one_interval(
    rate: float, ops: list[tuple[str, float, int, float]]
) -> None:
    slots = _run(rate, 1, ops)
    # Granted in order: the sequence itself is non-decreasing, not just its sorted copy.
    assert slots == sorted(slots)
    for a, b in pairwise(slots):
        assert b - a >= 1 / rate - EPS


@settings(max_examples=150, deadline=None)
@given(
    rate=st.floats(min_value=0.5, max_value=1000),
    burst=st.integers(min_value=1, max_value=6),
    ops=_ops,
)
def test_property_any_window_holds_at_most_burst_plus_rate_times_length(
    rate: float, burst: int, ops: list[tuple[str, float, int, float]]
) -> None:
    slots = _run(rate, burst, ops)
    # GCRA bound: slot i+(burst-1)+k is at least k intervals after slot i.
    for i, start in enumerate(slots):
        for j in range(i + burst, len(slots)):
            k = j - i - (burst - 1)
            assert slots[j] - start >= k / rate - EPS * k


def test_reservation_is_a_frozen_value() -> None:
    res = Reservation([0.0, 0.1], 0.0)
    assert res.granted == 2
    with pytest.raises(AttributeError):
        res.retry_in_s = 1.0  # type: ignore[misc]
