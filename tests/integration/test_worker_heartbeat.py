"""The worker's heartbeat on both engines: written by the caretaker every
``heartbeat_interval_s`` of the worker's clock (a fake one here), carrying who the worker is
and the outcomes it decided since the last beat; counts kept through a failed write; the
row removed on a clean stop."""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Any

import pytest

from postlane import Message, __version__
from postlane.core.outcomes import Outcome
from postlane.core.policy import Decision
from postlane.core.states import State
from postlane.providers.testing import RecordingProvider
from postlane.store.base import Store
from postlane.worker import Worker
from postlane.worker.heartbeat import outcome_series
from tests.clock import FakeClock
from tests.integration.worker_helpers import fast_config, running, wait_until


def test_each_outcome_counts_in_one_series() -> None:
    def series(state: State, event: str, **detail: Any) -> str | None:
        return outcome_series(Decision(state, event, detail=detail))

    assert series(State.SENT, "sent", outcome="accepted") == "sent"
    assert series(State.PENDING, "throttled", outcome="throttled") == "throttled"
    assert series(State.PENDING, "throttled", why="rate limit gate closed") == "throttled"
    assert series(State.PENDING, "retry_scheduled", outcome="transient") == "transient"
    assert series(State.DEAD, "dead_lettered", outcome="transient") == "dead"
    assert series(State.EXPIRED, "expired") == "dead"
    assert series(State.AMBIGUOUS, "ambiguous", outcome="ambiguous") == "ambiguous"
    assert series(State.PENDING, "released", why="released at shutdown") is None


async def test_the_caretaker_beats_every_interval_of_the_workers_clock(store: Store) -> None:
    clock = FakeClock(start=1000.0)
    beats: list[float] = []
    record = store.record_heartbeat

    async def counted(*args: Any) -> None:
        beats.append(clock.now)
        await record(*args)

    store.record_heartbeat = counted  # type: ignore[method-assign]
    worker = Worker(store, RecordingProvider(), config=fast_config(
        heartbeat_interval_s=2.0, controls_interval_s=0.5), clock=clock)
    for _ in range(9):  # t = 1000.0, 1000.5, ... 1004.0
        assert not await worker.caretaker.step()
    assert beats == [1000.0, 1002.0, 1004.0]  # the first round beats at once
    (seen,) = await store.list_workers()
    assert seen.heartbeat.owner == worker.owner
    assert (seen.heartbeat.host, seen.heartbeat.pid) == (socket.gethostname(), os.getpid())
    assert seen.heartbeat.version == __version__
    assert seen.heartbeat.lanes == {"interactive": 0.7, "bulk": 0.3}
    assert seen.heartbeat.provider == "recording" and seen.heartbeat.interval_s == 2.0
    assert not seen.gone


async def test_outcomes_reach_the_minutes_and_a_clean_stop_removes_the_worker(
        store: Store) -> None:
    provider = RecordingProvider()
    provider.script_key("bad", Outcome.permanent("550 no such user"))
    for key, lane in (("a", "interactive"), ("b", "bulk"), ("c", "bulk"), ("bad", "bulk")):
        await store.enqueue(Message(key=key, to=f"{key}@example.com", text="t", lane=lane))
    worker = Worker(store, provider, config=fast_config(heartbeat_interval_s=0.05))
    async with running(worker):
        async def counted() -> dict[tuple[str, str], int] | None:
            rows = await store.outcome_minutes(timedelta(hours=1))
            counts = {(r.lane, r.outcome): r.count for r in rows}
            return counts if sum(counts.values()) == 4 else None

        counts = await wait_until(counted, what="four outcomes counted")
        assert [w.heartbeat.owner for w in await store.list_workers()] == [worker.owner]
    assert counts == {("interactive", "sent"): 1, ("bulk", "sent"): 2, ("bulk", "dead"): 1}
    assert await store.list_workers() == []


async def test_counts_survive_a_failed_write(store: Store) -> None:
    clock = FakeClock()
    worker = Worker(store, RecordingProvider(), config=fast_config(), clock=clock)
    heartbeat = worker.heartbeat
    delivery_result = await store.enqueue(Message(key="k", to="k@example.com", text="t"))
    delivery = await store.get(delivery_result.id)
    assert delivery is not None
    heartbeat.observe(delivery, Decision(State.SENT, "sent"))
    record = store.record_heartbeat

    async def down(*args: Any) -> None:
        raise OSError("connection refused")

    store.record_heartbeat = down  # type: ignore[method-assign]
    with pytest.raises(OSError, match="connection refused"):
        await heartbeat.beat()
    store.record_heartbeat = record  # type: ignore[method-assign]
    heartbeat.observe(delivery, Decision(State.SENT, "sent"))
    await heartbeat.beat()
    rows = await store.outcome_minutes(timedelta(hours=1))
    assert [(r.lane, r.outcome, r.count) for r in rows] == [("interactive", "sent", 2)]
    await heartbeat.stop()
    assert await store.list_workers() == []
