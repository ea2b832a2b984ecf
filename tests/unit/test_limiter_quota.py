"""The daily quota in the in-process limiter, against a fake clock: the stock, the pace over
the window, the reserve the bulk lane leaves to interactive mail, and the window bound."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from postlane.errors import ConfigurationError
from postlane.limiter import UNLIMITED_RATE, DailyQuota, MemoryLimiter, open_limiter
from tests.unit.test_limiter_memory import FakeClock

EPS = 1e-9
INTERVAL = math.ceil(100e9 / 75) / 1e9  # DAY's pace, in seconds
# A "day" of 100 s and a quota of 100: a stock of 25, 75 paced at one per 4/3 s, 5 kept back.
DAY = DailyQuota(100, window_s=100.0, burst=0.25, reserve=0.2)


def limiter(quota: DailyQuota = DAY, rate: float | None = None) -> tuple[MemoryLimiter, FakeClock]:
    clock = FakeClock()
    return MemoryLimiter(rate=rate, quota=quota, clock=clock), clock


def test_the_quota_derives_stock_reserve_and_pace() -> None:
    assert (DAY.stock, DAY.reserved) == (25, 5)
    interval, tau, yielding_tau = DAY.spacing(1_000_000)
    assert interval == math.ceil(100e6 / 75)
    assert (tau, yielding_tau) == (24 * interval, 19 * interval)
    assert DailyQuota(50_000).stock == 12_500
    assert DailyQuota(2, burst=0.01).stock == 1  # at least one, fewer than the quota


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"quota": 1}, "integer >= 2"),
    ({"quota": 10.5}, "integer >= 2"),
    ({"quota": 10, "window_s": 0}, "positive seconds"),
    ({"quota": 10, "burst": 1.0}, r"fraction in \(0, 1\)"),
    ({"quota": 10, "burst": 0}, r"fraction in \(0, 1\)"),
    ({"quota": 10, "reserve": 1.0}, r"fraction in \[0, 1\)"),
    ({"quota": 10, "reserve": math.nan}, r"fraction in \[0, 1\)"),
])
def test_a_bad_quota_is_refused(kwargs: dict[str, float], says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        DailyQuota(**kwargs)  # type: ignore[arg-type]


def test_a_limiter_needs_a_rate_or_a_quota() -> None:
    with pytest.raises(ConfigurationError, match="a rate, a daily quota or both"):
        MemoryLimiter(rate=None)
    assert MemoryLimiter(rate=None, quota=DAY).rate == UNLIMITED_RATE
    assert open_limiter(None, rate=None, quota=DAY).quota == DAY


async def test_the_stock_goes_out_at_once_then_the_rest_is_paced() -> None:
    lim, clock = limiter()
    res = await lim.reserve(100, horizon_s=0.5)
    assert res.granted == 25
    assert res.delays_s[-1] < 0.001  # no per-second ceiling: back to back
    interval = INTERVAL
    assert res.retry_in_s == pytest.approx(interval - 0.5, abs=1e-6)
    clock.advance(res.retry_in_s + 0.5)
    assert (await lim.reserve(5, horizon_s=0)).granted == 1
    again = await lim.reserve(5, horizon_s=10 * interval)
    assert again.delays_s == pytest.approx([interval * k for k in range(1, 6)], abs=1e-6)


async def test_with_a_per_second_ceiling_both_hold() -> None:
    lim, _ = limiter(rate=10)
    res = await lim.reserve(100, horizon_s=10.0)
    # The stock goes out at the per-second ceiling (and refills meanwhile), then the pace.
    assert res.delays_s[:25] == pytest.approx([k / 10 for k in range(25)], abs=1e-6)
    gaps = [b - a for a, b in zip(res.delays_s, res.delays_s[1:], strict=False)]
    assert min(gaps) > 0.1 - EPS
    assert gaps[-1] == pytest.approx(INTERVAL, abs=1e-6)
    assert res.granted <= 25 + math.ceil(10.0 / INTERVAL)


async def test_bulk_yields_the_reserve_to_interactive_mail() -> None:
    lim, clock = limiter()
    bulk = await lim.reserve(100, horizon_s=1.0, lane="bulk")
    assert bulk.granted == 20  # the stock less the reserve
    assert (await lim.reserve(1, horizon_s=1.0, lane="bulk")).granted == 0
    interactive = await lim.reserve(100, horizon_s=1.0, lane="interactive")
    assert interactive.granted == 5  # the reserve was kept for it
    # Bulk is slowed, not stopped: it gets the refill once the stock is above the reserve.
    denied = await lim.reserve(1, horizon_s=0, lane="bulk")
    assert denied.granted == 0
    # 25 sent at once: the stock is back above the reserve of 5 after 6 intervals.
    assert denied.retry_in_s == pytest.approx(6 * INTERVAL, abs=1e-6)
    clock.advance(denied.retry_in_s)
    assert (await lim.reserve(5, horizon_s=0, lane="bulk")).granted == 1


async def test_lanes_not_named_yielding_use_the_whole_stock() -> None:
    quota = DailyQuota(100, window_s=100.0, yielding=frozenset({"newsletter"}))
    lim, _ = limiter(quota)
    assert (await lim.reserve(100, horizon_s=1.0, lane="bulk")).granted == 25


async def test_the_day_is_spread_not_spent_by_noon() -> None:
    """A backlog from midnight: by half the window, the stock plus half the pace, no more."""
    lim, clock = limiter(DailyQuota(1000, window_s=1000.0))
    sent_by_noon = 0
    while clock.now < 1000.0 + 500.0:
        res = await lim.reserve(50, horizon_s=0)
        sent_by_noon += res.granted
        clock.advance(0.5)
    stock = 250
    assert sent_by_noon <= stock + math.ceil(750 / 2) + 1
    assert sent_by_noon >= stock + 750 // 2 - 1  # and the pace is used, not wasted


async def test_set_ceilings_keeps_what_was_used_and_paces_at_the_new_quota() -> None:
    """The state is kept as time owed: a raised quota (SES grew the account) never lets the
    sends already made go uncounted; from then on the new pace holds."""
    lim, clock = limiter()
    assert (await lim.reserve(100, horizon_s=1.0)).granted == 25
    lim.set_ceilings(rate=None, quota=DailyQuota(200, window_s=100.0))
    assert (await lim.reserve(100, horizon_s=1.0)).granted <= 25
    clock.advance(200.0)  # idle for longer than the window: the whole new stock is back
    assert (await lim.reserve(100, horizon_s=0.5)).granted == 50
    with pytest.raises(ConfigurationError):
        lim.set_ceilings(rate=None, quota=None)


@settings(max_examples=60, deadline=None)
@given(
    quota=st.integers(2, 60),
    burst=st.floats(0.05, 0.95),
    reserve=st.floats(0, 0.9),
    rate=st.one_of(st.none(), st.floats(0.5, 50)),
    steps=st.lists(st.tuples(st.floats(0, 6), st.integers(1, 40), st.floats(0, 4),
                             st.sampled_from(["interactive", "bulk", None])),
                   min_size=1, max_size=60),
)
async def test_no_window_holds_more_than_the_quota(
    quota: int, burst: float, reserve: float, rate: float | None,
    steps: list[tuple[float, int, float, str | None]],
) -> None:
    window = 10.0
    lim, clock = limiter(DailyQuota(quota, window_s=window, burst=burst, reserve=reserve), rate)
    starts: list[float] = []
    for wait, n, horizon, lane in steps:
        clock.advance(wait)
        res = await lim.reserve(n, horizon_s=horizon, lane=lane)
        starts += [clock.now + d for d in res.delays_s]
        assert res.granted == n or res.retry_in_s > -EPS
    starts.sort()
    for first, last in zip(starts, starts[quota:], strict=False):
        assert last - first > window - EPS  # quota + 1 sends never fit in one window


async def test_a_slot_that_spends_no_quota_is_paced_and_leaves_the_stock() -> None:
    """The pacer's fresh slot for a send whose late slot spent its unit of the day already:
    spaced by the per-second ceiling like any other, and nothing taken from the day; even with
    the stock gone, the per-second slot is granted."""
    lim, _ = limiter(rate=1000.0)
    free = await lim.reserve(3, horizon_s=0.1, spend_quota=False)
    assert free.delays_s == pytest.approx([0.0, 0.001, 0.002])
    stock = await lim.reserve(100, horizon_s=0.1)
    assert stock.granted == 25  # the whole stock (3 fewer had the three spent it)
    assert stock.delays_s[0] == pytest.approx(0.003)  # after the three per-second slots
    late = await lim.reserve(1, horizon_s=0.1, spend_quota=False)
    assert late.granted == 1  # the stock is gone; a send it counted still gets its slot
    assert (await lim.reserve(1, horizon_s=0.1)).granted == 0
