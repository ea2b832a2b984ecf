"""The worker's timing rules with a fake clock: no test here waits in real time.

The loop supervisor's backoff, and the pacer's rule that a send slot missed by an event-loop
stall is not used late (tests/integration/test_worker_caretaker.py has the caretaker's rescue
interval, which needs a store).
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from postlane.limiter.base import DailyQuota
from postlane.limiter.memory import MemoryLimiter
from postlane.worker.pacer import Pacer
from postlane.worker.supervisor import supervise
from tests.clock import FakeClock


# -- the supervised loop -----------------------------------------------------------------
async def run_steps(outcomes: list[bool | Exception]) -> tuple[FakeClock, Counter[str]]:
    """Supervise a step that fails (an exception) or succeeds (False) as scripted, then ends."""
    clock = FakeClock()
    counters: Counter[str] = Counter()
    script = iter(outcomes)

    async def step() -> bool:
        outcome = next(script, True)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    await supervise("test loop", step, clock=clock, counters=counters)
    return clock, counters


async def test_a_failing_loop_waits_longer_each_time_up_to_a_cap() -> None:
    clock, counters = await run_steps([ConnectionError("database down")] * 9)
    assert clock.sleeps == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0, 5.0]
    assert counters["errors"] == 9


async def test_one_good_turn_resets_the_backoff() -> None:
    down = ConnectionError("database down")
    clock, counters = await run_steps([down, down, down, False, down, False, False])
    assert clock.sleeps == [0.2, 0.4, 0.8, 0.2]  # a turn that succeeds does not wait here
    assert counters["errors"] == 4


async def test_a_stop_is_not_taken_for_a_failure() -> None:
    """Cancellation (the worker stopping) ends the loop at once: no backoff, no error."""
    clock = FakeClock()
    counters: Counter[str] = Counter()

    async def step() -> bool:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await supervise("test loop", step, clock=clock, counters=counters)
    assert clock.sleeps == []
    assert counters["errors"] == 0


# -- the pacer ---------------------------------------------------------------------------
def pacer_at(rate: float = 10.0) -> tuple[FakeClock, Pacer, Counter[str]]:
    clock = FakeClock()
    counters: Counter[str] = Counter()
    limiter = MemoryLimiter(rate=rate, clock=clock.monotonic)
    return clock, Pacer(limiter, ["bulk"], counters, horizon_s=1.0, late_slot_s=0.015,
                        clock=clock), counters


async def test_a_send_waits_for_its_slot() -> None:
    clock, pacer, counters = pacer_at(rate=10.0)
    reserved = await pacer.reserve("bulk", 3)
    assert reserved is not None
    delays, uncertainty = reserved
    assert delays == pytest.approx([0.0, 0.1, 0.2])
    start = clock.now
    assert await pacer.wait_for_slot("bulk", delays[2], uncertainty)
    assert clock.now == pytest.approx(start + 0.2)
    assert counters["late_slots"] == 0


async def test_a_slot_missed_by_a_stall_is_not_used_late() -> None:
    """The event loop stalls 50 ms past a slot (the limit is 15 ms): the send does not go out
    then, on top of the next slot's send; it takes the next free slot instead."""
    clock, pacer, counters = pacer_at(rate=10.0)
    start = clock.now
    reserved = await pacer.reserve("bulk", 2)  # slots at +0 and +0.1; the next free at +0.2
    assert reserved is not None
    clock.stall_next_sleep(0.05)
    assert await pacer.wait_for_slot("bulk", reserved[0][1], reserved[1])
    assert counters["late_slots"] == 1
    assert clock.now == pytest.approx(start + 0.2)  # not +0.15, when the stall ended


async def test_a_late_slot_under_a_daily_quota_alone_is_used_not_wasted() -> None:
    """No per-second ceiling: nothing to bunch against, and a fresh slot would spend a second
    unit of the day's quota (with a stock of 3, the stalled send would leave only 1)."""
    clock = FakeClock()
    counters: Counter[str] = Counter()
    limiter = MemoryLimiter(rate=None, quota=DailyQuota(6, window_s=1000.0, burst=0.5),
                            clock=clock.monotonic)
    pacer = Pacer(limiter, ["bulk"], counters, horizon_s=1.0, late_slot_s=0.015, clock=clock)
    reserved = await pacer.reserve("bulk", 1)
    assert reserved is not None
    clock.stall_next_sleep(0.05)
    assert await pacer.wait_for_slot("bulk", reserved[0][0] + 0.001, reserved[1])
    assert counters["late_slots"] == 0
    rest = await pacer.reserve("bulk", 5)
    assert rest is not None and len(rest[0]) == 2  # the stock of 3, less the one used


