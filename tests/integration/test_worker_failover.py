"""Provider failover (issue 16 part 1) with two in-process sandboxes, on both engines.

The primary goes down mid-run (it answers 503 to everything, and its lookups fail too, as in
a real outage); a few sends reach it just as it fails and lose their answer (ambiguous: it
has them). Then, counted at both providers: every delivery is accepted exactly once across
the two, the ambiguous ones never reach the fallback (they are reconciled at the primary
once it answers again), the rest fail over, and once the primary's probe succeeds new sends
go back to it.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from postlane.core.breaker import CONTROL_PREFIX, BreakerConfig, BreakerRecord, opened
from postlane.core.message import Delivery
from postlane.core.outcomes import Outcome
from postlane.core.records import Route
from postlane.core.states import State
from postlane.errors import ConfigurationError
from postlane.metrics import WorkerMetrics
from postlane.providers.base import Capabilities
from postlane.providers.sandbox import SandboxConfig, SandboxProvider
from postlane.store import Store
from postlane.worker import Worker
from tests.conftest import msg
from tests.integration.worker_helpers import (
    all_terminal,
    fast_config,
    in_state,
    lanes,
    running,
    wait_until,
)

BREAKER = BreakerConfig(window_s=5.0, min_failures=4, failure_ratio=0.5, cooldown_s=0.3,
                        max_cooldown_s=0.6, probe_timeout_s=5.0)


class Sandbox(SandboxProvider):
    """The sandbox engine, which can be taken down and brought back, and which can accept
    chosen keys and then lose the answer (the connection drops after the request left)."""

    def __init__(self, account: str) -> None:
        super().__init__(SandboxConfig(account=account))
        self.lose_answer: set[str] = set()
        self.lookups: list[str] = []

    def down(self) -> None:
        self.engine.config = replace(self.engine.config, error_rate=1.0)

    def up(self) -> None:
        self.engine.config = replace(self.engine.config, error_rate=0.0)

    @property
    def is_down(self) -> bool:
        return self.engine.config.error_rate >= 1.0

    async def send(self, delivery: Delivery) -> Outcome:
        if delivery.key in self.lose_answer:
            self.lose_answer.discard(delivery.key)
            self.engine._accept(delivery.key, self.engine.clock())
            return Outcome.ambiguous("accepted, then the connection dropped")
        return await super().send(delivery)

    async def lookup(self, key: str) -> Outcome | None:
        self.lookups.append(key)
        if self.is_down:
            return Outcome.transient("503 service unavailable")
        return await super().lookup(key)

    def keys(self) -> set[str]:
        return set(self.engine.accepted_keys())


async def breaker_state(store: Store, account: str) -> str:
    control = (await store.get_controls()).get(CONTROL_PREFIX + account)
    return BreakerRecord.from_json(control.value).state if control else "closed"


async def test_primary_down_mid_run_fails_over_and_comes_back(store: Store) -> None:
    primary, fallback = Sandbox("primary"), Sandbox("fallback")
    config = fast_config(lanes=lanes(max_attempts=50), breaker=BREAKER)
    worker = Worker(store, primary, fallbacks=[(fallback, None)], config=config)
    before = [f"before:{i}" for i in range(20)]
    during = [f"during:{i}" for i in range(30)]
    lost = {"during:0", "during:1", "during:2"}
    after = [f"after:{i}" for i in range(20)]

    async with running(worker):
        await store.enqueue_many([msg(k) for k in before])
        await all_terminal(store)
        assert primary.keys() == set(before) and not fallback.keys()

        primary.down()
        primary.lose_answer |= lost
        await store.enqueue_many([msg(k) for k in during])

        async def failed_over() -> bool:
            return set(during) - lost <= fallback.keys()
        await wait_until(failed_over, timeout=20, what="the rest to fail over")
        assert await breaker_state(store, "primary") != "closed"
        for key in lost:  # accepted by the primary: held, never sent to the fallback
            delivery = await in_state(store, key, State.AMBIGUOUS)
            assert delivery.attempts >= 1
        assert not lost & fallback.keys()

        async def asked_primary() -> bool:  # reconciliation asks the primary, not the fallback
            return lost <= set(primary.lookups)
        # A reconcile round comes every rescue interval: the failover may finish before one.
        await wait_until(asked_primary, timeout=5, what="reconciliation to ask the primary")
        assert not lost & set(fallback.lookups)

        primary.up()
        for key in lost:
            await in_state(store, key, State.SENT, timeout=20)

        # The breaker probes with real traffic: a trickle until the primary's probe succeeds
        # (meanwhile the fallback carries what the probe does not take).
        probes: list[str] = []

        async def closed() -> bool:
            if await breaker_state(store, "primary") == "closed":
                return True
            probes.append(f"probe:{len(probes)}")
            await store.enqueue(msg(probes[-1]))
            return False
        await wait_until(closed, timeout=20, interval=0.2,
                         what="the primary's probe to close its breaker")
        await all_terminal(store, timeout=20)
        fallback_before = fallback.keys()
        await store.enqueue_many([msg(k) for k in after])
        states = await all_terminal(store, timeout=20)

    every = set(before) | set(during) | set(after) | set(probes)
    assert states == {"sent": len(every)}
    assert primary.keys() | fallback.keys() == every
    assert not primary.keys() & fallback.keys()  # exactly once across both
    assert primary.engine.stats.duplicates_suppressed == 0
    assert fallback.engine.stats.duplicates_suppressed == 0
    assert set(after) <= primary.keys() and fallback.keys() == fallback_before

    # The timeline says which provider sent what: some went to both, the same key each time.
    moved = 0
    for key in set(during) - lost:
        delivery = await store.get(key)
        assert delivery is not None
        attempts = [(e.kind, e.data.get("provider"))
                    for e in await store.timeline(delivery.id) if "outcome" in e.data]
        assert attempts[-1] == ("sent", "fallback")
        moved += ("retry_scheduled", "primary") in attempts
    assert moved >= 1
    reconciled = await store.get("during:0")
    assert reconciled is not None
    resolution = [e for e in await store.timeline(reconciled.id) if e.kind == "reconciled"]
    assert resolution[-1].data["provider"] == "primary"


async def test_an_account_failure_fails_over_at_once_unspent(store: Store) -> None:
    """An account-level refusal (bad credentials) opens the primary's breaker on the spot;
    the delivery certainly did not reach it, so the fallback sends it without waiting out the
    account's Retry-After, and no attempt is spent on it."""
    primary, fallback = Sandbox("primary"), Sandbox("fallback")

    async def refuse(delivery: Delivery) -> Outcome:
        return Outcome.account("401 invalid API key", retry_after_s=3600)
    primary.send = refuse  # type: ignore[method-assign]
    worker = Worker(store, primary, fallbacks=[(fallback, None)],
                    config=fast_config(breaker=BREAKER))
    metrics = WorkerMetrics(worker)
    async with running(worker):
        await store.enqueue(msg("reset:1"))
        delivery = await in_state(store, "reset:1", State.SENT, timeout=10)
    text = metrics.render().decode()
    for line in ('postlane_sends_total{lane="interactive",outcome="account",provider="primary"} '
                 '1.0',
                 'postlane_sends_total{lane="interactive",outcome="accepted",provider="fallback"} '
                 '1.0',
                 'postlane_sends_total{lane="interactive",outcome="accepted",provider="primary"} '
                 '0.0'):
        assert line in text, line
    assert fallback.keys() == {"reset:1"}
    assert delivery.attempts == 1  # the fallback's; the refusal spent none
    kinds = [(e.kind, e.data.get("provider")) for e in await store.timeline(delivery.id)
             if "outcome" in e.data]
    assert kinds == [("account_trouble", "primary"), ("sent", "fallback")]


