"""The bulk-import text's "Before enabling a large import, test these cases", in-process:
two Worker objects (different owners, each with its own store connection) on one database,
a recording provider that keeps the provider-side truth, and time travel for leases.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import timedelta

from conftest import SideDB, msg, store_url
from worker_helpers import (
    Provider,
    all_terminal,
    delivery_when,
    event_kinds,
    fast_config,
    in_state,
    running,
    wait_until,
)

from postlane import DeadReason, Message, State, open_store
from postlane.core.lanes import LaneConfig
from postlane.core.message import Delivery
from postlane.core.outcomes import Outcome
from postlane.limiter import MemoryLimiter
from postlane.providers.base import Capabilities
from postlane.providers.base import Provider as ProviderBase
from postlane.store import Claim, Store
from postlane.worker import Worker

IMPORT = "imp-2026-03"


def welcome(user: int, **overrides: object) -> Message:
    fields: dict[str, object] = {"to": f"user{user}@example.com", "subject": "Welcome",
                                 "lane": "bulk", "import_id": IMPORT}
    fields.update(overrides)
    return msg(f"welcome:{user}:{IMPORT}", **fields)


async def test_two_workers_claiming_at_once_send_every_delivery_exactly_once(
    store: Store, side: SideDB
) -> None:
    n = 200
    await store.enqueue_many([welcome(i) for i in range(n)])
    workers: list[Worker] = []

    class BothClaimFirst(Provider):
        """Holds every send until both workers have claimed: on a loaded machine the
        second worker's start can otherwise come after the first has drained all 200."""

        async def send(self, delivery: Delivery) -> Outcome:
            while not all(w.counters["claimed"] for w in workers):
                await asyncio.sleep(0.005)
            return await super().send(delivery)

    provider = BothClaimFirst(deduplicate=False, latency_s=0.002)  # a repeat: a real dupe
    config = fast_config(drain=True, concurrency=8, batch_size=8)
    async with open_store(store_url(store)) as store_b:
        a = Worker(store, provider, config=config, owner="worker-a")
        b = Worker(store_b, provider, config=config, owner="worker-b")
        workers += [a, b]
        async with asyncio.timeout(30):
            await asyncio.gather(a.run(), b.run())
    assert len(provider.requests) == n
    assert set(provider.keys().values()) == {1}
    assert provider.duplicates == 0
    assert a.counters["claimed"] > 0 and b.counters["claimed"] > 0, "both workers took part"
    assert a.counters["claimed"] + b.counters["claimed"] == n
    assert side.count("postlane_deliveries", "state = 'sent' AND claims = 1 AND attempts = 1") == n
    # Each claim told once, by the row that ended it (0015).
    assert side.count("postlane_events", "claim IS NOT NULL") == n


async def test_a_rate_limit_response_closes_the_gate_for_the_whole_fleet(
    store: Store, side: SideDB
) -> None:
    """A 429 with Retry-After seen by either worker: no request leaves either of them until
    the stated delay has passed, and the throttled delivery spends no attempt."""
    retry_after = 1.0
    answered: list[float] = []

    def fifth_is_throttled(d: Delivery) -> Outcome | None:
        # By the fifth request both workers hold slots granted for the next few milliseconds.
        if not answered and len(provider.requests) == 5:
            answered.append(time.monotonic())
            return Outcome.throttled(retry_after, "429 Too Many Requests; Retry-After: 1")
        return None

    provider = Provider()
    provider.script(fifth_is_throttled)
    limiter = MemoryLimiter(rate=200, burst=1)  # one ceiling for the account, shared
    n = 30
    ids = [r.id for r in await store.enqueue_many([welcome(i) for i in range(n)])]
    config = fast_config(concurrency=8)
    async with open_store(store_url(store)) as store_b:
        a = Worker(store, provider, limiter=limiter, config=config, owner="worker-a")
        b = Worker(store_b, provider, limiter=limiter, config=config, owner="worker-b")
        async with running(a), running(b):
            await all_terminal(store, timeout=15)
    assert answered, "the provider never throttled"
    t429 = answered[0]
    later = [r.at - t429 for r in provider.requests if r.at > t429]
    assert later, "nothing was sent after the 429"
    assert min(later) >= retry_after - 0.01, (
        f"a request left {min(later):.3f}s after a 429 that said Retry-After {retry_after}")
    assert side.count("postlane_deliveries", "state = 'sent'") == n
    assert len({r.key for r in provider.requests}) == n
    throttled = [i for i in ids if "throttled" in await event_kinds(store, i)]
    assert throttled
    for i in throttled:
        d = await store.get(i)
        assert d is not None and d.attempts == 1  # the 429 was free


