"""Graceful shutdown: ``stop()`` lets in-flight sends finish within the grace period; after
it, nothing is left in ``sending`` with a lease, and no outcome is lost or turned into a
resend, wherever the stop catches the worker (mid-claim, mid-send, waiting for a rate-limit
slot, mid-ack)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from conftest import SideDB, msg
from worker_helpers import Provider, event_kinds, fast_config, wait_until

from postlane import State
from postlane.limiter import MemoryLimiter
from postlane.store import Store
from postlane.worker import Worker


class SlowStore:
    """A store whose claims or acks take a while to come back (a slow network), so a stop
    lands in the middle of one. Everything else goes straight to the real store."""

    def __init__(self, inner: Store, *, claim_delay: float = 0.0, ack_delay: float = 0.0):
        self.inner = inner
        self.claim_delay = claim_delay
        self.ack_delay = ack_delay
        self.claim_returning = asyncio.Event()
        self.acking = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def claim_batch(self, *args: Any, **kwargs: Any) -> Any:
        batch = await self.inner.claim_batch(*args, **kwargs)
        if batch and self.claim_delay:
            self.claim_returning.set()
            await asyncio.sleep(self.claim_delay)  # leased in the database, not yet here
        return batch

    async def set_state_if_sending_many(self, *args: Any, **kwargs: Any) -> Any:
        if self.ack_delay:
            self.acking.set()
            await asyncio.sleep(self.ack_delay)
        return await self.inner.set_state_if_sending_many(*args, **kwargs)


def assert_nothing_leased(side: SideDB) -> None:
    assert side.query("SELECT id, state, lease_owner FROM postlane_deliveries "
                      "WHERE state = 'sending' OR lease_owner IS NOT NULL") == []


async def stop(worker: Worker, task: asyncio.Task[None], within: float = 5.0) -> float:
    worker.stop()
    started = time.monotonic()
    async with asyncio.timeout(within):
        await task
    return time.monotonic() - started


# -- graceful shutdown -------------------------------------------------------------------
async def test_stop_lets_in_flight_sends_finish_within_the_grace_period(
    store: Store, side: SideDB
) -> None:
    provider = Provider(latency_s=0.3)
    await store.enqueue_many([msg(f"reset:{i}") for i in range(4)])
    worker = Worker(store, provider, config=fast_config(grace_s=5.0))
    task = asyncio.create_task(worker.run())
    await wait_until(lambda: provider.in_flight == 4, what="four sends in flight")
    worker.stop()
    started = time.monotonic()
    async with asyncio.timeout(5):
        await task
    assert time.monotonic() - started < 2.0
    assert side.count("postlane_deliveries", "state = 'sent'") == 4
    assert side.count("postlane_deliveries", "lease_owner IS NOT NULL") == 0


@pytest.mark.parametrize("deduplicate", [False, True], ids=["no-dedupe", "dedupe"])
async def test_sends_slower_than_the_grace_are_cancelled_and_recorded(
    store: Store, side: SideDB, deduplicate: bool
) -> None:
    provider = Provider(deduplicate=deduplicate, latency_s=30.0)
    ids = [r.id for r in await store.enqueue_many([msg(f"reset:{i}") for i in range(3)])]
    worker = Worker(store, provider, config=fast_config(grace_s=0.2))
    task = asyncio.create_task(worker.run())
    await wait_until(lambda: provider.in_flight == 3, what="three sends in flight")
    worker.stop()
    started = time.monotonic()
    async with asyncio.timeout(5):
        await task
    assert time.monotonic() - started < 2.0
    # Nothing is left leased; each cancelled send is ambiguous (it may have arrived), or
    # requeued when the provider deduplicates a retry with the same key.
    assert side.count("postlane_deliveries", "state = 'sending'") == 0
    assert side.count("postlane_deliveries", "lease_owner IS NOT NULL") == 0
    for i in ids:
        d = await store.get(i)
        assert d is not None
        assert d.state is (State.PENDING if deduplicate else State.AMBIGUOUS)
        assert d.attempts == 1
        assert d.last_error == "cancelled at shutdown while in flight"
        assert (await event_kinds(store, i))[-1] == (
            "ambiguous_retry" if deduplicate else "ambiguous")


async def test_stop_releases_deliveries_still_waiting_for_a_rate_limit_slot(
    store: Store, side: SideDB
) -> None:
    """Claimed, but the limiter had no slot for them yet when the worker stopped: they go
    back to pending unspent; none is left leased until its lease expires."""
    provider = Provider()
    ids = [r.id for r in await store.enqueue_many([msg(f"reset:{i}") for i in range(6)])]
    limiter = MemoryLimiter(rate=2.0)  # one slot every half second
    worker = Worker(store, provider, limiter=limiter,
                    config=fast_config(grace_s=0.3, concurrency=8))
    task = asyncio.create_task(worker.run())
    await wait_until(lambda: len(provider.requests) >= 1, what="a first send")
    await wait_until(lambda: side.count("postlane_deliveries", "state = 'sending'") >= 3,
                     what="claimed deliveries waiting for slots")
    worker.stop()
    async with asyncio.timeout(5):
        await task
    assert side.count("postlane_deliveries", "state = 'sending'") == 0
    assert side.count("postlane_deliveries", "lease_owner IS NOT NULL") == 0
    sent = {r.delivery_id for r in provider.requests}
    for i in ids:
        d = await store.get(i)
        assert d is not None
        if i in sent:
            assert d.state is State.SENT
        else:
            assert (d.state, d.attempts) == (State.PENDING, 0)


async def test_a_stop_in_the_middle_of_a_claim_gives_the_claimed_rows_back(
    store: Store, side: SideDB
) -> None:
    provider = Provider()
    ids = [r.id for r in await store.enqueue_many([msg(f"reset:{i}") for i in range(5)])]
    slow = SlowStore(store, claim_delay=0.5)
    worker = Worker(slow, provider, config=fast_config())  # type: ignore[arg-type]
    task = asyncio.create_task(worker.run())
    await wait_until(slow.claim_returning.is_set, what="a claim on its way back")
    await stop(worker, task)
    assert_nothing_leased(side)
    assert provider.requests == []
    for i in ids:
        d = await store.get(i)
        assert d is not None and (d.state, d.attempts) == (State.PENDING, 0)


async def test_a_stop_in_the_middle_of_an_ack_waits_for_it(
    store: Store, side: SideDB
) -> None:
    provider = Provider(deduplicate=False)
    await store.enqueue_many([msg(f"reset:{i}") for i in range(3)])
    slow = SlowStore(store, ack_delay=0.3)
    worker = Worker(slow, provider, config=fast_config())  # type: ignore[arg-type]
    task = asyncio.create_task(worker.run())
    await wait_until(slow.acking.is_set, what="an ack being written")
    await stop(worker, task)
    assert_nothing_leased(side)
    # The outcomes were written, not lost (and not turned into a resend).
    assert side.count("postlane_deliveries", "state = 'sent'") == 3
    assert len(provider.requests) == 3 and provider.duplicates == 0


async def test_an_outcome_reached_before_the_grace_ran_out_is_kept(
    store: Store, side: SideDB
) -> None:
    """The provider accepted; the stop's grace runs out while the worker is still busy with
    the bookkeeping after the answer (here: the breaker). The answer must still count."""
    provider = Provider(deduplicate=False)
    r = await store.enqueue(msg("reset:1"))
    worker = Worker(store, provider, config=fast_config(grace_s=0.2))
    observing = asyncio.Event()

    async def slow_observe(*args: Any, **kwargs: Any) -> None:
        observing.set()
        await asyncio.sleep(5)

    worker.breaker.observe = slow_observe  # type: ignore[method-assign]
    task = asyncio.create_task(worker.run())
    await wait_until(observing.is_set, what="the answer to arrive")
    assert await stop(worker, task) < 2.0
    assert_nothing_leased(side)
    d = await store.get(r.id)
    assert d is not None and d.state is State.SENT
    assert "released" not in await event_kinds(store, r.id)
    assert len(provider.requests) == 1