async def test_a_delivery_pinned_to_a_provider_waits_for_it(store: Store) -> None:
    """Ambiguous at the fallback and settled by its deduplication: every later attempt must
    go there, even once the primary is healthy; while the fallback is down it waits."""
    primary, fallback = Sandbox("primary"), Sandbox("fallback")
    worker = Worker(store, primary, fallbacks=[(fallback, None)], config=fast_config())
    created = await store.enqueue(msg("welcome:7"))
    await store.record_routes([Route(created.id, "fallback", 0, pinned=True)])
    fallback.down()
    async with running(worker):
        await wait_until(lambda: fallback.engine.stats.errors >= 3,
                         what="retries at the pinned provider")
        assert not primary.keys() and primary.engine.stats.requests == 0
        fallback.up()
        await in_state(store, "welcome:7", State.SENT)
    assert fallback.keys() == {"welcome:7"} and not primary.keys()
    route = (await store.delivery_routes([created.id]))[created.id]
    assert route.provider == "fallback" and route.pinned


async def test_a_pinned_delivery_waits_while_its_provider_is_open(store: Store) -> None:
    primary, fallback = Sandbox("primary"), Sandbox("fallback")
    worker = Worker(store, primary, fallbacks=[(fallback, None)], config=fast_config())
    created = await store.enqueue(msg("welcome:8"))
    await store.record_routes([Route(created.id, "fallback", 0, pinned=True)])
    await store.set_control(CONTROL_PREFIX + "fallback",
                            opened(time.time(), BreakerConfig(cooldown_s=3600), "test").as_json())
    async with running(worker):
        async def waiting() -> bool:
            return any(e.kind == "waiting_for_provider"
                       for e in await store.timeline(created.id))
        await wait_until(waiting, what="the pinned delivery to wait for its provider")
        assert primary.engine.stats.requests == fallback.engine.stats.requests == 0
        await store.set_control(CONTROL_PREFIX + "fallback", None)
        await in_state(store, "welcome:8", State.SENT)
    assert fallback.keys() == {"welcome:8"} and not primary.keys()


