"""The worker rides out a limiter (Redis) outage and database errors: nothing stays leased,
nothing is lost, and sending resumes by itself once the part is back."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from postlane import Message, State
from postlane.core.attachments import Attachment
from postlane.limiter.base import Reservation
from postlane.limiter.memory import MemoryLimiter
from postlane.providers.testing import RecordingProvider
from postlane.store.base import Store
from postlane.worker import Worker
from tests.integration.worker_helpers import fast_config

pytestmark = pytest.mark.asyncio


class FlakyLimiter(MemoryLimiter):
    """Raises like an unreachable Redis while ``down`` is set."""

    def __init__(self) -> None:
        super().__init__(rate=1000.0)
        self.down = True
        self.failures = 0

    async def reserve(self, n: int = 1, horizon_s: float = 1.0,
                      lane: str | None = None, *, spend_quota: bool = True) -> Reservation:
        if self.down:
            self.failures += 1
            raise ConnectionError("Redis is unreachable")
        return await super().reserve(n, horizon_s, lane, spend_quota=spend_quota)

    async def gate_remaining_s(self) -> float:
        if self.down:
            raise ConnectionError("Redis is unreachable")
        return await super().gate_remaining_s()


async def wait_for(predicate: Any, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_limiter_outage_sends_nothing_then_everything(store: Store) -> None:
    for i in range(30):
        await store.enqueue(Message(key=f"k{i}", to=f"u{i}@example.com", text="t"))
    provider = RecordingProvider()
    limiter = FlakyLimiter()
    worker = Worker(store, provider, limiter=limiter, config=fast_config())
    task = asyncio.create_task(worker.run())

    async def failed_a_few_times() -> bool:
        return limiter.failures >= 5

    await wait_for(failed_a_few_times)
    assert provider.sends == []  # fails closed: no slot, no send
    assert not task.done()  # and the worker is still alive
    assert worker.counters["limiter_errors"] >= 5  # postlane_limiter_errors_total
    limiter.down = False

    async def all_sent() -> bool:
        return (await store.stats()).states["sent"] == 30

    await wait_for(all_sent)
    worker.stop()
    await task
    assert len(provider.accepted) == 30 and provider.duplicates == 0
    stats = await store.stats()
    assert stats.states["sending"] == 0 and stats.states["pending"] == 0
    delivery = await store.get("k0")
    assert delivery is not None and delivery.attempts == 1  # the outage spent no attempt


class FlakyStore:
    """Delegates to a real store, failing some calls while ``down`` is set."""

    def __init__(self, store: Store, failing: set[str]) -> None:
        self._store = store
        self.failing = failing
        self.down = True
        self.failures = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if name not in self.failing:
            return attr

        async def maybe_fail(*args: Any, **kwargs: Any) -> Any:
            if self.down:
                self.failures += 1
                raise OSError(f"{name}: connection refused")
            return await attr(*args, **kwargs)
        return maybe_fail


@pytest.mark.parametrize("failing", [
    {"claim_batch"}, {"set_state_if_sending_many"}, {"start_attempts"},
    {"suppressed_among", "get_controls", "rescue_expired_leases"},
    {"attachments_among"},
])
async def test_database_errors_are_ridden_out(store: Store, failing: set[str]) -> None:
    provider = RecordingProvider()
    flaky = FlakyStore(store, failing)
    flaky.down = False  # a worker that cannot reach its database at start exits; later, it waits
    worker = Worker(flaky, provider, config=fast_config())  # type: ignore[arg-type]
    task = asyncio.create_task(worker.run())
    await asyncio.sleep(0.3)
    flaky.down = True
    # Parts are read only for deliveries that have some (the claim says which): give them
    # some where that read is the one failing.
    parts = ((Attachment("a.txt", b"x", "text/plain"),) if "attachments_among" in failing
             else ())
    for i in range(20):
        await store.enqueue(Message(key=f"d{i}", to=f"u{i}@example.com", text="t",
                                    attachments=parts))

    async def failed() -> bool:
        return flaky.failures >= 3

    await wait_for(failed)
    assert not task.done()
    flaky.down = False

    async def all_sent() -> bool:
        return (await store.stats()).states["sent"] == 20

    await wait_for(all_sent)
    worker.stop()
    await task
    assert provider.duplicates == 0 and len(provider.accepted) == 20
    for i in range(20):
        delivery = await store.get(f"d{i}")
        assert delivery is not None and delivery.state is State.SENT


async def test_a_redis_that_is_down_counts_as_limiter_errors(store: Store) -> None:
    """A real Redis client pointed at a port nobody listens on: every failed call is counted
    in ``postlane_limiter_errors_total``, nothing is sent, nothing is spent."""
    from postlane.limiter.redis import RedisLimiter
    from postlane.metrics import WorkerMetrics

    with socket.socket() as probe:  # a free port, closed again: connection refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    limiter = RedisLimiter.from_url(f"redis://127.0.0.1:{port}/0", rate=100.0)
    await store.enqueue(Message(key="k", to="u@example.com", text="t"))
    provider = RecordingProvider()
    worker = Worker(store, provider, limiter=limiter, config=fast_config())
    metrics = WorkerMetrics(worker)
    assert "postlane_limiter_errors_total 0.0" in metrics.render().decode()
    task = asyncio.create_task(worker.run())

    async def failed_twice() -> bool:
        return worker.counters["limiter_errors"] >= 2

    await wait_for(failed_twice)
    worker.stop()
    await task
    await limiter.close()
    text = metrics.render().decode()
    counted = next(line for line in text.splitlines()
                   if line.startswith("postlane_limiter_errors_total "))
    assert float(counted.split()[1]) >= 2
    assert provider.sends == []
    delivery = await store.get("k")
    assert delivery is not None and delivery.state is State.PENDING and delivery.attempts == 0
