"""Shared helpers of the worker integration tests (tests/integration/test_worker_*.py).

The worker runs for real as an asyncio task on the ``store`` fixture's database; tests wait
on conditions (polling the store with a deadline) rather than sleeping fixed times, and move
delayed rows forward with ``SideDB.make_due`` instead of waiting for them.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections import Counter, defaultdict, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, TypeVar

from postlane.core.breaker import BreakerConfig
from postlane.core.lanes import LaneConfig
from postlane.core.message import Delivery
from postlane.core.outcomes import Outcome
from postlane.core.policy import RetryPolicy
from postlane.core.states import State
from postlane.providers.testing import RecordingProvider
from postlane.store import Store
from postlane.worker import Worker, WorkerConfig

T = TypeVar("T")

LANES = (LaneConfig("interactive", 0.7, max_attempts=6), LaneConfig("bulk", 0.3, max_attempts=8))


def lanes(**interactive: Any) -> tuple[LaneConfig, ...]:
    """The two default lanes, with ``interactive`` overridden (max_attempts, on_ambiguous...)."""
    return (replace(LANES[0], **interactive), LANES[1])


def fast_config(**overrides: Any) -> WorkerConfig:
    """A worker tuned for tests: quick polls, quick retries, a breaker that stays out of the
    way unless a test asks for one."""
    fields: dict[str, Any] = {
        "concurrency": 4,
        "lanes": LANES,
        "batch_size": 10,
        "lease": timedelta(seconds=30),
        "attempt_timeout_s": 5.0,
        "poll_interval_s": 0.05,
        "grace_s": 2.0,
        "rescue_interval_s": 0.1,
        "controls_interval_s": 0.05,
        "retry": RetryPolicy(base_s=0.01, cap_s=0.05, throttle_default_s=0.01),
        "breaker": BreakerConfig(min_failures=10_000),
    }
    fields.update(overrides)
    return WorkerConfig(**fields)


@dataclass(frozen=True, slots=True)
class Request:
    """One request as the provider saw it arrive."""

    key: str
    delivery_id: int
    at: float
    """``time.monotonic()`` when it arrived."""
    wall: float
    """``time.time()`` when it arrived (the breaker's clock)."""


class Provider(RecordingProvider):
    """``RecordingProvider`` plus what the worker tests need to see and to script:

    - ``requests``: every request as it arrives (before any latency), with its key;
    - ``hang(key, seconds)``: the next request of ``key`` is accepted by the provider and
      its answer arrives only after ``seconds`` (accept-then-timeout when that exceeds
      the worker's attempt timeout);
    - ``raise_for[key]``: the adapter raises (a bug: handler_error);
    - ``in_flight`` / ``max_in_flight``.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.requests: list[Request] = []
        self.raise_for: dict[str, BaseException] = {}
        self.in_flight = 0
        self.max_in_flight = 0
        self._hangs: dict[str, deque[float]] = defaultdict(deque)

    def hang(self, key: str, *seconds: float) -> None:
        self._hangs[key].extend(seconds)

    def keys(self) -> Counter[str]:
        return Counter(r.key for r in self.requests)

    def requests_of(self, delivery_id: int) -> list[Request]:
        return [r for r in self.requests if r.delivery_id == delivery_id]

    async def send(self, delivery: Delivery) -> Outcome:
        self.requests.append(Request(delivery.key, delivery.id, time.monotonic(), time.time()))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            error = self.raise_for.get(delivery.key)
            if error is not None:
                raise error
            hangs = self._hangs.get(delivery.key)
            if hangs:
                seconds = hangs.popleft()
                provider_id = self._accept(delivery.key)  # it arrived and was accepted
                await asyncio.sleep(seconds)
                return Outcome.accepted(provider_id)
            return await super().send(delivery)
        finally:
            self.in_flight -= 1


@asynccontextmanager
async def running(worker: Worker, *, stop_timeout: float = 15.0) -> AsyncIterator[
        asyncio.Task[None]]:
    """Run ``worker`` as a task; on exit stop it gracefully and surface any error it raised."""
    task = asyncio.create_task(worker.run(), name=f"worker-{worker.owner}")
    try:
        yield task
    finally:
        worker.stop()
        async with asyncio.timeout(stop_timeout):
            await task


async def wait_until(
    condition: Callable[[], Awaitable[T | None] | T | None],
    *,
    timeout: float = 10.0,
    interval: float = 0.02,
    what: str = "condition",
) -> T:
    """Poll ``condition`` (sync or async) until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        result = condition()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result  # type: ignore[return-value]
        last = result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")
        await asyncio.sleep(interval)


async def delivery_when(
    store: Store, id_or_key: int | str, predicate: Callable[[Delivery], bool], *,
    timeout: float = 10.0, what: str = "",
) -> Delivery:
    """The delivery, once ``predicate`` holds for it."""
    async def check() -> Delivery | None:
        d = await store.get(id_or_key)
        return d if d is not None and predicate(d) else None
    return await wait_until(check, timeout=timeout, what=what or f"delivery {id_or_key!r}")


async def in_state(store: Store, id_or_key: int | str, *states: State,
                   timeout: float = 10.0) -> Delivery:
    return await delivery_when(store, id_or_key, lambda d: d.state in states, timeout=timeout,
                               what=f"delivery {id_or_key!r} in {[str(s) for s in states]}")


async def all_terminal(store: Store, timeout: float = 10.0) -> dict[str, int]:
    async def check() -> dict[str, int] | None:
        states = (await store.stats()).states
        busy = states.get("pending", 0) + states.get("sending", 0)
        return None if busy else {k: v for k, v in states.items() if v}
    return await wait_until(check, timeout=timeout, what="every delivery terminal")


async def event_kinds(store: Store, delivery_id: int) -> list[str]:
    return [e.kind for e in await store.timeline(delivery_id)]
