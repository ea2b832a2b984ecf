"""A daily quota in the worker, on both engines: the bulk lane stops at the reserve and goes
back to the queue until the refill (no attempt spent, no busy loop), while interactive mail
still goes out from the reserve."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from conftest import SideDB, msg, store_url
from worker_helpers import (
    Provider,
    event_kinds,
    fast_config,
    in_state,
    running,
    wait_until,
)

from postlane import State
from postlane.limiter import DailyQuota, MemoryLimiter
from postlane.store import Store
from postlane.worker import Worker

# A stock of 10 (the other 10 paced one per 100 s over a 1000 s "day"); 5 kept from bulk.
QUOTA = DailyQuota(20, window_s=1000.0, burst=0.5, reserve=0.5)


async def test_bulk_yields_the_reserve_and_interactive_mail_still_goes_out(
    store: Store, side: SideDB,
) -> None:
    provider = Provider()
    limiter = MemoryLimiter(rate=None, quota=QUOTA)
    bulk = await store.enqueue_many([msg(f"digest:{i}", lane="bulk") for i in range(30)])
    async def bulk_put_back() -> bool:
        """Every unsent bulk delivery was claimed, refused a slot and put back for later."""
        later = side.now() + timedelta(seconds=50)
        ds = [await store.get(r.id) for r in bulk]
        return sum(d is not None and d.state is State.PENDING and d.run_at > later
                   for d in ds) == 25

    async with running(Worker(store, provider, limiter=limiter, config=fast_config())):
        await wait_until(bulk_put_back, timeout=30, what="bulk to stop at the reserve")
        resets = await store.enqueue_many([msg(f"reset:{i}") for i in range(3)])
        for reset in resets:
            await in_state(store, reset.id, State.SENT, timeout=5)
    keys = [r.key for r in provider.requests]
    assert sum(k.startswith("digest:") for k in keys) == 5  # the stock less the reserve
    assert sum(k.startswith("reset:") for k in keys) == 3
    # The rest of bulk waits for the quota's refill (about 100 s), unspent, put back once:
    # not for zero seconds in a loop of claims.
    waiting = [d for d in [await store.get(r.id) for r in bulk]
               if d is not None and d.state is State.PENDING]
    assert len(waiting) == 25
    assert all(d.attempts == 0 for d in waiting)
    for d in waiting:
        assert (await event_kinds(store, d.id)).count("throttled") == 1


async def test_worker_cli_keeps_to_a_daily_quota_and_says_so_when_a_drain_gives_up(
    store: Store, tmp_path: Path,
) -> None:
    """``--rate 20/d``: a stock of 10, 2 of it kept from bulk. Twelve bulk messages and one
    reset: the reset goes, bulk takes the stock down to the reserve (8, or 7 when the reset
    went first), the rest waits for the refill (over an hour away), and the bounded drain
    says why it gave up."""
    await store.enqueue_many([msg(f"digest:{i}", lane="bulk") for i in range(12)])
    reset = await store.enqueue(msg("reset:1"))
    done = await asyncio.to_thread(subprocess.run, [
        str(Path(sys.executable).with_name("postlane")), "--db", store_url(store), "worker",
        "--provider", "noop://", "--rate", "20/d", "--quota-burst", "0.5",
        "--quota-reserve", "0.2", "--drain", "--drain-timeout", "2s", "--concurrency", "4",
        "--batch-size", "20"], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 3, done.stderr
    assert (await store.get(reset.id)).state is State.SENT  # type: ignore[union-attr]
    states = (await store.stats()).states
    sent, pending = states.get("sent", 0), states.get("pending", 0)
    assert sent in (8, 9) and pending == 13 - sent, states
    said = " ".join(done.stderr.split())
    assert f"{pending} deliveries still waiting" in said, said[-400:]
    assert "a daily quota of 20 may hold the rest" in said, said[-400:]