def test_the_same_account_twice_is_refused(store: Store) -> None:
    with pytest.raises(ConfigurationError, match="twice"):
        Worker(store, Sandbox("a"), fallbacks=[(Sandbox("a"), None)])


class DedupOnly(Sandbox):
    """A provider that deduplicates by key but cannot be asked whether it has one (like the
    generic HTTP adapter or Resend)."""

    def __init__(self, account: str) -> None:
        super().__init__(account)
        self.capabilities = Capabilities(deduplicates_by_key=True)


async def test_ambiguous_at_a_deduplicating_fallback_is_pinned_there(store: Store) -> None:
    """Ambiguous at the fallback, which cannot be asked but deduplicates: the reconciler pins
    the delivery to it before putting it back, so even with the primary healthy again its
    retry goes to the fallback (a suppressed duplicate there), never to the primary."""
    primary, fallback = Sandbox("primary"), DedupOnly("fallback")
    fallback.lose_answer.add("reset:9")
    await store.set_control(CONTROL_PREFIX + "primary",
                            opened(time.time(), BreakerConfig(cooldown_s=3600), "test").as_json())
    worker = Worker(store, primary, fallbacks=[(fallback, None)], config=fast_config())
    created = await store.enqueue(msg("reset:9"))
    async with running(worker):
        async def pinned() -> bool:
            route = (await store.delivery_routes([created.id])).get(created.id)
            return route is not None and route.pinned
        await wait_until(pinned, what="the reconciler to pin the delivery")
        await store.set_control(CONTROL_PREFIX + "primary", None)  # the primary is back
        delivery = await in_state(store, "reset:9", State.SENT)
    assert primary.engine.stats.requests == 0
    assert fallback.keys() == {"reset:9"}
    assert fallback.engine.stats.duplicates_suppressed == 1
    kinds = [(e.kind, e.data.get("provider")) for e in await store.timeline(delivery.id)
             if "provider" in e.data]
    assert kinds == [("ambiguous", "fallback"), ("reconciled", "fallback"), ("sent", "fallback")]
