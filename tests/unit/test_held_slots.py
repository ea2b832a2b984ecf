"""Under a rate limit a worker holds about two seconds of sends, never its whole concurrency."""

from __future__ import annotations

from postlane.limiter.memory import MemoryLimiter
from postlane.worker.runner import WorkerConfig, held_slots


def test_no_limiter_means_the_configured_concurrency() -> None:
    assert held_slots(WorkerConfig(concurrency=200), None) == 200


def test_a_low_ceiling_caps_what_one_worker_holds() -> None:
    assert held_slots(WorkerConfig(concurrency=200), MemoryLimiter(rate=50)) == 100
    assert held_slots(WorkerConfig(concurrency=200), MemoryLimiter(rate=1000)) == 200


def test_every_lane_keeps_a_slot_at_a_tiny_ceiling() -> None:
    assert held_slots(WorkerConfig(concurrency=200), MemoryLimiter(rate=0.1)) == 2
