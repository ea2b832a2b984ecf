"""The on-call view's storage on both engines: the messages browser's keyset pages and
counts (the same ``list_deliveries``/``count_deliveries`` as ``GET /v1/messages``), bulk
cancel and discard guarded by state, workers' heartbeats and the outcome minutes; and the
core bulk operations over them (``postlane.operations``: discard, staged replay, probe now,
and a bulk cancel racing a worker; cancel and resolve have ``test_operations.py`` too)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from postlane import Message, State
from postlane.core.breaker import CONTROL_PREFIX, BreakerConfig, opened, probing
from postlane.core.records import (
    Claim,
    DeliveryFilter,
    Transition,
    WorkerHeartbeat,
    view_state,
)
from postlane.errors import ReplayRefused
from postlane.operations import (
    BulkResult,
    ConfirmationRequired,
    OperationRefused,
    Resolution,
    cancel_matching,
    discard_matching,
    probe_breaker,
    replay_matching,
    resolve_matching,
)
from postlane.providers.testing import RecordingProvider
from postlane.store import Store
from postlane.worker import Worker
from tests.conftest import SideDB
from tests.integration.worker_helpers import fast_config, running


async def enqueue(store: Store, key: str, **fields: object) -> int:
    message = Message(key=key, to=fields.pop("to", f"{key.replace(':', '-')}@example.com"),  # type: ignore[arg-type]
                      text="t", **fields)  # type: ignore[arg-type]
    return (await store.enqueue(message)).id


async def settle(store: Store, ids: list[int], state: State) -> None:
    """Claim ``ids`` (and only them: every other ready row must be settled or absent) and
    report ``state`` for each; ``pending`` requeues them an hour out after a spent attempt
    (retrying)."""
    claimed = []
    for lane in ("interactive", "bulk"):
        claimed += await store.claim_batch(lane, 1000, "w", timedelta(seconds=30))
    assert sorted(d.id for d in claimed) == sorted(ids)
    await store.start_attempts("w", [Claim(d.id, d.claims) for d in claimed])
    event = {State.DEAD: "dead_lettered", State.PENDING: "retry_scheduled"}.get(state,
                                                                                str(state))
    await store.set_state_if_sending_many("w", [
        Transition(d.id, d.claims, state, event, delay_s=3600.0 if state is State.PENDING else 0.0,
                   dead_reason="permanent" if state is State.DEAD else None,
                   detail={"outcome": "permanent" if state is State.DEAD else "transient"})
        for d in claimed])


# -- the browser -------------------------------------------------------------------------
async def test_keyset_pages_cover_every_delivery_once_newest_first(store: Store) -> None:
    ids = [await enqueue(store, f"k:{i}") for i in range(7)]
    seen: list[int] = []
    before = None
    while True:
        page = await store.list_deliveries(DeliveryFilter(), before=before, limit=3)
        if not page:
            break
        seen += [d.id for d in page]
        before = page[-1].id
    assert seen == sorted(ids, reverse=True)
    first = (await store.list_deliveries(DeliveryFilter(), limit=1))[0]
    assert (first.key, first.lane, first.state, first.attempts) == ("k:6", "interactive",
                                                                    "pending", 0)
    assert first.created_at is not None and view_state(first) == "pending"


async def test_every_filter_narrows(store: Store, side: SideDB) -> None:
    a = await enqueue(store, "a", lane="bulk", import_id="spring", to="x@example.com")
    b = await enqueue(store, "b", lane="bulk", to="x@example.com")
    c = await enqueue(store, "c")
    side.query("UPDATE postlane_messages SET template_id = 'welcome', template_version = 1 "
               "WHERE id = ?", (b,))

    async def ids(**fields: object) -> list[int]:
        found = await store.list_deliveries(DeliveryFilter(**fields))  # type: ignore[arg-type]
        count, top = await store.count_deliveries(DeliveryFilter(**fields))  # type: ignore[arg-type]
        assert (count, top) == (len(found), found[0].id if found else 0)
        return [d.id for d in found]

    assert await ids(lane="bulk") == [b, a]
    assert await ids(import_id="spring") == [a]
    assert await ids(template_id="welcome") == [b]
    assert await ids(recipient="x@example.com") == [b, a]
    assert await ids(key="c") == [c]
    assert await ids(lane="bulk", recipient="x@example.com", key="b") == [b]
    bounded = await store.list_deliveries(DeliveryFilter(lane="bulk"), upto_id=a)
    assert [d.id for d in bounded] == [a]
    assert await store.count_deliveries(DeliveryFilter(), upto_id=b) == (2, b)
    assert await ids(lane="nowhere") == []


async def test_states_as_the_browser_names_them(store: Store) -> None:
    dead = await enqueue(store, "dead")
    await settle(store, [dead], State.DEAD)
    retrying = await enqueue(store, "retrying")
    await settle(store, [retrying], State.PENDING)
    sent = await enqueue(store, "sent")
    await settle(store, [sent], State.SENT)
    fresh = await enqueue(store, "fresh")
    cancelled = await enqueue(store, "cancelled")
    assert await store.cancel(cancelled)

    async def ids(state: str) -> list[int]:
        return [d.id for d in await store.list_deliveries(DeliveryFilter(state=state))]

    assert await ids("pending") == [fresh]
    assert await ids("retrying") == [retrying]
    assert await ids("queued") == [fresh, retrying]
    assert await ids("dead") == [dead]
    assert await ids("sent") == [sent]
    assert await ids("cancelled") == [cancelled]
    assert await ids("ambiguous") == []
    row = (await store.list_deliveries(DeliveryFilter(state="retrying")))[0]
    assert view_state(row) == "retrying" and row.attempts == 1
    assert (await store.list_deliveries(DeliveryFilter(state="dead")))[0].dead_reason == "permanent"


def test_a_selection_refuses_an_unknown_state() -> None:
    with pytest.raises(ValueError, match="unknown state 'stuck'; one of: queued, pending"):
        DeliveryFilter(state="stuck")


async def test_count_stops_past_its_cap(store: Store) -> None:
    ids = [await enqueue(store, f"k:{i}") for i in range(5)][::-1]
    assert (await store.count_deliveries(DeliveryFilter(), cap=3))[0] == 4  # "more than 3"
    assert await store.count_deliveries(DeliveryFilter(), cap=10) == (5, ids[0])
    assert await store.count_deliveries(DeliveryFilter(), cap=3, upto_id=ids[2]) == (3, ids[2])


# -- bulk writes -------------------------------------------------------------------------
async def test_cancel_many_takes_only_pending_and_names_who(store: Store) -> None:
    sending = await enqueue(store, "sending")
    claimed = await store.claim_batch("interactive", 1, "w", timedelta(seconds=30))
    assert [d.id for d in claimed] == [sending]
    pending = [await enqueue(store, f"p:{i}") for i in range(3)]
    done = await store.cancel_many([*pending, sending, 999], "bad import", "ops")
    assert done == set(pending)
    for delivery_id in pending:
        delivery = await store.get(delivery_id)
        assert delivery is not None and delivery.state is State.CANCELLED
        event = (await store.timeline(delivery_id))[-1]
        assert (event.kind, event.data) == ("cancelled", {"reason": "bad import", "by": "ops"})
    still = await store.get(sending)
    assert still is not None and still.state is State.SENDING
    assert await store.cancel_many(pending, "again", "ops") == set()


async def test_discard_many_takes_only_open_dead_letters(store: Store) -> None:
    dead = [await enqueue(store, f"d:{i}") for i in range(3)]
    await settle(store, dead, State.DEAD)
    assert await store.discard_dead_letter(dead[0], "earlier", "someone")
    alive = await enqueue(store, "alive")
    done = await store.discard_dead_letters([*dead, alive], "unsubscribed", "ops")
    assert done == set(dead[1:])
    entry = await store.dead_letter(dead[1])
    assert entry is not None and entry.discard_reason == "unsubscribed"
    assert (await store.timeline(dead[1]))[-1].data == {"by": "ops", "reason": "unsubscribed"}


# -- heartbeats and outcome minutes ------------------------------------------------------
def beat(owner: str = "host:1:abc", in_flight: int = 0) -> WorkerHeartbeat:
    return WorkerHeartbeat(owner=owner, host="host", pid=1, version="0.1.0", provider="smtp",
                           lanes={"interactive": 0.7, "bulk": 0.3}, in_flight=in_flight,
                           interval_s=5.0)


async def test_heartbeats_are_upserted_aged_and_forgotten(store: Store, side: SideDB) -> None:
    await store.record_heartbeat(beat(in_flight=3), {})
    await store.record_heartbeat(beat("host:2:def"), {})
    await store.record_heartbeat(beat(in_flight=7), {})
    seen = {w.heartbeat.owner: w for w in await store.list_workers()}
    assert set(seen) == {"host:1:abc", "host:2:def"}
    first = seen["host:1:abc"]
    assert first.heartbeat == beat(in_flight=7)
    assert not first.gone and first.age_s < 5.0
    assert first.heartbeat_at >= first.started_at
    # A worker that stopped beating ages into "gone" (three intervals) on the database clock.
    if side.engine == "sqlite":
        side.query("UPDATE postlane_workers SET heartbeat_at = heartbeat_at - 16 "
                   "WHERE owner = 'host:2:def'")
    else:
        side.query("UPDATE postlane_workers SET heartbeat_at = heartbeat_at - "
                   "interval '16 seconds' WHERE owner = 'host:2:def'")
    seen = {w.heartbeat.owner: w for w in await store.list_workers()}
    assert seen["host:2:def"].gone and not seen["host:1:abc"].gone
    await store.forget_worker("host:1:abc")
    assert [w.heartbeat.owner for w in await store.list_workers()] == ["host:2:def"]
    # Gone for more than a day: dropped by the next heartbeat of any worker.
    if side.engine == "sqlite":
        side.query("UPDATE postlane_workers SET heartbeat_at = heartbeat_at - 86400")
    else:
        side.query("UPDATE postlane_workers SET heartbeat_at = heartbeat_at - interval '1 day'")
    await store.record_heartbeat(beat("host:3:fed"), {})
    assert [w.heartbeat.owner for w in await store.list_workers()] == ["host:3:fed"]


async def test_outcome_counts_add_up_per_minute_and_old_minutes_go(store: Store,
                                                                   side: SideDB) -> None:
    await store.record_heartbeat(beat(), {("bulk", "sent"): 5, ("bulk", "dead"): 1,
                                          ("interactive", "sent"): 0})
    await store.record_heartbeat(beat("host:2:def"), {("bulk", "sent"): 2})
    rows = await store.outcome_minutes(timedelta(hours=24))
    assert {(r.lane, r.outcome): r.count for r in rows} == {("bulk", "sent"): 7,
                                                            ("bulk", "dead"): 1}
    assert len({r.minute for r in rows}) == 1 and rows[0].minute % 60 == 0
    side.query("UPDATE postlane_outcome_minutes SET minute = minute - 3 * 86400")
    assert await store.outcome_minutes(timedelta(hours=24)) == []
    await store.record_heartbeat(beat(), {("bulk", "throttled"): 1})
    assert side.count("postlane_outcome_minutes") == 1  # the three-day-old minutes went


# -- the core bulk operations ------------------------------------------------------------
async def confirmed(action: object, store: Store, selection: DeliveryFilter,
                    *args: object, **kwargs: object) -> BulkResult:
    """A bulk operation as every shell runs it: previewed, then confirmed with the
    preview's count and bound."""
    run = action  # cancel_matching, resolve_matching or discard_matching
    preview = await run(store, selection, *args, dry_run=True, **kwargs)  # type: ignore[operator]
    assert isinstance(preview, BulkResult) and preview.dry_run
    done = await run(store, selection, *args, expected=preview.matched,  # type: ignore[operator]
                     upto_id=preview.upto_id, **kwargs)
    assert isinstance(done, BulkResult)
    return done