async def test_a_permanently_rejected_address_dead_letters_alone(
    store: Store, side: SideDB
) -> None:
    provider = Provider()
    rejected = welcome(7, to="no-such-user@example.com")
    provider.script_key(rejected.key, Outcome.permanent("550 5.1.1 user unknown"))
    await store.enqueue_many([welcome(i) for i in range(7)] + [rejected]
                             + [welcome(i) for i in range(8, 20)])
    async with running(Worker(store, provider, config=fast_config(drain=True))) as task:
        async with asyncio.timeout(15):
            await asyncio.shield(task)
    d = await store.get(rejected.key)
    assert d is not None and (d.state, d.dead_reason) == (State.DEAD, DeadReason.PERMANENT)
    entry = await store.dead_letter(d.id)
    assert entry is not None
    assert entry.snapshot["recipient"] == "no-such-user@example.com"
    assert entry.snapshot["import_id"] == IMPORT
    assert entry.last_response == "550 5.1.1 user unknown"
    assert side.count("postlane_deliveries", "state = 'sent'") == 19
    assert side.count("postlane_dead_letters") == 1
    assert provider.keys()[rejected.key] == 1  # not retried


async def test_the_same_import_event_delivered_twice_is_one_delivery_and_one_send(
    store: Store, side: SideDB
) -> None:
    first = await store.enqueue(welcome(1))
    again = await store.enqueue(welcome(1))
    both = await store.enqueue_many([welcome(1), welcome(2), welcome(2)])
    assert first.created and not again.created and again.id == first.id
    assert both[0].id == first.id and both[1].id == both[2].id
    assert not both[0].created and both[1].created and not both[2].created
    provider = Provider(deduplicate=False)
    async with running(Worker(store, provider, config=fast_config(drain=True))) as task:
        async with asyncio.timeout(15):
            await asyncio.shield(task)
    assert side.count("postlane_deliveries") == 2
    assert provider.keys() == Counter({welcome(1).key: 1, welcome(2).key: 1})
    assert provider.duplicates == 0


class Gated(ProviderBase):
    """Worker A's view of the provider: the request reaches the shared provider (and is
    accepted there), then A waits for ``release`` before its late answer arrives."""

    name = "recording"

    def __init__(self, backend: Provider, late: Outcome) -> None:
        self.backend = backend
        self.capabilities: Capabilities = backend.capabilities
        self.late = late
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def send(self, delivery: Delivery) -> Outcome:
        await self.backend.send(delivery)
        self.entered.set()
        await self.release.wait()
        return self.late


