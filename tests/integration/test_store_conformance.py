"""The conformance suite: every ``Store`` method, run unchanged on SQLite and PostgreSQL.

The ``store`` fixture (tests/conftest.py) is parametrized over both engines; ``side`` is the
test's own connection to the same database, used to read raw rows and to move time forward
(there is no clock seam in the product).
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from conftest import SideDB, msg, store_url

from postlane import (
    ContentTooLarge,
    DeadReason,
    InvalidAddress,
    InvalidHeader,
    InvalidKey,
    InvalidMessage,
    KeyConflict,
    Limits,
    State,
    UnknownLane,
    open_store,
)
from postlane.core.message import Delivery
from postlane.store import Claim, Store, Transition
from postlane.store.base import MAX_RESPONSE_CHARS, DeadLetterFilter

LEASE = timedelta(seconds=30)
ALL_STATES = {str(s) for s in State}


def claim_of(d: Delivery) -> Claim:
    return Claim(d.id, d.claims)


def sent(d: Delivery, **kw: Any) -> Transition:
    return Transition(d.id, d.claims, State.SENT, "sent", **kw)


def retry(d: Delivery, delay_s: float = 0.0, spend: bool = True, **kw: Any) -> Transition:
    return Transition(d.id, d.claims, State.PENDING, "retry_scheduled", delay_s=delay_s,
                      spend_attempt=spend, **kw)


def dead(d: Delivery, reason: str = DeadReason.PERMANENT, **kw: Any) -> Transition:
    return Transition(d.id, d.claims, State.DEAD, "dead_lettered", dead_reason=reason, **kw)


async def kinds(store: Store, delivery_id: int) -> list[str]:
    return [e.kind for e in await store.timeline(delivery_id)]


async def claim_one(store: Store, owner: str = "w1", lane: str = "interactive",
                    lease: timedelta = LEASE) -> Delivery:
    got = await store.claim_batch(lane, 1, owner, lease)
    assert len(got) == 1, got
    return got[0]


async def state_of(store: Store, delivery_id: int) -> State:
    d = await store.get(delivery_id)
    assert d is not None
    return d.state


# ======================================================================================
# enqueue
# ======================================================================================
async def test_enqueue_creates_then_returns_existing(store: Store) -> None:
    first = await store.enqueue(msg("reset:1"))
    assert first.created is True
    assert first.key == "reset:1"
    again = await store.enqueue(msg("reset:1"))
    assert again.created is False
    assert again.id == first.id
    # The same key for other content is a bug in the caller: refused, nothing written.
    with pytest.raises(KeyConflict) as refused:
        await store.enqueue(msg("reset:1", subject="a different subject", to="bob@example.com"))
    assert (refused.value.key, refused.value.delivery_id) == ("reset:1", first.id)
    d = await store.get(first.id)
    assert d is not None
    # The first intent stays; neither later call wrote anything.
    assert d.subject == "Reset your password"
    assert d.recipient == "alice@example.com"
    assert await kinds(store, first.id) == ["enqueued"]
    other = await store.enqueue(msg("reset:2"))
    assert other.created is True
    assert other.id != first.id


async def test_enqueue_round_trips_every_field(store: Store) -> None:
    expires = datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)
    r = await store.enqueue(msg(
        "welcome:7:imp-1", to="bob@example.org", sender="noreply@example.com",
        subject="Welcome", text="plain", html="<p>html</p>", lane="bulk",
        headers={"X-Campaign": "spring", "Reply-To": "help@example.com"},
        metadata={"user_id": 7, "tags": ["a", "b"], "nested": {"ok": True}},
        import_id="imp-1", template_id="welcome", template_version=3, expires_at=expires,
    ))
    d = await store.get(r.id)
    assert d is not None
    assert await store.get("welcome:7:imp-1") == d
    assert (d.id, d.key, d.lane, d.channel) == (r.id, "welcome:7:imp-1", "bulk", "email")
    assert (d.recipient, d.sender, d.subject) == ("bob@example.org", "noreply@example.com",
                                                  "Welcome")
    assert (d.text, d.html) == ("plain", "<p>html</p>")
    assert d.headers == {"X-Campaign": "spring", "Reply-To": "help@example.com"}
    assert d.metadata == {"user_id": 7, "tags": ["a", "b"], "nested": {"ok": True}}
    assert (d.import_id, d.template_id, d.template_version) == ("imp-1", "welcome", 3)
    assert d.expires_at is not None
    assert abs((d.expires_at - expires).total_seconds()) < 0.01
    assert d.state == State.PENDING
    assert (d.attempts, d.claims) == (0, 0)
    assert d.lease_owner is None and d.lease_expires_at is None
    assert d.sent_at is None and d.finished_at is None
    for t in (d.run_at, d.created_at, d.updated_at):
        assert t.tzinfo is not None
    assert d.run_at <= datetime.now(UTC) + timedelta(seconds=1)
    # The replay form of the row is the original intent.
    m = d.as_message()
    assert (m.key, m.to, m.lane, m.import_id, m.template_version) == (
        "welcome:7:imp-1", "bob@example.org", "bulk", "imp-1", 3)


async def test_get_unknown(store: Store) -> None:
    assert await store.get(12345) is None
    assert await store.get("no-such-key") is None
    assert await store.timeline(12345) == []
    assert await store.dead_letter(12345) is None


async def test_enqueue_expires_in_and_delay_use_the_database_clock(
        store: Store, side: SideDB) -> None:
    r = await store.enqueue(msg("k", expires_in=timedelta(minutes=15),
                                delay=timedelta(hours=1)))
    d = await store.get(r.id)
    assert d is not None and d.expires_at is not None
    assert abs((d.expires_at - d.created_at).total_seconds() - 900) < 2
    assert abs((d.run_at - d.created_at).total_seconds() - 3600) < 2
    # Not yet due: nothing to claim.
    assert await store.claim_batch("interactive", 10, "w1", LEASE) == []
    side.make_due(r.id)
    assert [x.id for x in await store.claim_batch("interactive", 10, "w1", LEASE)] == [r.id]


async def test_enqueue_without_expiry(store: Store) -> None:
    d = await store.get((await store.enqueue(msg("k"))).id)
    assert d is not None and d.expires_at is None


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (msg("k", to="not an address"), InvalidAddress),
        (msg("k", to="alice@localhost"), InvalidAddress),
        (msg("k", headers={"X-Tag": "a\r\nBcc: victim@example.com"}), InvalidHeader),
        (msg("k", subject="Hi\nBcc: victim@example.com"), InvalidHeader),
        (msg("k", lane="marketing"), UnknownLane),
        (msg(""), InvalidKey),
        (msg("   "), InvalidKey),
        (msg("k", text="x" * 1_000_001, subject=""), ContentTooLarge),
        (msg("k", text=None, html=None), InvalidMessage),
    ],
    ids=["address", "no-domain-dot", "header-crlf", "subject-lf", "lane", "empty-key",
         "blank-key", "too-large", "no-body"],
)
async def test_invalid_messages_raise_before_writing(
        store: Store, side: SideDB, message: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        await store.enqueue(message)
    with pytest.raises(error):
        await store.enqueue_many([msg("good:1"), message, msg("good:2")])
    assert side.count("postlane_deliveries") == 0
    assert side.count("postlane_events") == 0


async def test_store_limits_apply(store: Store) -> None:
    store.limits = Limits(lanes=("interactive",), max_content_bytes=10)
    with pytest.raises(UnknownLane):
        await store.enqueue(msg("a", lane="bulk"))
    with pytest.raises(ContentTooLarge):
        await store.enqueue(msg("a", subject="", text="x" * 11))
    assert (await store.enqueue(msg("a", subject="", text="x" * 10))).created


# ======================================================================================
# enqueue_many
# ======================================================================================
async def test_enqueue_many_results_in_input_order(store: Store, side: SideDB) -> None:
    existing = await store.enqueue(msg("c"))
    results = await store.enqueue_many(
        [msg("a"), msg("b"), msg("a"), msg("c"), msg("d"), msg("b")]
    )
    assert [r.key for r in results] == ["a", "b", "a", "c", "d", "b"]
    assert [r.created for r in results] == [True, True, False, False, True, False]
    ids = {r.key: r.id for r in results if r.created}
    assert results[2].id == ids["a"]
    assert results[5].id == ids["b"]
    assert results[3].id == existing.id
    # New rows get ids in input order (so "oldest first" is the caller's order).
    assert ids["a"] < ids["b"] < ids["d"]
    assert side.count("postlane_deliveries") == 4
    a = await store.get(ids["a"])
    assert a is not None and a.subject == "Reset your password"
    # One "enqueued" entry per created row, none for duplicates; told by the delivery's
    # created_at, so the enqueue writes no event row.
    assert side.count("postlane_events") == 0
    for key in "abcd":
        d = await store.get(key)
        assert d is not None
        [entry] = await store.timeline(d.id)
        assert (entry.kind, entry.state, entry.at) == ("enqueued", "pending", d.created_at)


async def test_a_delivery_enqueued_by_an_earlier_postlane_reads_one_enqueued_entry(
        store: Store, side: SideDB) -> None:
    """Before the enqueue stopped writing its row, it wrote an ``enqueued`` event: such a
    delivery (an old worker's, during an upgrade) shows that row once, not a second entry
    made from ``created_at``."""
    d = await store.enqueue(msg("old"))
    if side.engine == "sqlite":
        side.query("INSERT INTO postlane_events (delivery_id, at, kind, state, data) "
                   "VALUES (?, 1000.0, 'enqueued', 'pending', '{}')", (d.id,))
    else:
        side.query("INSERT INTO postlane_events (delivery_id, at, kind, state) "
                   "VALUES (?, to_timestamp(1000), 'enqueued', 'pending')", (d.id,))
    claimed = await claim_one(store)
    entries = await store.timeline(claimed.id)
    assert [e.kind for e in entries] == ["enqueued", "claimed"]
    assert entries[0].at.timestamp() == 1000.0  # the row's, not the delivery's


async def test_enqueue_many_empty(store: Store) -> None:
    assert await store.enqueue_many([]) == []


async def test_enqueue_many_carries_every_field(store: Store) -> None:
    expires = datetime(2031, 1, 1, tzinfo=UTC)
    [r1, r2] = await store.enqueue_many([
        msg("m1", lane="bulk", headers={"X-A": "1"}, metadata={"n": 1}, import_id="imp",
            template_id="t", template_version=2, expires_at=expires, sender="s@example.com",
            html="<b>x</b>"),
        msg("m2", expires_in=timedelta(minutes=10), delay=timedelta(hours=2)),
    ])
    d1, d2 = await store.get(r1.id), await store.get(r2.id)
    assert d1 is not None and d2 is not None
    assert (d1.lane, d1.headers, d1.metadata, d1.import_id) == ("bulk", {"X-A": "1"},
                                                               {"n": 1}, "imp")
    assert (d1.template_id, d1.template_version, d1.sender, d1.html) == (
        "t", 2, "s@example.com", "<b>x</b>")
    assert d1.expires_at is not None and abs((d1.expires_at - expires).total_seconds()) < 0.01
    assert d2.expires_at is not None
    assert abs((d2.expires_at - d2.created_at).total_seconds() - 600) < 2
    assert abs((d2.run_at - d2.created_at).total_seconds() - 7200) < 2


# ======================================================================================
# claim_batch
# ======================================================================================
async def test_claim_filters_by_lane(store: Store) -> None:
    i = await store.enqueue(msg("i"))
    b = await store.enqueue(msg("b", lane="bulk"))
    assert [d.id for d in await store.claim_batch("interactive", 10, "w1", LEASE)] == [i.id]
    assert await store.claim_batch("interactive", 10, "w1", LEASE) == []
    assert [d.id for d in await store.claim_batch("bulk", 10, "w1", LEASE)] == [b.id]


async def test_claim_respects_limit_and_never_hands_out_twice(store: Store) -> None:
    ids = [r.id for r in await store.enqueue_many([msg(f"k{i}") for i in range(5)])]
    first = await store.claim_batch("interactive", 3, "w1", LEASE)
    second = await store.claim_batch("interactive", 3, "w2", LEASE)
    third = await store.claim_batch("interactive", 3, "w3", LEASE)
    assert [d.id for d in first] == ids[:3]
    assert [d.id for d in second] == ids[3:]
    assert third == []
    assert {d.lease_owner for d in first} == {"w1"}
    assert {d.lease_owner for d in second} == {"w2"}


async def test_claim_oldest_first_by_run_at(store: Store, side: SideDB) -> None:
    a, b, c = (r.id for r in await store.enqueue_many([msg("a"), msg("b"), msg("c")]))
    side.shift(c, "run_at", -100)  # c has been due the longest
    side.shift(a, "run_at", -50)
    got = await store.claim_batch("interactive", 2, "w1", LEASE)
    assert [d.id for d in got] == [c, a]
    assert [d.id for d in await store.claim_batch("interactive", 2, "w1", LEASE)] == [b]


async def test_claim_does_not_take_future_rows(store: Store, side: SideDB) -> None:
    later = await store.enqueue(msg("later", delay=timedelta(seconds=30)))
    now = await store.enqueue(msg("now"))
    assert [d.id for d in await store.claim_batch("interactive", 10, "w1", LEASE)] == [now.id]
    assert await store.claim_batch("interactive", 10, "w1", LEASE) == []
    side.make_due(later.id)
    assert [d.id for d in await store.claim_batch("interactive", 10, "w1", LEASE)] == [later.id]


async def test_claim_sets_lease_and_counts_claims(store: Store, side: SideDB) -> None:
    r = await store.enqueue(msg("k"))
    before = side.now()
    d = await claim_one(store, "w1", lease=timedelta(seconds=45))
    assert d.state == State.SENDING
    assert d.lease_owner == "w1"
    assert d.claims == 1
    assert d.attempts == 0
    assert d.attempt_started_at is None
    assert d.lease_expires_at is not None
    lease_s = (d.lease_expires_at - before).total_seconds()
    assert 44 < lease_s < 47
    stored = await store.get(r.id)
    assert stored is not None
    assert (stored.state, stored.lease_owner, stored.claims) == (State.SENDING, "w1", 1)
    # Lose the lease before the attempt started: back to pending, then claimed again.
    side.expire_lease(r.id)
    assert (await store.rescue_expired_leases()).requeued == [r.id]
    d2 = await claim_one(store, "w2")
    assert (d2.claims, d2.lease_owner, d2.attempts) == (2, "w2", 0)
    events = await store.timeline(r.id)
    claimed = [e for e in events if e.kind == "claimed"]
    assert [e.data for e in claimed] == [{"owner": "w1", "claim": 1},
                                         {"owner": "w2", "claim": 2}]
    assert all(e.state == "sending" for e in claimed)


async def test_claim_excludes_paused_imports(store: Store) -> None:
    a = await store.enqueue(msg("a", lane="bulk", import_id="imp-1"))
    b = await store.enqueue(msg("b", lane="bulk", import_id="imp-2"))
    c = await store.enqueue(msg("c", lane="bulk"))
    got = await store.claim_batch("bulk", 10, "w1", LEASE, exclude_imports=["imp-1"])
    assert [d.id for d in got] == [b.id, c.id]
    assert await store.claim_batch("bulk", 10, "w1", LEASE, exclude_imports=["imp-1"]) == []
    got = await store.claim_batch("bulk", 10, "w1", LEASE, exclude_imports=[])
    assert [d.id for d in got] == [a.id]


async def test_claim_excludes_several_imports(store: Store) -> None:
    await store.enqueue_many([msg(f"{imp}:{i}", import_id=imp)
                              for imp in ("x", "y", "z") for i in range(2)])
    got = await store.claim_batch("interactive", 10, "w1", LEASE, exclude_imports=("x", "z"))
    assert sorted(d.import_id or "" for d in got) == ["y", "y"]


async def test_claim_skips_non_pending_states(store: Store) -> None:
    ids = [r.id for r in await store.enqueue_many([msg(f"k{i}") for i in range(3)])]
    assert await store.cancel(ids[0])
    d = await claim_one(store, "w1")
    await store.set_state_if_sending_many("w1", [sent(d)])
    got = await store.claim_batch("interactive", 10, "w2", LEASE)
    assert [x.id for x in got] == [ids[2]]


# ======================================================================================
# start_attempts and renew_leases
# ======================================================================================
async def test_start_attempts_only_for_live_leases_held_by_owner(
        store: Store, side: SideDB) -> None:
    await store.enqueue_many([msg("x"), msg("y"), msg("z")])
    x, y, z = await store.claim_batch("interactive", 3, "w1", LEASE)
    assert await store.start_attempts("w1", []) == set()
    assert await store.start_attempts("w2", [claim_of(x)]) == set()  # not the owner
    assert await store.start_attempts("w1", [Claim(x.id, x.claims + 1)]) == set()  # wrong claim
    side.expire_lease(y.id)  # expired but not yet rescued
    assert await store.start_attempts("w1", [claim_of(x), claim_of(y), claim_of(z)]) == {
        x.id, z.id}
    dx, dy = await store.get(x.id), await store.get(y.id)
    assert dx is not None and dx.attempt_started_at is not None
    assert dy is not None and dy.attempt_started_at is None
    # Starting again is harmless and still reports the hold.
    assert await store.start_attempts("w1", [claim_of(x)]) == {x.id}
    # Once acked it is no longer held.
    assert await store.set_state_if_sending_many("w1", [sent(x)]) == {x.id}
    assert await store.start_attempts("w1", [claim_of(x)]) == set()


async def test_start_attempts_refuses_after_rescue_and_reclaim(
        store: Store, side: SideDB) -> None:
    r = await store.enqueue(msg("k"))
    first = await claim_one(store, "w1")
    side.expire_lease(r.id)
    await store.rescue_expired_leases()
    second = await claim_one(store, "w1")  # the same owner name, but a new claim
    assert await store.start_attempts("w1", [claim_of(first)]) == set()
    assert await store.start_attempts("w1", [claim_of(second)]) == {r.id}


async def test_renew_leases(store: Store, side: SideDB) -> None:
    await store.enqueue_many([msg("x"), msg("y")])
    x, y = await store.claim_batch("interactive", 2, "w1", timedelta(seconds=5))
    assert await store.renew_leases("w1", [], LEASE) == set()
    assert await store.renew_leases("w2", [claim_of(x)], LEASE) == set()
    assert await store.renew_leases("w1", [Claim(x.id, 99)], LEASE) == set()
    side.expire_lease(y.id)
    before = side.now()
    assert await store.renew_leases("w1", [claim_of(x), claim_of(y)],
                                    timedelta(seconds=120)) == {x.id}
    dx, dy = await store.get(x.id), await store.get(y.id)
    assert dx is not None and dx.lease_expires_at is not None
    assert 119 < (dx.lease_expires_at - before).total_seconds() < 122
    # An expired lease is not revived: the rescuer may already be acting on it.
    assert dy is not None and dy.lease_expires_at is not None
    assert dy.lease_expires_at < before
    assert dy.state == State.SENDING


# ======================================================================================
# set_state_if_sending_many
# ======================================================================================
async def test_ack_sent(store: Store, side: SideDB) -> None:
    r = await store.enqueue(msg("k"))
    d = await claim_one(store, "w1")
    await store.start_attempts("w1", [claim_of(d)])
    applied = await store.set_state_if_sending_many(
        "w1", [sent(d, provider_message_id="pm-1", detail={"outcome": "accepted"})])
    assert applied == {r.id}
    s = await store.get(r.id)
    assert s is not None
    assert s.state == State.SENT
    assert s.attempts == 1
    assert s.provider_message_id == "pm-1"
    assert s.sent_at is not None and s.finished_at is not None
    assert s.lease_owner is None and s.lease_expires_at is None
    assert s.attempt_started_at is None
    assert await kinds(store, r.id) == ["enqueued", "claimed", "sent"]
    last = (await store.timeline(r.id))[-1]
    assert last.state == "sent"
    assert last.data == {"outcome": "accepted"}


async def test_transition_guarded_by_owner(store: Store) -> None:
    r = await store.enqueue(msg("k"))
    d = await claim_one(store, "w1")
    assert await store.set_state_if_sending_many("w2", [sent(d)]) == set()
    s = await store.get(r.id)
    assert s is not None and (s.state, s.lease_owner, s.attempts) == (State.SENDING, "w1", 0)
    assert await kinds(store, r.id) == ["enqueued", "claimed"]


async def test_transition_guarded_by_claim_number(store: Store, side: SideDB) -> None:
    r = await store.enqueue(msg("k"))
    old = await claim_one(store, "w1")
    side.expire_lease(r.id)
    await store.rescue_expired_leases()
    new = await claim_one(store, "w1")  # same owner name, a later claim
    assert await store.set_state_if_sending_many("w1", [sent(old)]) == set()
    assert await state_of(store, r.id) == State.SENDING
    assert await store.set_state_if_sending_many("w1", [sent(new)]) == {r.id}


async def test_transition_applies_batch_selectively(store: Store) -> None:
    await store.enqueue_many([msg(f"k{i}") for i in range(4)])
    a, b, c, d = await store.claim_batch("interactive", 4, "w1", LEASE)
    applied = await store.set_state_if_sending_many("w1", [
        sent(a), retry(b, delay_s=60), dead(c),
        Transition(d.id, d.claims + 1, State.SENT, "sent"),  # stale/wrong claim
    ])
    assert applied == {a.id, b.id, c.id}
    assert [await state_of(store, x.id) for x in (a, b, c, d)] == [
        State.SENT, State.PENDING, State.DEAD, State.SENDING]


@pytest.mark.parametrize("terminal", ["sent", "dead", "cancelled", "expired", "suppressed"])
async def test_terminal_states_never_change(store: Store, side: SideDB, terminal: str) -> None:
    r = await store.enqueue(msg("k"))
    if terminal == "cancelled":
        assert await store.cancel(r.id)
        d = await store.get(r.id)
        assert d is not None
    else:
        d = await claim_one(store, "w1")
        await store.start_attempts("w1", [claim_of(d)])
        t = Transition(d.id, d.claims, State(terminal), terminal,
                       dead_reason="permanent" if terminal == "dead" else None)
        assert await store.set_state_if_sending_many("w1", [t]) == {r.id}
    before = await store.get(r.id)
    assert before is not None and before.state == terminal and before.finished_at is not None
    n_events = len(await store.timeline(r.id))
    # Nothing can move it any more, whoever asks.
    for state in State:
        t = Transition(d.id, d.claims, state, "nope", dead_reason="x")
        assert await store.set_state_if_sending_many("w1", [t]) == set()
        assert await store.set_state_if_ambiguous_many([t]) == set()
    assert await store.cancel(r.id) is False
    assert await store.claim_batch("interactive", 10, "w2", LEASE) == []
    assert await store.start_attempts("w1", [claim_of(d)]) == set()
    assert await store.renew_leases("w1", [claim_of(d)], LEASE) == set()
    side.expire_lease(r.id)  # a stray expiry time must not make the rescuer touch it
    rescued = await store.rescue_expired_leases()
    assert r.id not in rescued.requeued and r.id not in rescued.ambiguous
    after = await store.get(r.id)
    assert after is not None
    assert (after.state, after.attempts, after.claims, after.finished_at) == (
        before.state, before.attempts, before.claims, before.finished_at)
    assert len(await store.timeline(r.id)) == n_events


async def test_retry_with_delay_spends_an_attempt(store: Store, side: SideDB) -> None:
    r = await store.enqueue(msg("k"))
    d = await claim_one(store, "w1")
    before = side.now()
    applied = await store.set_state_if_sending_many(
        "w1", [retry(d, delay_s=300, error="503 try later",
                     detail={"outcome": "transient", "response": "503"})])
    assert applied == {r.id}
    s = await store.get(r.id)
    assert s is not None
    assert s.state == State.PENDING
    assert s.attempts == 1
    assert s.last_error == "503 try later"
    assert s.lease_owner is None and s.lease_expires_at is None
    assert s.finished_at is None and s.sent_at is None
    assert 299 < (s.run_at - before).total_seconds() < 302
    assert await store.claim_batch("interactive", 10, "w1", LEASE) == []
    side.make_due(r.id)
    again = await claim_one(store, "w2")
    assert (again.claims, again.attempts, again.last_error) == (2, 1, "503 try later")


async def test_throttle_does_not_spend_an_attempt(store: Store) -> None:
    r = await store.enqueue(msg("k"))
    d = await claim_one(store, "w1")
    t = Transition(d.id, d.claims, State.PENDING, "throttled", delay_s=0.0,
                   spend_attempt=False, detail={"retry_after_s": 0})
    assert await store.set_state_if_sending_many("w1", [t]) == {r.id}
    s = await store.get(r.id)
    assert s is not None and (s.state, s.attempts) == (State.PENDING, 0)
    # delay 0: due at once, and the next claim is a new claim number.
    d2 = await claim_one(store, "w1")
    assert (d2.claims, d2.attempts) == (2, 0)
    assert await kinds(store, r.id) == ["enqueued", "claimed", "throttled", "claimed"]


async def test_retry_without_delay_is_due_now(store: Store) -> None:
    await store.enqueue(msg("k"))
    d = await claim_one(store, "w1")
    t = Transition(d.id, d.claims, State.PENDING, "retry_scheduled")  # delay_s None
    assert await store.set_state_if_sending_many("w1", [t]) == {d.id}
    assert (await claim_one(store, "w1")).attempts == 1


async def test_dead_letter_keeps_everything(store: Store) -> None:
    r = await store.enqueue(msg("k", headers={"X-A": "1"}, metadata={"order": 9},
                                expires_in=timedelta(hours=1)))
    d = await claim_one(store, "w1")
    await store.set_state_if_sending_many("w1", [retry(
        d, error="503 Service Unavailable", detail={"outcome": "transient", "response": "503"})])
    d = await claim_one(store, "w1")
    # A throttle has no "outcome": it is not an attempt and stays out of the history.
    await store.set_state_if_sending_many("w1", [Transition(
        d.id, d.claims, State.PENDING, "throttled", spend_attempt=False,
        detail={"retry_after_s": 0})])
    d = await claim_one(store, "w1")
    huge = "<html>" + "x" * 5000 + "</html>"
    applied = await store.set_state_if_sending_many("w1", [dead(
        d, reason=DeadReason.PERMANENT, error=huge,
        detail={"outcome": "permanent", "response": "550"})])
    assert applied == {r.id}
    s = await store.get(r.id)
    assert s is not None
    assert (s.state, s.dead_reason, s.attempts) == (State.DEAD, "permanent", 2)
    assert s.finished_at is not None and s.sent_at is None
    assert s.last_error is not None
    assert s.last_error.startswith(huge[:MAX_RESPONSE_CHARS])
    assert len(s.last_error) <= MAX_RESPONSE_CHARS + 40

    dl = await store.dead_letter(r.id)
    assert dl is not None
    assert dl.delivery_id == r.id
    assert dl.reason == "permanent"
    assert dl.last_response == s.last_error
    assert dl.last_response is not None and "more chars" in dl.last_response
    # The snapshot is the message as it was meant to be sent.
    snap = dl.snapshot
    assert snap["idempotency_key"] == "k"
    assert snap["recipient"] == "alice@example.com"
    assert snap["subject"] == "Reset your password"
    assert snap["text_body"] == "Follow the link."
    assert snap["headers"] == {"X-A": "1"}
    assert snap["metadata"] == {"order": 9}
    assert snap["state"] == "dead"
    assert snap["attempts"] == 2
    assert snap["expires_at"] is not None
    json.dumps(snap)  # plain JSON all the way down
    # Attempt history: every event whose detail has an "outcome", oldest first, with a time.
    assert [h["outcome"] for h in dl.attempt_history] == ["transient", "permanent"]
    assert [h["response"] for h in dl.attempt_history] == ["503", "550"]
    assert all("at" in h for h in dl.attempt_history)
    assert dl.dead_at is not None and dl.dead_at.tzinfo is not None
    assert dl.replayed_at is None and dl.discarded_at is None
    assert await kinds(store, r.id) == [
        "enqueued", "claimed", "retry_scheduled", "claimed", "throttled", "claimed",
        "dead_lettered"]
    assert (await store.stats()).dead_letters == {"permanent": 1}


async def test_dead_letter_without_reason_or_history(store: Store) -> None:
    r = await store.enqueue(msg("k"))
    d = await claim_one(store, "w1")
    t = Transition(d.id, d.claims, State.DEAD, "dead_lettered")  # no reason, no outcome
    assert await store.set_state_if_sending_many("w1", [t]) == {r.id}
    dl = await store.dead_letter(r.id)
    assert dl is not None
    assert dl.reason == "dead"  # the state stands in for a missing reason
    assert dl.attempt_history == []
    assert dl.last_response is None


async def test_expired_is_dead_lettered_apart(store: Store) -> None:
    await store.enqueue_many([msg("a", expires_in=timedelta(minutes=15)), msg("b")])
    a, b = await store.claim_batch("interactive", 2, "w1", LEASE)
    applied = await store.set_state_if_sending_many("w1", [
        Transition(a.id, a.claims, State.EXPIRED, "expired", spend_attempt=False,
                   dead_reason="expired", detail={"why": "past expires_at"}),
        Transition(b.id, b.claims, State.EXPIRED, "expired", spend_attempt=False),
    ])
    assert applied == {a.id, b.id}
    for d in (a, b):
        s = await store.get(d.id)
        assert s is not None
        assert (s.state, s.attempts) == (State.EXPIRED, 0)
        assert s.finished_at is not None and s.sent_at is None
        dl = await store.dead_letter(d.id)
        assert dl is not None and dl.reason == "expired"
        assert dl.snapshot["idempotency_key"] == d.key
    assert (await store.stats()).dead_letters == {"expired": 2}


async def test_short_error_kept_verbatim(store: Store) -> None:
    r = await store.enqueue(msg("k"))
    d = await claim_one(store, "w1")
    exact = "y" * MAX_RESPONSE_CHARS
    await store.set_state_if_sending_many("w1", [dead(d, error=exact)])
    dl = await store.dead_letter(r.id)
    assert dl is not None and dl.last_response == exact


async def test_worker_may_declare_ambiguous(store: Store) -> None:
    r = await store.enqueue(msg("k"))
    d = await claim_one(store, "w1")
    await store.start_attempts("w1", [claim_of(d)])
    t = Transition(d.id, d.claims, State.AMBIGUOUS, "ambiguous", error="read timeout",
                   detail={"outcome": "ambiguous"})
    assert await store.set_state_if_sending_many("w1", [t]) == {r.id}
    s = await store.get(r.id)
    assert s is not None
    assert (s.state, s.attempts, s.lease_owner, s.finished_at) == (
        State.AMBIGUOUS, 1, None, None)
    assert [x.id for x in await store.list_ambiguous()] == [r.id]


# ======================================================================================
# ambiguous: list and resolve
# ======================================================================================
async def make_ambiguous(store: Store, side: SideDB, key: str) -> Delivery:
    r = await store.enqueue(msg(key))
    d = await claim_one(store, "w1")
    assert await store.start_attempts("w1", [claim_of(d)]) == {r.id}
    side.expire_lease(r.id)
    assert (await store.rescue_expired_leases()).ambiguous == [r.id]
    a = await store.get(r.id)
    assert a is not None and a.state == State.AMBIGUOUS
    return a


async def test_list_ambiguous_oldest_first_with_limit(store: Store, side: SideDB) -> None:
    a = await make_ambiguous(store, side, "a")
    b = await make_ambiguous(store, side, "b")
    c = await make_ambiguous(store, side, "c")
    side.shift(c.id, "updated_at", -100)
    await store.enqueue(msg("plain"))
    assert [d.id for d in await store.list_ambiguous()] == [c.id, a.id, b.id]
    assert [d.id for d in await store.list_ambiguous(limit=2)] == [c.id, a.id]


async def test_list_ambiguous_by_lane(store: Store, side: SideDB) -> None:
    a = await make_ambiguous(store, side, "a")
    r = await store.enqueue(msg("b", lane="bulk"))
    d = await claim_one(store, "w1", lane="bulk")
    await store.set_state_if_sending_many("w1", [
        Transition(d.id, d.claims, State.AMBIGUOUS, "ambiguous")])
    assert [x.id for x in await store.list_ambiguous()] == [a.id, r.id]
    assert [x.id for x in await store.list_ambiguous(lanes=["bulk"])] == [r.id]
    assert [x.id for x in await store.list_ambiguous(lanes=["interactive"])] == [a.id]
    assert [x.id for x in await store.list_ambiguous(lanes=["bulk", "interactive"])] == [
        a.id, r.id]
    assert await store.list_ambiguous(lanes=[]) == []


async def test_resolve_ambiguous_as_sent(store: Store, side: SideDB) -> None:
    a = await make_ambiguous(store, side, "a")
    wrong = Transition(a.id, a.claims + 1, State.SENT, "reconciled_sent")
    assert await store.set_state_if_ambiguous_many([wrong]) == set()
    t = Transition(a.id, a.claims, State.SENT, "reconciled_sent", spend_attempt=False,
                   provider_message_id="pm-9")
    assert await store.set_state_if_ambiguous_many([t]) == {a.id}
    assert await store.set_state_if_ambiguous_many([t]) == set()  # a second reconciler
    s = await store.get(a.id)
    assert s is not None
    assert (s.state, s.attempts, s.provider_message_id) == (State.SENT, 1, "pm-9")
    assert s.sent_at is not None and s.finished_at is not None
    assert await store.list_ambiguous() == []
    assert await kinds(store, a.id) == [
        "enqueued", "claimed", "lease_expired", "reconciled_sent"]


async def test_resolve_ambiguous_as_pending(store: Store, side: SideDB) -> None:
    a = await make_ambiguous(store, side, "a")
    t = Transition(a.id, a.claims, State.PENDING, "reconciled_not_sent", delay_s=0,
                   spend_attempt=False)
    assert await store.set_state_if_ambiguous_many([t]) == {a.id}
    d = await claim_one(store, "w2")
    assert (d.id, d.claims, d.attempts) == (a.id, 2, 1)


async def test_resolve_ambiguous_as_dead(store: Store, side: SideDB) -> None:
    a = await make_ambiguous(store, side, "a")
    t = Transition(a.id, a.claims, State.DEAD, "dead_lettered", spend_attempt=False,
                   dead_reason=DeadReason.AMBIGUOUS_UNRESOLVED,
                   detail={"outcome": "ambiguous_unresolved"})
    assert await store.set_state_if_ambiguous_many([t]) == {a.id}
    dl = await store.dead_letter(a.id)
    assert dl is not None and dl.reason == "ambiguous_unresolved"
    # The rescued attempt (its lease expired after it started) is part of the history.
    assert [h["outcome"] for h in dl.attempt_history] == ["ambiguous", "ambiguous_unresolved"]
    assert "may have accepted" in (dl.last_response or "")


async def test_ambiguous_resolution_does_not_touch_other_states(store: Store) -> None:
    r = await store.enqueue(msg("k"))
    t = Transition(r.id, 0, State.SENT, "reconciled_sent")
    assert await store.set_state_if_ambiguous_many([t]) == set()  # pending
    d = await claim_one(store, "w1")
    assert await store.set_state_if_ambiguous_many([sent(d)]) == set()  # sending
    assert await state_of(store, r.id) == State.SENDING
    assert await store.set_state_if_ambiguous_many([]) == set()
    assert await store.set_state_if_sending_many("w1", []) == set()


# ======================================================================================
# rescue_expired_leases
# ======================================================================================
async def test_rescue_the_three_cases(store: Store, side: SideDB) -> None:
    await store.enqueue_many([msg("not-started"), msg("started"), msg("acked"), msg("live")])
    ns, st, ac, live = await store.claim_batch("interactive", 4, "w1", LEASE)
    assert await store.start_attempts("w1", [claim_of(st), claim_of(ac), claim_of(live)]) == {
        st.id, ac.id, live.id}
    assert await store.set_state_if_sending_many("w1", [sent(ac)]) == {ac.id}
    for x in (ns, st, ac):
        side.expire_lease(x.id)

    result = await store.rescue_expired_leases()
    assert result.requeued == [ns.id]
    assert result.ambiguous == [st.id]

    n = await store.get(ns.id)
    assert n is not None
    assert (n.state, n.attempts, n.lease_owner, n.lease_expires_at) == (
        State.PENDING, 0, None, None)
    s = await store.get(st.id)
    assert s is not None
    assert (s.state, s.attempts, s.lease_owner, s.attempt_started_at) == (
        State.AMBIGUOUS, 1, None, None)
    assert s.last_error is not None and "may have accepted" in s.last_error
    assert s.finished_at is None
    a = await store.get(ac.id)
    assert a is not None and (a.state, a.attempts) == (State.SENT, 1)
    lv = await store.get(live.id)
    assert lv is not None and (lv.state, lv.lease_owner) == (State.SENDING, "w1")

    ev_ns, ev_st = (await store.timeline(ns.id))[-1], (await store.timeline(st.id))[-1]
    assert (ev_ns.kind, ev_ns.state, ev_ns.data) == (
        "lease_expired", "pending", {"owner": "w1", "attempt_started": False})
    assert (ev_st.kind, ev_st.state, ev_st.data) == (
        "lease_expired", "ambiguous", {"owner": "w1", "attempt_started": True,
                                       "outcome": "ambiguous", "attempt": 1,
                                       "response": "lease expired after the attempt started"})
    assert await kinds(store, ac.id) == ["enqueued", "claimed", "sent"]

    # Idempotent: nothing left to rescue, and the old owner can no longer act.
    again = await store.rescue_expired_leases()
    assert (again.requeued, again.ambiguous) == ([], [])
    assert await store.set_state_if_sending_many("w1", [sent(ns), sent(st)]) == set()


async def test_ack_after_expiry_but_before_rescue_wins(store: Store, side: SideDB) -> None:
    """The lease bounds how long the holder *blocks* others; until the rescuer acts, the
    holder's outcome is still the truth and is applied."""
    r = await store.enqueue(msg("k"))
    d = await claim_one(store, "w1")
    await store.start_attempts("w1", [claim_of(d)])
    side.expire_lease(r.id)
    assert await store.set_state_if_sending_many("w1", [sent(d)]) == {r.id}
    rescued = await store.rescue_expired_leases()
    assert (rescued.requeued, rescued.ambiguous) == ([], [])
    assert await state_of(store, r.id) == State.SENT


async def test_rescue_limit(store: Store, side: SideDB) -> None:
    await store.enqueue_many([msg(f"k{i}") for i in range(5)])
    held = await store.claim_batch("interactive", 5, "w1", LEASE)
    for i, d in enumerate(held):
        side.expire_lease(d.id, by=100 - i)  # the first expired first
    first = await store.rescue_expired_leases(limit=2)
    assert first.requeued == [held[0].id, held[1].id]
    rest = await store.rescue_expired_leases(limit=100)
    assert rest.requeued == sorted(d.id for d in held[2:])


# ======================================================================================
# timeline: one event per transition
# ======================================================================================
async def test_every_transition_writes_one_event(store: Store, side: SideDB) -> None:
    r = await store.enqueue(msg("k"))
    d = await claim_one(store, "w1")                                # claimed
    side.expire_lease(r.id)
    await store.rescue_expired_leases()                             # lease_expired -> pending
    d = await claim_one(store, "w1")                                # claimed
    await store.start_attempts("w1", [claim_of(d)])                 # (no event: not a move)
    await store.renew_leases("w1", [claim_of(d)], LEASE)            # (no event)
    await store.set_state_if_sending_many("w1", [retry(d)])         # retry_scheduled
    d = await claim_one(store, "w1")                                # claimed
    await store.start_attempts("w1", [claim_of(d)])
    side.expire_lease(r.id)
    await store.rescue_expired_leases()                             # lease_expired -> ambiguous
    a = await store.get(r.id)
    assert a is not None
    await store.set_state_if_ambiguous_many([Transition(             # reconciled -> pending
        a.id, a.claims, State.PENDING, "reconciled_not_sent", spend_attempt=False)])
    assert await store.cancel(r.id, "user deleted")                 # cancelled
    events = await store.timeline(r.id)
    assert [(e.kind, e.state) for e in events] == [
        ("enqueued", "pending"), ("claimed", "sending"), ("lease_expired", "pending"),
        ("claimed", "sending"), ("retry_scheduled", "pending"), ("claimed", "sending"),
        ("lease_expired", "ambiguous"), ("reconciled_not_sent", "pending"),
        ("cancelled", "cancelled"),
    ]
    assert events[-1].data == {"reason": "user deleted"}
    assert [e.id for e in events] == sorted(e.id for e in events)
    assert all(e.delivery_id == r.id for e in events)
    ats = [e.at for e in events]
    assert ats == sorted(ats)
    assert all(t.tzinfo is not None for t in ats)


# ======================================================================================
# stats
# ======================================================================================
async def test_stats_empty(store: Store) -> None:
    stats = (await store.stats()).as_json()
    assert stats == {
        "lanes": {"bulk": {"depth": 0, "oldest_age_s": 0.0},
                  "interactive": {"depth": 0, "oldest_age_s": 0.0}},
        "states": dict.fromkeys(sorted(ALL_STATES), 0),
        "attempts": {},
        "dead_letters": {},
        "dead_letter_causes": {},
        "arrivals": {"bulk": 0, "interactive": 0},
    }


async def test_stats_shape_and_numbers(store: Store, side: SideDB) -> None:
    ids = [r.id for r in await store.enqueue_many(
        [msg(f"i{i}") for i in range(4)] + [msg(f"b{i}", lane="bulk") for i in range(3)])]
    side.shift(ids[0], "created_at", -120)  # the oldest interactive row
    # interactive: one sent, one dead, one retried (attempt 2 next), one sending.
    a, b, c, d = await store.claim_batch("interactive", 4, "w1", LEASE)
    await store.set_state_if_sending_many("w1", [
        retry(a, delay_s=600), sent(b), dead(c, reason=DeadReason.BUDGET_EXHAUSTED)])
    # bulk: one cancelled, two pending.
    assert await store.cancel(ids[4])
    stats = await store.stats()
    data = stats.as_json()
    json.dumps(data)
    assert set(data) == {"lanes", "states", "attempts", "dead_letters", "dead_letter_causes",
                         "arrivals"}
    assert set(data["lanes"]) == {"interactive", "bulk"}
    assert data["lanes"]["interactive"]["depth"] == 2  # a (pending) and d (sending)
    assert 119 < data["lanes"]["interactive"]["oldest_age_s"] < 200
    assert data["lanes"]["bulk"]["depth"] == 2
    assert 0 <= data["lanes"]["bulk"]["oldest_age_s"] < 60
    assert data["states"] == {**dict.fromkeys(ALL_STATES, 0), "pending": 3, "sending": 1,
                              "sent": 1, "dead": 1, "cancelled": 1}
    assert data["attempts"] == {"1": 3, "2": 1}
    assert data["dead_letters"] == {"budget_exhausted": 1}
    assert data["dead_letter_causes"] == {"budget_exhausted": 1}
    assert data["arrivals"] == {"interactive": 4, "bulk": 3}
    assert isinstance(data["lanes"]["bulk"]["depth"], int)
    assert isinstance(data["lanes"]["bulk"]["oldest_age_s"], float)
    assert all(isinstance(v, int) for v in data["states"].values())
    del d


async def test_stats_lists_unconfigured_lanes_found_in_the_table(store: Store) -> None:
    store.limits = Limits(lanes=("interactive", "bulk", "digest"))
    await store.enqueue(msg("k", lane="digest"))
    store.limits = Limits()
    lanes = (await store.stats()).as_json()["lanes"]
    assert lanes["digest"]["depth"] == 1
    assert list(lanes) == sorted(lanes)


# ======================================================================================
# cancel and prune
# ======================================================================================
async def test_cancel(store: Store, side: SideDB) -> None:
    await store.enqueue_many([msg("p"), msg("s"), msg("a")])
    p = await store.get("p")
    assert p is not None
    assert await store.cancel(p.id, "unsubscribed") is True
    c = await store.get(p.id)
    assert c is not None and c.state == State.CANCELLED and c.finished_at is not None
    assert (await store.timeline(p.id))[-1].data == {"reason": "unsubscribed"}
    assert await store.cancel(p.id) is False  # already cancelled
    s = await claim_one(store, "w1")
    assert await store.cancel(s.id) is False  # a worker holds it
    assert await state_of(store, s.id) == State.SENDING
    a = await claim_one(store, "w1")
    await store.start_attempts("w1", [claim_of(a)])
    side.expire_lease(a.id)
    await store.rescue_expired_leases()
    assert await store.cancel(a.id) is True   # ambiguous may be withdrawn
    assert await store.cancel(999_999) is False
    assert await kinds(store, a.id) == ["enqueued", "claimed", "lease_expired", "cancelled"]


async def test_prune(store: Store, side: SideDB) -> None:
    keys = ("old-sent", "new-sent", "old-dead", "old-ambiguous", "old-cancel", "old-pending")
    ids = {r.key: r.id for r in await store.enqueue_many([msg(k) for k in keys])}
    held = {d.key: d for d in await store.claim_batch("interactive", 4, "w1", LEASE)}
    assert set(held) == set(keys[:4])
    amb = held["old-ambiguous"]
    await store.set_state_if_sending_many("w1", [
        sent(held["old-sent"]), sent(held["new-sent"]),
        dead(held["old-dead"], detail={"outcome": "permanent"}),
        Transition(amb.id, amb.claims, State.AMBIGUOUS, "ambiguous")])
    assert await store.cancel(ids["old-cancel"])
    hour = 3600
    for key in ("old-sent", "old-dead", "old-cancel"):
        side.shift(ids[key], "finished_at", -2 * hour)
    for key in ("old-pending", "old-ambiguous"):
        side.shift(ids[key], "created_at", -10 * hour)
        side.shift(ids[key], "updated_at", -10 * hour)

    n = await store.prune(finished_before=timedelta(hours=1), dead_before=timedelta(days=7))
    assert n == 2
    assert await store.get(ids["old-sent"]) is None
    assert await store.get(ids["old-cancel"]) is None
    for key in ("new-sent", "old-dead", "old-pending", "old-ambiguous"):
        assert await store.get(ids[key]) is not None, key
    # Their timeline goes with them.
    assert side.count("postlane_events", "delivery_id = ?", (ids["old-sent"],)) == 0
    assert side.count("postlane_events", "delivery_id = ?", (ids["old-cancel"],)) == 0
    # enqueued (the delivery's created_at), then sent, which tells the claim it ended
    # (0015): one row, three entries
    assert side.count("postlane_events", "delivery_id = ?", (ids["new-sent"],)) == 1
    assert await kinds(store, ids["new-sent"]) == ["enqueued", "claimed", "sent"]

    # Dead letters have their own (longer) retention.
    n = await store.prune(finished_before=timedelta(hours=1), dead_before=timedelta(hours=1))
    assert n == 1
    assert await store.get(ids["old-dead"]) is None
    # Arrivals per lane are a counter: retention does not turn it back.
    assert (await store.stats()).arrivals["interactive"] == len(keys)
    assert await store.dead_letter(ids["old-dead"]) is None
    assert side.count("postlane_dead_letters") == 0
    assert side.count("postlane_events", "delivery_id = ?", (ids["old-dead"],)) == 0
    assert await store.prune(timedelta(0), timedelta(0)) == 1  # new-sent, finished just now
    assert sorted(d.key for d in [await store.get(i) for i in ids.values()] if d) == [
        "old-ambiguous", "old-pending"]
    # Re-enqueueing a pruned key creates a new delivery (retention bounds dedup).
    again = await store.enqueue(msg("old-sent"))
    assert again.created and again.id not in ids.values()


# ======================================================================================
# controls
# ======================================================================================
async def test_controls_set_get_delete(store: Store) -> None:
    assert await store.get_controls() == {}
    await store.set_control("pause:lane:bulk", {"paused": True, "by": "ops"})
    controls = await store.get_controls()
    assert set(controls) == {"pause:lane:bulk"}
    c = controls["pause:lane:bulk"]
    assert (c.name, c.value, c.version) == ("pause:lane:bulk", {"paused": True, "by": "ops"}, 1)
    assert c.updated_at.tzinfo is not None
    await store.set_control("pause:lane:bulk", {"paused": False})
    await store.set_control("breaker:ses", {"state": "open", "until": 12.5})
    controls = await store.get_controls()
    assert controls["pause:lane:bulk"].value == {"paused": False}
    assert controls["pause:lane:bulk"].version == 2
    assert controls["pause:lane:bulk"].updated_at >= c.updated_at
    assert controls["breaker:ses"].value == {"state": "open", "until": 12.5}
    await store.set_control("pause:lane:bulk", None)
    assert set(await store.get_controls()) == {"breaker:ses"}
    await store.set_control("never-existed", None)  # deleting nothing is fine
    assert set(await store.get_controls()) == {"breaker:ses"}


async def test_compare_and_set_control(store: Store) -> None:
    name = "breaker:ses"
    assert await store.compare_and_set_control(name, 1, {"state": "open"}) is False  # absent
    assert await store.get_controls() == {}
    assert await store.compare_and_set_control(name, None, {"state": "open"}) is True
    assert await store.compare_and_set_control(name, None, {"state": "other"}) is False
    c = (await store.get_controls())[name]
    assert (c.value, c.version) == ({"state": "open"}, 1)
    assert await store.compare_and_set_control(name, 1, {"state": "half_open"}) is True
    assert await store.compare_and_set_control(name, 1, {"state": "closed"}) is False  # stale
    c = (await store.get_controls())[name]
    assert (c.value, c.version) == ({"state": "half_open"}, 2)
    assert await store.compare_and_set_control(name, 2, {"state": "closed"}) is True
    assert (await store.get_controls())[name].version == 3
    await store.set_control(name, None)
    assert await store.compare_and_set_control(name, 3, {"state": "x"}) is False
    assert await store.compare_and_set_control(name, None, {"state": "x"}) is True
    assert (await store.get_controls())[name].version == 1


async def test_compare_and_set_has_one_winner(store: Store) -> None:
    async with open_store(store_url(store)) as other:
        results = await asyncio.gather(
            *(s.compare_and_set_control("leader", None, {"who": i})
              for i, s in enumerate([store, other, store, other]))
        )
    assert sorted(results) == [False, False, False, True]
    winner = results.index(True)
    assert (await store.get_controls())["leader"].value == {"who": winner}


# ======================================================================================
# wait_for_work
# ======================================================================================
async def prime_listener(store: Store) -> None:
    """PostgreSQL starts LISTENing on the first call and wakes once when it is in place
    (anything enqueued before that might have been missed). Consume that wake-up."""
    if store.engine == "postgres":
        t0 = time.monotonic()
        await store.wait_for_work(10)
        assert time.monotonic() - t0 < 5


async def started(task: asyncio.Task[Any]) -> None:
    """Give ``task`` time to take its starting point (SQLite reads data_version on its
    thread); there is no observable state to poll for this."""
    await asyncio.sleep(0.3)
    assert not task.done()


async def test_wait_for_work_times_out(store: Store) -> None:
    await prime_listener(store)
    t0 = time.monotonic()
    await store.wait_for_work(0.6)
    elapsed = time.monotonic() - t0
    assert 0.55 <= elapsed < 2.0


async def test_wait_for_work_wakes_on_enqueue_by_another_store(store: Store) -> None:
    await prime_listener(store)
    async with open_store(store_url(store)) as other:
        waiter = asyncio.create_task(store.wait_for_work(5))
        await started(waiter)
        t0 = time.monotonic()
        await other.enqueue(msg("wake"))
        await asyncio.wait_for(waiter, 5)
        assert time.monotonic() - t0 < 1.5
        # Consumed: the next wait sleeps again.
        t1 = time.monotonic()
        await store.wait_for_work(0.4)
        assert time.monotonic() - t1 >= 0.35


async def test_wait_for_work_wakes_on_own_enqueue(store: Store) -> None:
    await prime_listener(store)
    waiter = asyncio.create_task(store.wait_for_work(5))
    await started(waiter)
    t0 = time.monotonic()
    await store.enqueue(msg("wake"))
    await asyncio.wait_for(waiter, 5)
    assert time.monotonic() - t0 < 1.5
    # An enqueue_many wakes too, and a wake-up that arrives before the wait is not lost.
    await store.enqueue_many([msg("w2"), msg("w3")])
    t1 = time.monotonic()
    await store.wait_for_work(5)
    assert time.monotonic() - t1 < 1.5


# -- dead-letter causes (migration 0012) ------------------------------------------------
async def test_a_dead_letter_keeps_its_cause(store: Store) -> None:
    await store.enqueue_many([msg(k) for k in ("tpl", "addr", "bug", "late")])
    held = {d.key: d for d in await store.claim_batch("interactive", 4, "w1", LEASE)}
    await store.set_state_if_sending_many("w1", [
        dead(held["tpl"], error='404 {"error": "unknown template welcome"}',
             detail={"outcome": "permanent", "cause": "unknown_template"}),
        dead(held["addr"], error="rcpt: 550 5.1.1 user unknown",
             detail={"outcome": "permanent"}),  # no cause named: classified from the answer
        dead(held["bug"], reason=DeadReason.HANDLER_ERROR),
        Transition(held["late"].id, held["late"].claims, State.EXPIRED, "expired",
                   dead_reason=DeadReason.EXPIRED)])
    causes = {e.snapshot["idempotency_key"]: e.cause
              for e in await store.list_dead_letters()}
    assert causes == {"tpl": "unknown_template", "addr": "rejected_recipient",
                      "bug": "handler_error", "late": "expired"}
    picked = await store.list_dead_letters(DeadLetterFilter(cause="rejected_recipient"))
    assert [e.delivery_id for e in picked] == [held["addr"].id]
    stats = await store.stats()
    assert stats.dead_letter_causes == {"unknown_template": 1, "rejected_recipient": 1,
                                        "handler_error": 1, "expired": 1}
    assert stats.dead_letters == {"permanent": 2, "handler_error": 1, "expired": 1}


# -- channels, SMS fallbacks and import canaries (migration 0010) ------------------------
async def test_claims_and_ambiguity_lookups_keep_to_one_channel(store: Store) -> None:
    from postlane.core.sms import sms_message

    email = await store.enqueue(msg("c:email"))
    text = await store.enqueue(sms_message(key="c:sms", to="+14155550100", text="hi"))
    assert [d.id for d in await store.claim_batch("interactive", 10, "w1", LEASE,
                                                  channel="sms")] == [text.id]
    [e] = await store.claim_batch("interactive", 10, "w1", LEASE)
    assert e.id == email.id
    assert await store.list_ambiguous() == []
    await store.set_state_if_sending_many("w1", [
        Transition(e.id, e.claims, State.AMBIGUOUS, "ambiguous")])
    assert [d.id for d in await store.list_ambiguous(channel="email")] == [email.id]
    assert await store.list_ambiguous(channel="sms") == []
    assert [d.id for d in await store.list_ambiguous()] == [email.id]
    channels = await store.channel_stats()
    assert channels.pending == {} and channels.fallbacks == {}


async def test_a_fallback_is_created_once_and_only_from_the_states_given(store: Store) -> None:
    from postlane.core.fallback import fallback_message, spec_of, with_sms_fallback

    r = await store.enqueue(with_sms_fallback(msg("c:fb"), to="+14155550100", text="code"))
    email = await store.get(r.id)
    assert email is not None
    spec = spec_of(email.metadata)
    assert spec is not None
    sms = fallback_message(email, spec, "unsent")
    assert await store.create_sms_fallback(r.id, ["dead"], sms, "dead") is None  # not dead
    pair = await store.create_sms_fallback(r.id, ["pending"], sms, "unsent")
    assert pair is not None and pair.email_id == r.id and pair.reason == "unsent"
    assert await store.create_sms_fallback(r.id, ["pending"], sms, "unsent") is None  # once
    created = await store.get("sms-fallback:c:fb")
    assert created is not None and created.id == pair.sms_id and created.channel == "sms"
    assert await store.sms_fallback_pair(created.id) == pair
    assert (await store.channel_stats()).fallbacks == {"unsent": 1}
    assert await kinds(store, r.id) == ["enqueued", "sms_fallback"]
    assert await kinds(store, created.id) == ["enqueued", "fallback_of"]


async def test_a_canary_is_settled_once_and_releases_only_held_deliveries(
        store: Store, side: SideDB) -> None:
    from postlane.core.canary import HOLD

    await store.enqueue(msg("c:1", lane="bulk", import_id="imp"))
    held = await store.enqueue_many([msg(f"c:{i}", lane="bulk", import_id="imp", delay=HOLD)
                                     for i in (2, 3)])
    other = await store.enqueue(msg("c:4", lane="bulk", import_id="imp",
                                    delay=timedelta(minutes=5)))  # a wait, not a hold
    canary = await store.start_import_canary("imp", 1, ["c:1"])
    assert (canary.state, canary.keys, canary.held, canary.states) == (
        "waiting", ("c:1",), 2, {"pending": 1})
    again = await store.start_import_canary("imp", 5, ["c:9"])  # a re-run keeps the first
    assert again.keys == ("c:1",) and again.size == 1
    assert [c.import_id for c in await store.list_waiting_canaries()] == ["imp"]
    assert await store.settle_import_canary("imp", True, "canary passed: 1 of 1 sent")
    assert not await store.settle_import_canary("imp", False, "late")
    settled = await store.get_import_canary("imp")
    assert settled is not None and (settled.state, settled.held) == ("passed", 0)
    assert await store.list_waiting_canaries() == []
    for r in held:
        d = await store.get(r.id)
        assert d is not None and d.run_at <= side.now()
        assert (await kinds(store, r.id))[-1] == "released"
    later = await store.get(other.id)
    assert later is not None and later.run_at > side.now() + timedelta(minutes=4)
    assert await store.release_import_hold("imp") == 0