async def test_cancel_matching_keeps_to_what_was_counted(store: Store) -> None:
    ids = [await enqueue(store, f"spring:{i}", lane="bulk", import_id="spring")
           for i in range(5)]
    other = await enqueue(store, "reset:1")
    selection = DeliveryFilter(import_id="spring")
    preview = await cancel_matching(store, selection, by="apikey:ops#1", dry_run=True)
    assert (preview.matched, preview.upto_id) == (5, ids[4])
    late = await enqueue(store, "spring:late", lane="bulk", import_id="spring")
    assert await store.cancel(ids[4])  # left the selection meanwhile
    result = await cancel_matching(store, selection, by="apikey:ops#1", expected=5,
                                   upto_id=preview.upto_id)
    assert (result.matched, result.acted) == (4, 4)
    for delivery_id, state in ((late, State.PENDING), (other, State.PENDING),
                               (ids[0], State.CANCELLED), (ids[3], State.CANCELLED)):
        delivery = await store.get(delivery_id)
        assert delivery is not None and delivery.state is state
    assert (await store.timeline(ids[0]))[-1].data["by"] == "apikey:ops#1"
    with pytest.raises(OperationRefused, match=r"cancel applies to .*queued or pending or "
                                                r"retrying, not sent"):
        await cancel_matching(store, DeliveryFilter(state="sent"), by="ops")


