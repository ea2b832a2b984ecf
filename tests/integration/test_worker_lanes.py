"""The queueing text's "Debugging" symptoms that the worker itself must prevent, on both
engines: a reset stuck behind a bulk job (lanes with reserved capacity, not strict priority),
and a burst of synchronised retries after an outage (full jitter)."""

from __future__ import annotations

import time

from conftest import SideDB, msg
from worker_helpers import Provider, fast_config, in_state, running, wait_until

from postlane import State
from postlane.core.outcomes import Outcome
from postlane.core.policy import RetryPolicy
from postlane.store import Store
from postlane.worker import Worker


async def test_a_reset_does_not_queue_behind_a_bulk_backlog(store: Store, side: SideDB) -> None:
    provider = Provider(latency_s=0.05)
    await store.enqueue_many([msg(f"digest:{i}", lane="bulk") for i in range(300)])
    # Floors 3 (interactive) and 1 (bulk); bulk borrows the idle interactive slots.
    async with running(Worker(store, provider, config=fast_config(concurrency=4))):
        await wait_until(lambda: provider.in_flight == 4 and len(provider.requests) > 8,
                         what="bulk using every slot")
        enqueued = time.monotonic()
        r = await store.enqueue(msg("reset:urgent"))
        await in_state(store, r.id, State.SENT, timeout=5)
        waited = time.monotonic() - enqueued
        backlog = side.count("postlane_deliveries", "lane = 'bulk' AND state = 'pending'")
    assert waited < 0.5, f"the reset waited {waited:.2f}s behind the bulk lane"
    assert backlog > 200  # the bulk job was still far from done


async def test_a_bulk_lane_is_not_starved_by_interactive_volume(store: Store) -> None:
    provider = Provider(latency_s=0.05)
    await store.enqueue_many([msg(f"reset:{i}") for i in range(300)]
                             + [msg(f"digest:{i}", lane="bulk") for i in range(10)])
    async with running(Worker(store, provider, config=fast_config(concurrency=4))):
        # Its one reserved slot keeps bulk moving while interactive has far more waiting.
        await wait_until(lambda: sum(r.key.startswith("digest:") for r in provider.requests)
                         >= 3, timeout=2, what="bulk sends during an interactive burst")
        interactive = sum(r.key.startswith("reset:") for r in provider.requests)
    assert interactive < 300


async def test_retries_after_a_shared_failure_are_spread_by_jitter(
    store: Store, side: SideDB
) -> None:
    """Twenty sends fail together: their retries must not all come back at one instant."""
    provider = Provider()
    provider.script(lambda d: Outcome.transient("503") if d.attempts == 0 else None)
    ids = [r.id for r in await store.enqueue_many([msg(f"receipt:{i}") for i in range(20)])]
    config = fast_config(retry=RetryPolicy(base_s=30.0, cap_s=300.0))  # ceiling 60 s
    async with running(Worker(store, provider, config=config)):
        async def all_retrying() -> bool:
            return side.count("postlane_deliveries",
                              "state = 'pending' AND attempts = 1") == len(ids)
        await wait_until(all_retrying, what="every send to fail once")
    # Each delay as scheduled: from the failure's write (updated_at, the same statement's
    # now) to the retry, so the time the worker takes to stop does not count.
    delays = sorted(
        (d.run_at - d.updated_at).total_seconds()
        for d in [await store.get(i) for i in ids] if d is not None
    )
    assert len(delays) == len(ids)
    assert all(0.0 <= s <= 60.0 for s in delays)
    assert len(set(delays)) == len(ids)  # no two at the same instant
    assert delays[-1] - delays[0] > 20.0  # spread over the window, not bunched