async def test_a_late_slot_under_a_rate_and_a_quota_costs_the_day_one_unit() -> None:
    """With a per-second ceiling the stalled send takes a fresh slot, but only a per-second
    one: the late slot spent its unit of the day already, and the stock of 3 is left with 2
    (a fresh slot from the quota too would leave 1)."""
    clock = FakeClock()
    counters: Counter[str] = Counter()
    limiter = MemoryLimiter(rate=10.0, quota=DailyQuota(6, window_s=1000.0, burst=0.5),
                            clock=clock.monotonic)
    pacer = Pacer(limiter, ["bulk"], counters, horizon_s=1.0, late_slot_s=0.015, clock=clock)
    start = clock.now
    reserved = await pacer.reserve("bulk", 1)
    assert reserved is not None
    clock.stall_next_sleep(0.05)
    assert await pacer.wait_for_slot("bulk", reserved[0][0] + 0.001, reserved[1])
    assert counters["late_slots"] == 1
    assert clock.now == pytest.approx(start + 0.1)  # the next per-second slot
    rest = await pacer.reserve("bulk", 5)
    assert rest is not None and len(rest[0]) == 2


async def test_a_slot_missed_by_less_than_the_limit_is_used() -> None:
    clock, pacer, counters = pacer_at(rate=10.0)
    start = clock.now
    reserved = await pacer.reserve("bulk", 2)
    assert reserved is not None
    clock.stall_next_sleep(0.01)
    assert await pacer.wait_for_slot("bulk", reserved[0][1], reserved[1])
    assert counters["late_slots"] == 0
    assert clock.now == pytest.approx(start + 0.11)


async def test_a_slow_limiter_answer_counts_as_lateness() -> None:
    """The limiter decided somewhere within a 20 ms round trip: the slot may be 20 ms old."""
    _, pacer, counters = pacer_at(rate=10.0)
    assert await pacer.wait_for_slot("bulk", 0.0, uncertainty_s=0.02)
    assert counters["late_slots"] == 1


async def test_a_closed_gate_gives_no_slot() -> None:
    _, pacer, _ = pacer_at(rate=10.0)
    await pacer.close_gate(5.0)
    assert not await pacer.wait_for_slot("bulk", 0.1, 0.0)
    assert await pacer.gate_remaining() > 4.0
    assert await pacer.reserve("bulk", 1) is None  # shut for longer than a batch waits


async def test_a_bulk_lane_leaves_the_far_half_of_the_horizon_to_interactive_mail() -> None:
    """A digest burst books as many slots as it may; a reset that arrives then still takes
    a slot at once (about half a horizon out), instead of racing the burst's poller for
    each slot that frees."""
    clock = FakeClock()
    limiter = MemoryLimiter(rate=100.0, clock=clock.monotonic)
    pacer = Pacer(limiter, ["interactive", "bulk"], Counter(), horizon_s=0.1,
                  late_slot_s=0.015, clock=clock, yielding=["bulk"])
    bulk = await pacer.reserve("bulk", 100)
    assert bulk is not None
    assert max(bulk[0]) <= 0.05 + 1e-9  # half the horizon, and no further
    waited_before = list(clock.sleeps)
    reset = await pacer.reserve("interactive", 1)
    assert reset is not None and len(reset[0]) == 1
    assert reset[0][0] <= 0.1
    assert clock.sleeps == waited_before  # granted at once: no retry, no wait


async def test_without_yielding_the_reset_finds_the_horizon_full() -> None:
    """The same burst booking the whole horizon: the limiter has nothing for the reset."""
    clock = FakeClock()
    limiter = MemoryLimiter(rate=100.0, clock=clock.monotonic)
    await limiter.reserve(100, 0.1, "bulk")
    denied = await limiter.reserve(1, 0.1, "interactive")
    assert denied.delays_s == [] and denied.retry_in_s > 0
