"""Lanes: reserved floors that sum to the worker's concurrency, lent only when idle."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from datetime import timedelta
from itertools import pairwise

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from postlane.core.lanes import (
    DEFAULT_LANES,
    LaneConfig,
    check_lanes,
    may_start,
    parse_lane_durations,
    parse_lane_shares,
    slot_floors,
    start_capacity,
    with_lane_timings,
)
from postlane.errors import ConfigurationError


def lanes_of(*percentages: int) -> list[LaneConfig]:
    return [LaneConfig(f"lane{i}", p / 100) for i, p in enumerate(percentages)]


# -- floors ------------------------------------------------------------------------------
def test_default_floors_follow_the_shares() -> None:
    assert slot_floors(DEFAULT_LANES, 100) == {"interactive": 70, "bulk": 30}
    assert slot_floors(DEFAULT_LANES, 10) == {"interactive": 7, "bulk": 3}
    # Rounding remainder goes to the largest share: 0.7 * 4 = 2.8 -> 2 (+1), 0.3 * 4 -> 1.
    assert slot_floors(DEFAULT_LANES, 4) == {"interactive": 3, "bulk": 1}


def test_every_lane_gets_at_least_one_slot() -> None:
    assert slot_floors(DEFAULT_LANES, 2) == {"interactive": 1, "bulk": 1}
    floors = slot_floors(lanes_of(98, 1, 1), 3)
    assert floors == {"lane0": 1, "lane1": 1, "lane2": 1}
    floors = slot_floors(lanes_of(98, 1, 1), 10)
    assert floors["lane1"] == floors["lane2"] == 1
    assert sum(floors.values()) == 10


def test_concurrency_below_the_number_of_lanes_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="below the number of lanes"):
        slot_floors(DEFAULT_LANES, 1)


@st.composite
def percentages(draw: st.DrawFn) -> list[int]:
    """2..6 positive integer percentages adding up to 100."""
    n = draw(st.integers(2, 6))
    cuts = sorted(draw(st.lists(st.integers(1, 99), min_size=n - 1, max_size=n - 1,
                                unique=True)))
    bounds = [0, *cuts, 100]
    return [b - a for a, b in pairwise(bounds)]


@given(pcts=percentages(), extra=st.integers(0, 300))
def test_floors_sum_to_concurrency_and_give_each_lane_one(pcts: list[int], extra: int) -> None:
    lanes = lanes_of(*pcts)
    concurrency = len(lanes) + extra
    floors = slot_floors(lanes, concurrency)
    assert sum(floors.values()) == concurrency
    assert set(floors) == {lane.name for lane in lanes}
    assert all(f >= 1 for f in floors.values())
    # Roughly proportional: never more than the lane count away from the exact share.
    for lane in lanes:
        assert abs(floors[lane.name] - lane.share * concurrency) <= len(lanes)


# -- may_start ---------------------------------------------------------------------------
FLOORS = {"interactive": 7, "bulk": 3}


def test_within_its_floor_a_lane_always_starts() -> None:
    busy = {"interactive": 10, "bulk": 0}  # interactive borrowed all of bulk's slots
    assert may_start("bulk", busy, FLOORS, {"interactive": True, "bulk": True})
    assert may_start("interactive", {"interactive": 6, "bulk": 3}, FLOORS,
                     {"interactive": True, "bulk": True})


def test_idle_slots_of_a_lane_without_work_are_lent() -> None:
    idle_bulk = {"interactive": True, "bulk": False}
    assert may_start("interactive", {"interactive": 7, "bulk": 0}, FLOORS, idle_bulk)
    assert may_start("interactive", {"interactive": 9, "bulk": 0}, FLOORS, idle_bulk)
    # Bulk's three slots are all lent: the worker is full.
    assert not may_start("interactive", {"interactive": 10, "bulk": 0}, FLOORS, idle_bulk)
    # Bulk uses one of its slots itself: only two are left to lend.
    assert may_start("interactive", {"interactive": 8, "bulk": 1}, FLOORS, idle_bulk)
    assert not may_start("interactive", {"interactive": 9, "bulk": 1}, FLOORS, idle_bulk)


def test_a_lane_that_wants_work_lends_nothing() -> None:
    both_want = {"interactive": True, "bulk": True}
    assert not may_start("interactive", {"interactive": 7, "bulk": 0}, FLOORS, both_want)
    assert not may_start("bulk", {"interactive": 0, "bulk": 3}, FLOORS, both_want)
    # Missing flags read as "not wanting"; missing counts as nothing in flight.
    assert may_start("bulk", {"bulk": 3}, FLOORS, {})


def test_bulk_borrows_interactive_slots_when_interactive_is_quiet() -> None:
    quiet = {"interactive": False, "bulk": True}
    assert may_start("bulk", {"interactive": 0, "bulk": 9}, FLOORS, quiet)
    assert not may_start("bulk", {"interactive": 0, "bulk": 10}, FLOORS, quiet)


def _one_more_by_the_rule(lane: str, in_flight: Mapping[str, int],
                          floors: Mapping[str, int], wanting: Mapping[str, bool]) -> bool:
    """The lending rule as ``may_start`` stated it, one send at a time, before it was
    written as a count: the reference the count is checked against (``may_start`` itself
    now asks ``start_capacity``, so it cannot be the reference)."""
    if in_flight.get(lane, 0) < floors[lane]:
        return True
    spare = 0
    for other, floor in floors.items():
        if other == lane:
            continue
        spare -= max(0, in_flight.get(other, 0) - floor)
        if not wanting.get(other, False):
            spare += max(0, floor - in_flight.get(other, 0))
    return in_flight.get(lane, 0) - floors[lane] < spare


@given(floors=st.lists(st.integers(1, 20), min_size=1, max_size=4),
       in_flight=st.lists(st.integers(0, 40), min_size=4, max_size=4),
       wanting=st.lists(st.booleans(), min_size=4, max_size=4), lane=st.integers(0, 3))
def test_start_capacity_counts_what_the_rule_allows_one_send_at_a_time(
        floors: list[int], in_flight: list[int], wanting: list[bool], lane: int) -> None:
    names = [f"lane{i}" for i in range(len(floors))]
    assume(lane < len(names))
    floor_of = dict(zip(names, floors, strict=False))
    busy = Counter(dict(zip(names, in_flight, strict=False)))
    wants = dict(zip(names, wanting, strict=False))
    name = names[lane]
    counted = 0
    while _one_more_by_the_rule(name, busy, floor_of, wants) and counted < 1000:
        busy[name] += 1
        counted += 1
    assert counted < 1000  # a lane's borrowing ends: the others' slots are finite
    busy[name] -= counted
    assert start_capacity(name, busy, floor_of, wants) == counted
    assert may_start(name, busy, floor_of, wants) is (counted > 0)


def test_start_capacity_is_the_floor_left_plus_what_idle_lanes_lend() -> None:
    quiet = {"interactive": False, "bulk": True}
    assert start_capacity("bulk", {"interactive": 0, "bulk": 0}, FLOORS, quiet) == 10
    assert start_capacity("bulk", {"interactive": 2, "bulk": 1}, FLOORS, quiet) == 7
    assert start_capacity("bulk", {"interactive": 0, "bulk": 12}, FLOORS, quiet) == 0
    # Interactive wants work: bulk has only its own floor.
    assert start_capacity("bulk", {"interactive": 0, "bulk": 1}, FLOORS,
                          {"interactive": True}) == 2


def test_two_borrowers_cannot_both_take_the_same_idle_slot() -> None:
    floors = {"a": 1, "b": 1, "c": 1}
    wanting = {"a": True, "b": True, "c": False}
    # b already borrowed c's only slot: nothing is left for a.
    assert not may_start("a", {"a": 1, "b": 2, "c": 0}, floors, wanting)
    assert may_start("a", {"a": 1, "b": 1, "c": 0}, floors, wanting)


@st.composite
def lane_states(draw: st.DrawFn) -> tuple[dict[str, int], dict[str, int], dict[str, bool], str]:
    pcts = draw(percentages())
    lanes = lanes_of(*pcts)
    concurrency = len(lanes) + draw(st.integers(0, 30))
    floors = slot_floors(lanes, concurrency)
    names = list(floors)
    in_flight = {name: draw(st.integers(0, concurrency + 2)) for name in names}
    wanting = {name: draw(st.booleans()) for name in names}
    return floors, in_flight, wanting, draw(st.sampled_from(names))


@given(state=lane_states())
def test_a_lane_below_its_floor_may_always_start(
    state: tuple[dict[str, int], dict[str, int], dict[str, bool], str],
) -> None:
    floors, in_flight, wanting, lane = state
    assume(in_flight[lane] < floors[lane])
    assert may_start(lane, in_flight, floors, wanting)


@given(state=lane_states())
def test_a_lane_never_borrows_a_slot_of_a_lane_that_wants_work(
    state: tuple[dict[str, int], dict[str, int], dict[str, bool], str],
) -> None:
    """Beyond its floor, a lane may start only into a slot nobody with work can claim:
    after it starts, the sends in flight plus the unused floors of every other lane that
    wants work still fit in the worker's concurrency."""
    floors, in_flight, wanting, lane = state
    assume(in_flight[lane] >= floors[lane])
    if not may_start(lane, in_flight, floors, wanting):
        return
    concurrency = sum(floors.values())
    reserved_for_wanting = sum(max(0, floors[o] - in_flight[o]) for o in floors
                               if o != lane and wanting[o])
    assert sum(in_flight.values()) + 1 + reserved_for_wanting <= concurrency