async def test_a_late_answer_after_the_lease_expired_never_overwrites_the_new_owner(
    store: Store, side: SideDB
) -> None:
    """Worker A's request hangs past its lease; the rescuer turns the delivery ambiguous,
    reconciliation requeues it (the provider deduplicates) and worker B sends it with the same
    key. A's late answer (a 400 that would dead-letter it) is dropped as lease_lost."""
    backend = Provider(deduplicate=True)
    gated = Gated(backend, Outcome.permanent("400 late answer from a lost attempt"))
    r = await store.enqueue(welcome(1, lane="interactive"))
    # A has one slot, so it cannot claim the delivery again while its request hangs.
    config_a = fast_config(concurrency=1, lanes=(LaneConfig("interactive", 1.0),),
                           attempt_timeout_s=60)
    a = Worker(store, gated, config=config_a, owner="worker-a")
    async with running(a):
        await wait_until(gated.entered.is_set, what="A's request to reach the provider")
        d = await in_state(store, r.id, State.SENDING)
        assert d.lease_owner == "worker-a" and d.attempt_started_at is not None
        side.expire_lease(r.id)  # A stalls past its lease (a GC pause, a partition...)
        d = await delivery_when(store, r.id, lambda d: d.claims == 1 and d.state in (
            State.AMBIGUOUS, State.PENDING), what="the rescuer to take the lease back")
        async with open_store(store_url(store)) as store_b:
            b = Worker(store_b, backend, config=fast_config(), owner="worker-b")
            async with running(b):
                d = await in_state(store, r.id, State.SENT)
            assert d.lease_owner is None
            final = d
            gated.release.set()  # A's answer finally arrives
            await wait_until(lambda: a.counters["lease_lost"] >= 1,
                             what="A to notice its outcome was dropped")
    d = await store.get(r.id)
    assert d is not None
    assert (d.state, d.provider_message_id, d.claims, d.dead_reason) == (
        State.SENT, final.provider_message_id, 2, None)
    assert d.attempts == final.attempts == 2
    assert await store.dead_letter(r.id) is None
    kinds = await event_kinds(store, r.id)
    assert kinds[:3] == ["enqueued", "claimed", "lease_expired"]
    assert kinds[-2:] == ["claimed", "sent"]
    assert "dead_lettered" not in kinds
    claims = [e.data["owner"] for e in await store.timeline(r.id) if e.kind == "claimed"]
    assert claims == ["worker-a", "worker-b"]
    # Both requests carried the same key; the provider recognised the repeat.
    assert backend.keys() == Counter({welcome(1).key: 2})
    assert backend.duplicates_suppressed == 1 and backend.duplicates == 0


async def test_a_worker_that_dies_after_the_provider_accepted_sends_nothing_twice(
    store: Store, side: SideDB
) -> None:
    """The worker exits after the transport accepted a message but before it recorded the
    outcome: the rescuer marks it ambiguous (the attempt had started), and the next worker
    resends with the same key, which the provider deduplicates."""
    provider = Provider(deduplicate=True)
    r = await store.enqueue(welcome(1))
    untouched = await store.enqueue(welcome(2))
    # The dead worker: claimed both, started and sent the first, then vanished.
    claimed = await store.claim_batch("bulk", 10, "dead-worker", timedelta(seconds=30))
    first = next(d for d in claimed if d.id == r.id)
    assert await store.start_attempts("dead-worker", [Claim(first.id, first.claims)]) == {r.id}
    assert (await provider.send(first)).kind == "accepted"
    for d in claimed:
        side.expire_lease(d.id)
    async with running(Worker(store, provider, config=fast_config(), owner="next")):
        # Each one by name, not "nothing pending": between the rescue (the first ambiguous,
        # the other pending) and the reconciler's resend of the first, the other may be
        # sent already, and an ambiguous delivery is not pending.
        d = await in_state(store, r.id, State.SENT)
        await in_state(store, untouched.id, State.SENT)
    assert "lease_expired" in await event_kinds(store, r.id)
    rescued = [e for e in await store.timeline(r.id) if e.kind == "lease_expired"]
    assert rescued[0].state == "ambiguous"
    assert provider.keys()[welcome(1).key] == 2
    assert provider.duplicates_suppressed == 1 and provider.duplicates == 0
    # The other was claimed but never attempted: plainly requeued, no attempt spent.
    other = await store.get(untouched.id)
    assert other is not None and other.state is State.SENT and other.attempts == 1
    rescued = [e for e in await store.timeline(untouched.id) if e.kind == "lease_expired"]
    assert rescued[0].state == "pending"
