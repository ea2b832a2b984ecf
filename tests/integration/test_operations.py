"""``postlane.operations``: the operator's cancel and resolve, below every shell, on both
engines. The CLI's own test (test_cli_operate.py) checks the words around them."""

from __future__ import annotations

from datetime import timedelta

import pytest

from postlane import Message, State
from postlane.operations import OperationRefused, Resolution, cancel, resolve
from postlane.store.base import Claim, Store, Transition


async def ambiguous(store: Store, *keys: str) -> list[int]:
    for key in keys:
        await store.enqueue(Message(key=key, to=f"{key}@example.com", text="t"))
    claimed = await store.claim_batch("interactive", len(keys), "w", timedelta(seconds=30))
    await store.start_attempts("w", [Claim(d.id, d.claims) for d in claimed])
    await store.set_state_if_sending_many("w", [
        Transition(d.id, d.claims, State.AMBIGUOUS, "ambiguous", detail={"outcome": "ambiguous"})
        for d in claimed])
    return [d.id for d in claimed]


async def test_each_resolution_writes_its_state_and_who_decided(store: Store) -> None:
    sent, resend, dead = await ambiguous(store, "a", "b", "c")
    await resolve(store, sent, Resolution.SENT, by="ops", provider_message_id="pm-1")
    await resolve(store, resend, Resolution.RESEND, by="ops")
    await resolve(store, dead, Resolution.DEAD, by="ops", note="checked: not sent")
    found = {i: await store.get(i) for i in (sent, resend, dead)}
    assert found[sent] is not None and found[sent].state is State.SENT
    assert found[sent].provider_message_id == "pm-1"
    assert found[resend] is not None and found[resend].state is State.PENDING
    assert found[resend].attempts == 1  # an operator's resend spends no attempt
    assert found[dead] is not None and found[dead].state is State.DEAD
    assert found[dead].dead_reason == "ambiguous_unresolved"
    events = await store.timeline(dead)
    assert events[-1].data["by"] == "ops" and events[-1].data["note"] == "checked: not sent"


async def test_resolve_refuses_what_is_not_ambiguous(store: Store) -> None:
    (done,) = await ambiguous(store, "a")
    await resolve(store, done, Resolution.SENT, by="ops")
    with pytest.raises(OperationRefused, match="is sent, not ambiguous"):
        await resolve(store, done, Resolution.DEAD, by="ops")
    with pytest.raises(OperationRefused, match="no delivery 999"):
        await resolve(store, 999, Resolution.SENT, by="ops")


async def test_cancel_withdraws_pending_and_refuses_the_rest(store: Store) -> None:
    result = await store.enqueue(Message(key="p", to="p@example.com", text="t"))
    await cancel(store, result.id, by="ops")
    delivery = await store.get(result.id)
    assert delivery is not None and delivery.state is State.CANCELLED
    events = await store.timeline(result.id)
    assert "cancelled by ops" in str(events[-1].data)
    with pytest.raises(OperationRefused, match="nothing cancelled"):
        await cancel(store, result.id, by="ops")