@given(pcts=percentages(), extra=st.integers(0, 20), data=st.data())
def test_no_borrowed_start_ever_exceeds_concurrency(
    pcts: list[int], extra: int, data: st.DataObject,
) -> None:
    """Over any sequence of starts, finishes and changes of mind: a lane within its floor may
    always start, and a start beyond the floor never takes the worker past its concurrency.
    (A lender taking its floor back may briefly run the total above concurrency, by design:
    borrowed sends are not pre-empted.)"""
    lanes = lanes_of(*pcts)
    concurrency = len(lanes) + extra
    floors = slot_floors(lanes, concurrency)
    names = list(floors)
    in_flight: Counter[str] = Counter()
    wanting = dict.fromkeys(names, True)
    for _ in range(data.draw(st.integers(1, 60))):
        lane = data.draw(st.sampled_from(names))
        action = data.draw(st.sampled_from(["start", "start", "finish", "toggle"]))
        if action == "start":
            within = in_flight[lane] < floors[lane]
            if within:
                assert may_start(lane, in_flight, floors, wanting)
            if may_start(lane, in_flight, floors, wanting):
                in_flight[lane] += 1
                if not within:
                    assert sum(in_flight.values()) <= concurrency
        elif action == "finish" and in_flight[lane]:
            in_flight[lane] -= 1
        elif action == "toggle":
            wanting[lane] = not wanting[lane]


