"""The caretaker's schedule with a fake clock, on both store engines: housekeeping every
``controls_interval_s``, rescue and reconciliation every ``rescue_interval_s``, no real waits.
"""

from __future__ import annotations

from postlane.providers.testing import RecordingProvider
from postlane.store.base import RescueResult, Store
from postlane.worker import Worker
from tests.clock import FakeClock
from tests.integration.worker_helpers import fast_config


def spied_worker(store: Store, clock: FakeClock, **config: float | bool) -> tuple[Worker,
                                                                                  list[float]]:
    """A worker on ``clock`` and the clock readings at which it rescued expired leases."""
    rescues: list[float] = []
    rescue = store.rescue_expired_leases

    async def counted() -> RescueResult:
        rescues.append(clock.now)
        return await rescue()

    store.rescue_expired_leases = counted  # type: ignore[method-assign]
    worker = Worker(store, RecordingProvider(), config=fast_config(**config), clock=clock)
    return worker, rescues


async def test_rescue_runs_every_rescue_interval(store: Store) -> None:
    clock = FakeClock(start=1000.0)
    worker, rescues = spied_worker(store, clock, rescue_interval_s=2.0,
                                   controls_interval_s=0.5)
    for _ in range(9):  # t = 1000.0, 1000.5, ... 1004.0
        assert not await worker.caretaker.step()
    assert rescues == [1000.0, 1002.0, 1004.0]  # the first round rescues at once
    assert clock.sleeps == [0.5] * 9


async def test_a_drain_ends_the_caretaker_once_nothing_is_left(store: Store) -> None:
    clock = FakeClock()
    worker, _ = spied_worker(store, clock, drain=True)
    assert await worker.caretaker.step()
    assert clock.sleeps == []