async def test_resolve_matching_settles_held_ambiguous(store: Store) -> None:
    ids = [await enqueue(store, f"a:{i}") for i in range(3)]
    await settle(store, ids, State.AMBIGUOUS)
    result = await confirmed(resolve_matching, store, DeliveryFilter(), Resolution.SENT,
                             by="ops", note="seen in the provider's log")
    assert result.acted == 3
    for delivery_id in ids:
        delivery = await store.get(delivery_id)
        assert delivery is not None and delivery.state is State.SENT
        event = (await store.timeline(delivery_id))[-1]
        assert event.data["by"] == "ops" and event.data["note"] == "seen in the provider's log"
    assert (await confirmed(resolve_matching, store, DeliveryFilter(), Resolution.DEAD,
                            by="ops")).acted == 0


async def test_discard_and_staged_replay_of_a_selection(store: Store) -> None:
    ids = [await enqueue(store, f"digest:{i}", lane="bulk") for i in range(4)]
    await settle(store, ids, State.DEAD)
    with pytest.raises(ConfirmationRequired, match="confirm with expected=1"):
        await discard_matching(store, DeliveryFilter(key="digest:3"), by="ops")
    discarded = await confirmed(discard_matching, store, DeliveryFilter(key="digest:3"),
                                by="ops")
    assert (discarded.selection.state, discarded.matched, discarded.acted) == ("dead", 1, 1)
    entry = await store.dead_letter(ids[3])
    assert entry is not None and entry.discard_reason == "discarded by ops"
    selection = DeliveryFilter(state="dead", lane="bulk")
    first = await replay_matching(store, selection, by="ops")
    assert first.canary == ids[0] and first.replay == [ids[0]]  # one, the canary
    with pytest.raises(ReplayRefused, match="the canary has not been sent yet"):
        await replay_matching(store, selection, by="ops")
    await settle(store, [ids[0]], State.SENT)  # the cause is fixed: the canary goes out
    rest = await replay_matching(store, selection, by="ops")
    assert rest.canary == ids[0] and sorted(rest.replay) == ids[1:3]
    with pytest.raises(OperationRefused, match="by lane, import or template"):
        await replay_matching(store, DeliveryFilter(recipient="x@example.com"), by="ops")


