"""Staged replay of dead letters, on both engines, through a real worker."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from postlane import Message, State
from postlane.core.outcomes import Outcome
from postlane.core.policy import RetryPolicy
from postlane.dead_letters import replay_one, replay_selection
from postlane.errors import ReplayRefused
from postlane.providers.testing import RecordingProvider
from postlane.store.base import DeadLetterFilter, Store
from postlane.worker import Worker, WorkerConfig

pytestmark = pytest.mark.asyncio


def msg(i: int, **kw: object) -> Message:
    return Message(key=f"receipt:{i}", to=f"user{i}@example.com", subject=f"Receipt {i}",
                   text=f"You paid {i} EUR", lane="bulk", **kw)  # type: ignore[arg-type]


async def drain(store: Store, provider: RecordingProvider) -> Worker:
    worker = Worker(store, provider, config=WorkerConfig(
        drain=True, concurrency=10, poll_interval_s=0.05, controls_interval_s=0.05,
        retry=RetryPolicy(base_s=0.01, cap_s=0.05)))
    await worker.run()
    return worker


async def kill_all(store: Store, provider: RecordingProvider, n: int) -> list[int]:
    """Enqueue n messages and let the provider reject each permanently once."""
    ids = []
    for i in range(n):
        result = await store.enqueue(msg(i))
        provider.script_key(f"receipt:{i}", Outcome.permanent("550 mailbox unavailable"))
        ids.append(result.id)
    await drain(store, provider)
    for delivery_id in ids:
        delivery = await store.get(delivery_id)
        assert delivery is not None and delivery.state is State.DEAD
    return ids


async def test_expired_entry_is_refused_and_can_only_be_discarded(store: Store) -> None:
    provider = RecordingProvider()
    result = await store.enqueue(msg(1, expires_in=timedelta(seconds=30)))
    provider.script_key("receipt:1", Outcome.permanent("400 bad"))
    await drain(store, provider)
    later = datetime.now(UTC) + timedelta(minutes=5)
    with pytest.raises(ReplayRefused, match="no longer useful"):
        await replay_one(store, result.id, by="ops", now=later)
    # A validity window given at replay time refuses an entry that is too old for it.
    with pytest.raises(ReplayRefused, match="validity window"):
        await replay_one(store, result.id, by="ops", valid_for=timedelta(0))
    assert await store.discard_dead_letter(result.id, "token expired", "ops")
    with pytest.raises(ReplayRefused, match="discarded"):
        await replay_one(store, result.id, by="ops")
    entry = await store.dead_letter(result.id)
    assert entry is not None and entry.discard_reason == "token expired"
    assert (await store.stats()).dead_letters == {}


async def test_bulk_replay_waits_for_its_canary_and_keeps_the_key(store: Store) -> None:
    provider = RecordingProvider()
    ids = await kill_all(store, provider, 4)
    everything = DeadLetterFilter(reason="permanent")
    with pytest.raises(ReplayRefused, match="replay one entry"):
        await replay_selection(store, everything, by="ops")

    canary = await replay_one(store, ids[0], by="ops")
    assert canary.delivery_id == ids[0]
    with pytest.raises(ReplayRefused, match="canary has not been sent"):
        await replay_selection(store, everything, by="ops")

    await drain(store, provider)  # the canary goes out
    plan = await replay_selection(store, everything, by="ops", dry_run=True)
    assert plan.dry_run and plan.canary == ids[0] and plan.replay == ids[1:]
    plan = await replay_selection(store, everything, by="ops")
    assert plan.replay == ids[1:]
    await drain(store, provider)
    for i, delivery_id in enumerate(ids):
        delivery = await store.get(delivery_id)
        assert delivery is not None and delivery.state is State.SENT
        # The provider saw the original key on the failed attempt and on the replay.
        assert [s.key for s in provider.attempts_of(f"receipt:{i}")] == [f"receipt:{i}"] * 2
    assert provider.duplicates == 0
    timeline = [e.kind for e in await store.timeline(ids[1])]
    assert timeline[-3:] == ["replayed", "claimed", "sent"]


async def test_replayed_entries_are_never_bulk_replayed_twice(store: Store) -> None:
    provider = RecordingProvider()
    ids = await kill_all(store, provider, 3)
    await replay_one(store, ids[0], by="ops")
    await drain(store, provider)
    # The fix did not hold for the others: they die again after the bulk replay.
    for i in (1, 2):
        provider.script_key(f"receipt:{i}", Outcome.permanent("550 still unavailable"))
    plan = await replay_selection(store, DeadLetterFilter(), by="ops")
    assert plan.replay == ids[1:]
    await drain(store, provider)
    # One entry per message, however often it died (no replay loop), marked replayed...
    entries = await store.list_dead_letters(DeadLetterFilter())
    assert sorted(e.delivery_id for e in entries) == ids[1:]
    assert all(e.replay_count == 1 and e.replayed_by == "ops" for e in entries)
    assert entries[0].last_response == "550 still unavailable"
    # ...so a second bulk replay finds nothing to take.
    again = await replay_selection(store, DeadLetterFilter(), by="ops")
    assert again.replay == []


async def test_entry_keeps_a_usable_payload(store: Store) -> None:
    provider = RecordingProvider()
    [delivery_id] = await kill_all(store, provider, 1)
    entry = await store.dead_letter(delivery_id)
    assert entry is not None
    snap = entry.snapshot
    assert snap["idempotency_key"] == "receipt:0"
    assert snap["recipient"] == "user0@example.com"
    assert snap["subject"] == "Receipt 0" and snap["text_body"] == "You paid 0 EUR"
    assert entry.reason == "permanent"
    assert entry.last_response == "550 mailbox unavailable"
    assert [a["outcome"] for a in entry.attempt_history] == ["permanent"]
    assert "duration_ms" in entry.attempt_history[0]
