"""``postlane.operations``: the operator's cancel and resolve, below every shell, on both
engines. The CLI's own test (test_cli_operate.py) checks the words around them."""

from __future__ import annotations

from datetime import timedelta

import pytest

from postlane import Message, State
from postlane.core.records import DeliveryFilter
from postlane.operations import (
    ConfirmationRequired,
    OperationRefused,
    Resolution,
    cancel,
    cancel_matching,
    resolve,
    resolve_matching,
)
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


# -- a filtered selection at once ----------------------------------------------------------
async def test_a_bulk_cancel_acts_only_on_what_its_preview_counted(store: Store) -> None:
    for i in range(7):
        await store.enqueue(Message(key=f"b:{i}", to=f"u{i}@example.com", text="t",
                                    lane="bulk"))
    kept = await store.enqueue(Message(key="i:0", to="i@example.com", text="t"))
    selection = DeliveryFilter(lane="bulk")
    preview = await cancel_matching(store, selection, by="ops", dry_run=True)
    assert (preview.matched, preview.dry_run, preview.acted) == (7, True, 0)
    assert preview.selection.state == "queued"  # narrowed to what cancel applies to
    with pytest.raises(ConfirmationRequired, match="confirm with expected=7"):
        await cancel_matching(store, selection, by="ops")
    # Arrivals after the preview are outside its bound; they are never swept in.
    late = await store.enqueue(Message(key="b:late", to="late@example.com", text="t",
                                       lane="bulk"))
    done = await cancel_matching(store, selection, by="ops", reason="campaign stopped",
                                 expected=preview.matched, upto_id=preview.upto_id)
    assert done.acted == 7
    assert (await store.count_deliveries(DeliveryFilter(state="cancelled")))[0] == 7
    for untouched in (late.id, kept.id):
        delivery = await store.get(untouched)
        assert delivery is not None and delivery.state is State.PENDING
    events = await store.timeline(preview.upto_id)
    assert events[-1].data == {"reason": "campaign stopped", "by": "ops"}


async def test_a_bulk_action_refuses_a_selection_grown_past_its_confirmation(
        store: Store) -> None:
    ids = await ambiguous(store, "a", "b", "c")
    preview = await resolve_matching(store, DeliveryFilter(), Resolution.SENT, by="ops",
                                     dry_run=True)
    assert preview.matched == 3 and preview.upto_id == max(ids)
    with pytest.raises(ConfirmationRequired, match=r"holds 3 .* more than the 2") as refused:
        await resolve_matching(store, DeliveryFilter(), Resolution.SENT, by="ops",
                               expected=2, upto_id=preview.upto_id)
    assert refused.value.preview.matched == 3
    assert (await store.count_deliveries(DeliveryFilter(state="ambiguous")))[0] == 3


async def test_a_bulk_resolve_settles_each_alike_and_skips_what_left_meanwhile(
        store: Store) -> None:
    first, second, third = await ambiguous(store, "a", "b", "c")
    preview = await resolve_matching(store, DeliveryFilter(state="ambiguous"),
                                     Resolution.DEAD, by="ops", dry_run=True)
    await resolve(store, second, Resolution.SENT, by="someone else")  # meanwhile
    done = await resolve_matching(store, DeliveryFilter(state="ambiguous"), Resolution.DEAD,
                                  by="ops", note="provider says never received",
                                  expected=preview.matched, upto_id=preview.upto_id)
    assert (done.matched, done.acted) == (2, 2)
    states = {i: (await store.get(i)).state for i in (first, second, third)}  # type: ignore[union-attr]
    assert states == {first: State.DEAD, second: State.SENT, third: State.DEAD}
    entry = await store.dead_letter(first)
    assert entry is not None and entry.reason == "ambiguous_unresolved"


async def test_bulk_actions_refuse_states_they_do_not_apply_to(store: Store) -> None:
    with pytest.raises(OperationRefused, match=r"cancel applies to .* not ambiguous"):
        await cancel_matching(store, DeliveryFilter(state="ambiguous"), by="ops",
                              dry_run=True)
    with pytest.raises(OperationRefused, match=r"resolve applies to .* not pending"):
        await resolve_matching(store, DeliveryFilter(state="pending"), Resolution.SENT,
                               by="ops", dry_run=True)
    with pytest.raises(ValueError, match="unknown state 'stuck'"):
        DeliveryFilter(state="stuck")


async def test_the_selection_filters_and_pages_newest_first(store: Store) -> None:
    for i in range(5):
        await store.enqueue(Message(key=f"w:{i}", to="same@example.com", text="t",
                                    lane="bulk", import_id="spring"))
    await store.enqueue(Message(key="other", to="other@example.com", text="t"))
    retried = (await store.claim_batch("interactive", 1, "w", timedelta(seconds=30)))[0]
    await store.set_state_if_sending_many("w", [Transition(
        retried.id, retried.claims, State.PENDING, "retry_scheduled", delay_s=60)])
    selection = DeliveryFilter(recipient="same@example.com", import_id="spring")
    first = await store.list_deliveries(selection, limit=3)
    second = await store.list_deliveries(selection, before=first[-1].id, limit=3)
    keys = [d.key for d in first + second]
    assert keys == [f"w:{i}" for i in (4, 3, 2, 1, 0)]
    assert [d.key for d in await store.list_deliveries(DeliveryFilter(state="retrying"))] \
        == ["other"]
    assert [d.key for d in await store.list_deliveries(
        DeliveryFilter(state="pending", lane="interactive"))] == []
    assert (await store.count_deliveries(DeliveryFilter(state="queued")))[0] == 6
    assert (await store.count_deliveries(DeliveryFilter(key="w:2")))[0] == 1
    assert (await store.count_deliveries(DeliveryFilter(template_id="none")))[0] == 0