async def test_probe_now_makes_an_open_breaker_due(store: Store) -> None:
    name = CONTROL_PREFIX + "smtp"
    with pytest.raises(OperationRefused, match="closed; nothing to probe"):
        await probe_breaker(store, "smtp", by="ops")
    await store.set_control(name, opened(1000.0, BreakerConfig(), "10+ failures").as_json())
    record = await probe_breaker(store, "smtp", by="ops", now=1001.0)
    assert record.until == 1001.0 and record.reason == "10+ failures"
    assert (await store.get_controls())[name].value["until"] == 1001.0
    await store.set_control(name, probing(record, 1002.0, "w", BreakerConfig()).as_json())
    with pytest.raises(OperationRefused, match="probing already"):
        await probe_breaker(store, "smtp", by="ops")


async def test_a_bulk_cancel_racing_a_worker_never_cancels_what_was_sent(store: Store) -> None:
    """Stress: a worker drains while an operator cancels the same selection page by page.
    Every delivery ends either sent or cancelled, never both, never sent after a cancel."""
    n = 300
    await store.enqueue_many([Message(key=f"race:{i}", to=f"r{i}@example.com", text="t",
                                      lane="bulk") for i in range(n)])
    # Sends slow enough that the drain outlasts a few of the operator's slices on either
    # engine (SQLite's, on the store's one thread, once drained it before the first slice).
    provider = RecordingProvider(latency_s=0.01)
    acted = 0
    async with running(Worker(store, provider, config=fast_config(concurrency=8,
                                                                  batch_size=5))):
        while True:
            # A slice of the selection at a time (its 7 oldest), so that both sides race.
            upto = sorted(d.id for d in await store.list_deliveries(
                DeliveryFilter(state="queued"), limit=n))[:7]
            if not upto:
                break
            preview = await cancel_matching(store, DeliveryFilter(lane="bulk"), by="ops",
                                            dry_run=True)
            result = await cancel_matching(store, DeliveryFilter(lane="bulk"), by="ops",
                                           expected=preview.matched, upto_id=upto[-1])
            acted += result.acted
            await asyncio.sleep(0.002)
        for _ in range(500):  # the worker's last acks
            if not (await store.count_deliveries(DeliveryFilter(state="sending"), cap=1))[0]:
                break
            await asyncio.sleep(0.01)
    final = {d.id: d.state for d in await store.list_deliveries(DeliveryFilter(), limit=n)}
    assert len(final) == n
    assert set(final.values()) <= {"sent", "cancelled"}
    cancelled = {i for i, s in final.items() if s == "cancelled"}
    assert acted == len(cancelled)  # every cancel counted was a delivery left cancelled
    sent_keys = set(provider.accepted)
    for delivery in await store.list_deliveries(DeliveryFilter(state="cancelled"), limit=n):
        assert delivery.key not in sent_keys
        assert "sent" not in [e.kind for e in await store.timeline(delivery.id)]
    assert 0 < len(cancelled) < n  # both sides took part