# -- parsing shares ----------------------------------------------------------------------
def test_parse_lane_shares_keeps_the_lanes_settings() -> None:
    lanes = parse_lane_shares("interactive=60, bulk=40")
    assert [(lane.name, lane.share) for lane in lanes] == [("interactive", 0.6), ("bulk", 0.4)]
    interactive, bulk = lanes
    assert interactive.max_attempts == 6
    assert interactive.default_expiry == timedelta(minutes=15)
    assert bulk.max_attempts == 8
    assert bulk.default_expiry == timedelta(hours=24)


def test_parse_lane_shares_accepts_new_lanes_and_fractions() -> None:
    lanes = parse_lane_shares("interactive=50,bulk=25,digest=25")
    assert [lane.name for lane in lanes] == ["interactive", "bulk", "digest"]
    assert lanes[2].max_attempts == 8  # the default of a new lane
    assert sum(lane.share for lane in parse_lane_shares("a=33.5,b=66.5")) == pytest.approx(1)


@pytest.mark.parametrize(("text", "match"), [
    ("interactive=70,bulk=20", "not 100%"),
    ("interactive=70,bulk=40", "not 100%"),
    ("interactive=100,bulk=10", "not 100%"),
    ("interactive:70,bulk:30", "NAME=PERCENT"),
    ("interactive=70;bulk=30", "not a number"),
    ("=70,bulk=30", "NAME=PERCENT"),
    ("interactive=70,bulk=30,", "NAME=PERCENT"),
    ("interactive", "NAME=PERCENT"),
    ("interactive=seventy,bulk=30", "not a number"),
    ("interactive=0,bulk=100", r"\(0, 100\]"),
    ("interactive=-30,bulk=130", r"\(0, 100\]"),
    ("interactive=nan,bulk=100", r"\(0, 100\]"),
    ("interactive=50,interactive=50", "repeat"),
    ("", "NAME=PERCENT"),
])
def test_parse_lane_shares_errors(text: str, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        parse_lane_shares(text)


def test_check_lanes_refuses_bad_configurations() -> None:
    with pytest.raises(ConfigurationError, match="at least one lane"):
        check_lanes([])
    with pytest.raises(ConfigurationError, match="max_attempts"):
        check_lanes([LaneConfig("interactive", 1.0, max_attempts=0)])
    check_lanes([LaneConfig("interactive", 1.0)])


# -- each lane's patience ----------------------------------------------------------------
def test_the_default_lanes_differ_in_patience() -> None:
    interactive, bulk = DEFAULT_LANES
    # Someone waits for a reset: the first retry within half a second, a silent provider
    # given a few seconds. A digest can wait out a provider's bad minute.
    assert interactive.retry_base_s is not None and 2 * interactive.retry_base_s <= 0.5
    assert interactive.attempt_timeout_s is not None and interactive.attempt_timeout_s <= 5
    assert bulk.retry_base_s is not None and bulk.retry_base_s >= 1
    assert bulk.retry_cap_s is not None and bulk.retry_cap_s >= 60
    assert bulk.attempt_timeout_s is not None and bulk.attempt_timeout_s >= 10


def test_parse_lane_shares_keeps_the_lanes_patience() -> None:
    interactive, bulk = parse_lane_shares("interactive=60,bulk=40")
    assert (interactive.retry_base_s, interactive.retry_cap_s, interactive.attempt_timeout_s) \
        == (DEFAULT_LANES[0].retry_base_s, DEFAULT_LANES[0].retry_cap_s,
            DEFAULT_LANES[0].attempt_timeout_s)
    assert bulk.attempt_timeout_s == DEFAULT_LANES[1].attempt_timeout_s


def test_lane_timings_per_lane_or_for_every_lane() -> None:
    lanes = with_lane_timings(DEFAULT_LANES, attempt_timeout="interactive=2s,bulk=30s",
                              retry_base="interactive=100ms", retry_cap="10m")
    interactive, bulk = lanes
    assert (interactive.attempt_timeout_s, bulk.attempt_timeout_s) == (2.0, 30.0)
    assert interactive.retry_base_s == pytest.approx(0.1)
    assert bulk.retry_base_s == DEFAULT_LANES[1].retry_base_s  # not named: kept
    assert interactive.retry_cap_s == bulk.retry_cap_s == 600.0
    assert with_lane_timings(DEFAULT_LANES) == DEFAULT_LANES
    assert parse_lane_durations("3s", DEFAULT_LANES, "--x") == {"interactive": 3.0,
                                                                 "bulk": 3.0}


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"attempt_timeout": "digest=3s"}, "does not name a configured lane"),
    ({"attempt_timeout": "interactive:3s"}, "not a duration"),
    ({"attempt_timeout": "interactive=soon"}, "not a duration"),
    ({"retry_base": "interactive=0s"}, "must be positive"),
    ({"retry_base": "bulk=10m"}, "retry cap 300s is below its retry base 600s"),
    ({"retry_cap": "interactive=100ms"}, "below its retry base"),
])
def test_bad_lane_timings_are_refused(kwargs: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        with_lane_timings(DEFAULT_LANES, **kwargs)


@pytest.mark.parametrize("field", ["retry_base_s", "retry_cap_s", "attempt_timeout_s"])
@pytest.mark.parametrize("value", [0.0, -1.0, float("nan"), float("inf")])
def test_check_lanes_refuses_unusable_timings(field: str, value: float) -> None:
    lane = replace(LaneConfig("only", 1.0), **{field: value})
    with pytest.raises(ConfigurationError, match=field):
        check_lanes([lane])
