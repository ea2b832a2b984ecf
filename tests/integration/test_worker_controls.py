"""The worker under operator and fleet controls: the circuit breaker, lane pauses, drain
mode and reconciliation of ambiguous deliveries, on both engines."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

from conftest import SideDB, msg
from worker_helpers import (
    Provider,
    all_terminal,
    fast_config,
    in_state,
    lanes,
    running,
    wait_until,
)

from postlane import DeadReason, State
from postlane.core.breaker import CONTROL_PREFIX, BreakerConfig, BreakerRecord
from postlane.core.message import Delivery
from postlane.core.outcomes import Outcome
from postlane.store import Claim, Store
from postlane.store.base import Control
from postlane.worker import Worker
from postlane.worker.controls import pause_lane, resume_lane

BREAKER = CONTROL_PREFIX + "recording"


def attempts_by_id(side: SideDB) -> dict[int, tuple[str, int]]:
    return {row[0]: (row[1], row[2]) for row in side.query(
        "SELECT id, state, attempts FROM postlane_deliveries ORDER BY id")}


# -- the circuit breaker -----------------------------------------------------------------
async def test_breaker_opens_on_a_provider_outage_pauses_probes_and_closes(
    store: Store, side: SideDB
) -> None:
    outage = {"on": True}
    provider = Provider()
    provider.script(lambda d: Outcome.transient("503 upstream down") if outage["on"] else None)
    n = 20
    await store.enqueue_many([msg(f"receipt:{i}") for i in range(n)])
    config = fast_config(
        lanes=lanes(max_attempts=100),
        breaker=BreakerConfig(window_s=5.0, min_failures=5, failure_ratio=0.5, cooldown_s=0.6,
                              max_cooldown_s=2.0, probe_timeout_s=5.0),
    )
    worker = Worker(store, provider, config=config)
    async with running(worker):
        async def breaker_control() -> Control | None:
            return (await store.get_controls()).get(BREAKER)
        control = await wait_until(breaker_control, what="the breaker to open")
        record = BreakerRecord.from_json(control.value)
        assert record.state == "open"
        await asyncio.sleep(0.15)  # sends claimed before it opened finish (and fail)
        before = attempts_by_id(side)
        requests_before = len(provider.requests)
        outage["on"] = False  # the provider recovers during the cool-down
        await asyncio.sleep(max(0.0, record.until - time.time() - 0.1))
        # While open: nothing claimed, nothing sent, every row waits with its attempts.
        assert attempts_by_id(side) == before
        assert len(provider.requests) == requests_before
        assert {state for state, _ in before.values()} == {"pending"}
        assert all(attempts < 100 for _, attempts in before.values())

        async def closed() -> bool:
            return await breaker_control() is None
        await wait_until(closed, what="the breaker to close after the probe")
        await all_terminal(store)
    after = provider.requests[requests_before:]
    assert after, "no probe was sent"
    assert after[0].wall >= record.until - 0.01, "the probe went out before the cool-down"
    assert side.count("postlane_deliveries", "state = 'sent'") == n
    assert side.count("postlane_dead_letters") == 0
    assert worker.counters["dead:budget_exhausted"] == 0


# -- pause and resume --------------------------------------------------------------------
async def test_pausing_a_lane_stops_its_claims_while_the_other_lane_keeps_sending(
    store: Store, side: SideDB
) -> None:
    provider = Provider(latency_s=0.02)
    await store.enqueue_many([msg(f"digest:{i}", lane="bulk") for i in range(60)]
                             + [msg(f"reset:{i}") for i in range(100)])

    def sent_in(lane: str, since: float = 0.0) -> int:
        prefix = "digest:" if lane == "bulk" else "reset:"
        return sum(1 for r in provider.requests if r.key.startswith(prefix) and r.at >= since)

    # The default controls interval (0.5 s): the pause must show within about a second.
    config = fast_config(concurrency=2, controls_interval_s=0.5)
    async with running(Worker(store, provider, config=config)):
        await wait_until(lambda: sent_in("bulk") >= 3, what="bulk sends")
        await pause_lane(store, "bulk")
        paused_at = time.monotonic()
        await asyncio.sleep(1.0)
        bulk_after_pause = [r.at - paused_at for r in provider.requests
                            if r.key.startswith("digest:") and r.at >= paused_at]
        assert all(t < 1.0 for t in bulk_after_pause), bulk_after_pause
        stopped_at = sent_in("bulk")
        quiet_from = time.monotonic()
        await asyncio.sleep(0.4)
        assert sent_in("bulk") == stopped_at, "bulk kept sending while paused"
        assert sent_in("interactive", quiet_from) > 0, "interactive stopped too"
        pending_bulk = side.count("postlane_deliveries",
                                  "lane = 'bulk' AND state = 'pending'")
        assert pending_bulk > 0 and pending_bulk == 60 - stopped_at

        await resume_lane(store, "bulk")
        await wait_until(lambda: sent_in("bulk") > stopped_at, timeout=3,
                         what="bulk to resume")
    # Nothing was deleted or given up: every row is still there, sent or waiting.
    assert side.count("postlane_deliveries") == 160
    assert side.query("SELECT id, state, lease_owner FROM postlane_deliveries "
                      "WHERE state NOT IN ('sent', 'pending')") == []
    assert side.count("postlane_dead_letters") == 0


# -- drain -------------------------------------------------------------------------------
async def test_drain_exits_when_everything_is_terminal(store: Store, side: SideDB) -> None:
    provider = Provider(deduplicate=False)
    await store.enqueue_many([msg(f"reset:{i}") for i in range(10)])
    provider.script_key("reset:3", Outcome.transient("503"), Outcome.transient("503"))
    stale = await store.enqueue(msg("reset:stale", expires_in=timedelta(minutes=15)))
    side.shift(stale.id, "expires_at", -1.0)
    held = await store.enqueue(msg("reset:held"))
    provider.hang("reset:held", 5.0)  # times out: ambiguous, held for an operator
    worker = Worker(store, provider, config=fast_config(drain=True, attempt_timeout_s=0.2))
    async with asyncio.timeout(15):
        await worker.run()
    states = (await store.stats()).states
    assert states["pending"] == states["sending"] == 0
    assert states["sent"] == 10
    assert (await store.get("reset:3")).attempts == 3  # type: ignore[union-attr]
    d = await store.get(stale.id)
    assert d is not None and d.state is State.EXPIRED and d.attempts == 0
    entry = await store.dead_letter(stale.id)
    assert entry is not None and entry.reason == DeadReason.EXPIRED
    assert "reset:stale" not in provider.keys()  # noqa: SIM118 (a Counter of requests)
    # Ambiguous is not "in progress": it waits for a person, not for this worker.
    h = await store.get(held.id)
    assert h is not None and h.state is State.AMBIGUOUS


# -- reconciliation ----------------------------------------------------------------------
async def make_ambiguous(store: Store, side: SideDB, keys: list[str]) -> list[Delivery]:
    """Deliveries whose attempt started under a worker that then lost its lease."""
    ids = [r.id for r in await store.enqueue_many([msg(k) for k in keys])]
    claimed = await store.claim_batch("interactive", len(keys), "gone", timedelta(seconds=30))
    await store.start_attempts("gone", [Claim(d.id, d.claims) for d in claimed])
    for i in ids:
        side.expire_lease(i)
    rescued = await store.rescue_expired_leases()
    assert sorted(rescued.ambiguous) == sorted(ids)
    return [d for d in claimed]


async def test_reconcile_with_lookup_marks_sent_or_requeues(store: Store, side: SideDB) -> None:
    provider = Provider(deduplicate=False, lookup=True)
    arrived, lost = await make_ambiguous(store, side, ["reset:arrived", "reset:lost"])
    provider.accepted["reset:arrived"] = "esp-123"  # the provider has this one
    worker = Worker(store, provider, config=fast_config())
    assert await worker.reconcile_ambiguous() == 2
    d = await store.get(arrived.id)
    assert d is not None
    assert (d.state, d.provider_message_id, d.attempts) == (State.SENT, "esp-123", 1)
    assert d.sent_at is not None
    d = await store.get(lost.id)
    assert d is not None and (d.state, d.attempts) == (State.PENDING, 1)
    reconciled = [e.data for e in await store.timeline(lost.id) if e.kind == "reconciled"]
    assert reconciled == [{"resolution": "the provider does not have it",
                           "provider": "recording"}]  # the provider asked
    assert provider.requests == []  # looked up, nothing sent
    # The requeued one is sent by a running worker, once, with its key.
    async with running(worker):
        d = await in_state(store, lost.id, State.SENT)
    assert d.attempts == 2
    assert provider.keys() == {"reset:lost": 1}
    # A second reconciliation finds nothing left to do.
    assert await worker.reconcile_ambiguous() == 0


async def test_reconcile_without_dedupe_or_lookup_leaves_held_deliveries_alone(
    store: Store, side: SideDB
) -> None:
    provider = Provider(deduplicate=False, lookup=False)
    [held] = await make_ambiguous(store, side, ["reset:held"])
    worker = Worker(store, provider, config=fast_config())
    assert await worker.reconcile_ambiguous() == 0
    d = await store.get(held.id)
    assert d is not None and d.state is State.AMBIGUOUS
    # A resend lane policy accepts the possible duplicate.
    resend = Worker(store, provider, config=fast_config(lanes=lanes(on_ambiguous="resend")))
    assert await resend.reconcile_ambiguous() == 1
    d = await store.get(held.id)
    assert d is not None and d.state is State.PENDING


async def test_reconcile_respects_expiry_and_budget(store: Store, side: SideDB) -> None:
    provider = Provider(deduplicate=True)
    stale, spent = await make_ambiguous(store, side, ["reset:stale", "reset:spent"])
    side.shift(stale.id, "expires_at", -1.0)
    worker = Worker(store, provider, config=fast_config(lanes=lanes(max_attempts=1)))
    assert await worker.reconcile_ambiguous() == 2
    d = await store.get(stale.id)
    assert d is not None and d.state is State.EXPIRED
    entry = await store.dead_letter(stale.id)
    assert entry is not None and entry.reason == DeadReason.EXPIRED
    d = await store.get(spent.id)
    assert d is not None and (d.state, d.dead_reason) == (State.DEAD,
                                                          DeadReason.BUDGET_EXHAUSTED)
    entry = await store.dead_letter(spent.id)
    assert entry is not None and entry.reason == DeadReason.BUDGET_EXHAUSTED
