"""The second channel on both engines: workers claim only their provider's channel, and an
email's SMS fallback is created (once) when the email dies, expires, or stays unsent.

Workers run for real on the ``store`` fixture; the housekeeping sweep is also driven
directly (``Housekeeping.fallbacks``) where a test needs to see one sweep's effect. Time
moves by writing the time columns (``SideDB.shift``), never by waiting.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from conftest import SideDB, msg

from postlane.core.fallback import FallbackPolicy, with_sms_fallback
from postlane.core.message import Delivery
from postlane.core.outcomes import Outcome
from postlane.core.sms import GSM7, UCS2, sms_message
from postlane.core.states import State
from postlane.errors import InvalidAddress, InvalidMessage
from postlane.providers.sandbox import SandboxConfig
from postlane.providers.sms import SandboxSmsProvider
from postlane.store import Store, open_store
from postlane.store.postgres._base import Q
from postlane.worker import Worker
from postlane.worker.housekeeping import Housekeeping
from tests.integration.worker_helpers import (
    LANES,
    Provider,
    event_kinds,
    fast_config,
    in_state,
    running,
    wait_until,
)

LEASE = timedelta(seconds=30)
PHONE = "+14155550100"


def reset(key: str, **fallback: object) -> object:
    """A reset email with an SMS fallback (``fallback`` overrides ``with_sms_fallback``)."""
    options: dict[str, object] = {"to": PHONE, "text": "Your reset code is 123456"}
    options.update(fallback)
    return with_sms_fallback(msg(key), **options)  # type: ignore[arg-type]


def housekeeping(**interactive: object) -> Housekeeping:
    lanes = {lane.name: lane for lane in LANES}
    if interactive:
        lanes["interactive"] = replace(lanes["interactive"],
                                       sms_fallback=FallbackPolicy(**interactive))  # type: ignore[arg-type]
    return Housekeeping(store=None, lanes=lanes)  # type: ignore[arg-type]


def sweeper(store: Store, **interactive: object) -> Housekeeping:
    keeper = housekeeping(**interactive)
    keeper.store = store
    return keeper


async def fallback_of(store: Store, email_key: str) -> Delivery | None:
    return await store.get(f"sms-fallback:{email_key}")


# -- channels ------------------------------------------------------------------------------
async def test_claims_take_only_the_asked_channel_whatever_the_lane(store: Store) -> None:
    email = await store.enqueue(msg("e:1"))
    sms = await store.enqueue(sms_message(key="s:1", to=PHONE, text="hi"))
    bulk_sms = await store.enqueue(sms_message(key="s:2", to=PHONE, text="hi", lane="bulk"))
    got = await store.claim_batch("interactive", 10, "w-email", LEASE)
    assert [d.id for d in got] == [email.id]
    assert await store.claim_batch("interactive", 10, "w-email", LEASE) == []
    got = await store.claim_batch("interactive", 10, "w-sms", LEASE, channel="sms")
    assert [d.id for d in got] == [sms.id]
    assert [d.id for d in await store.claim_batch("bulk", 10, "w-sms", LEASE, channel="sms")
            ] == [bulk_sms.id]


async def test_an_email_worker_leaves_sms_alone_and_an_sms_worker_sends_it(store: Store) -> None:
    email = await store.enqueue(msg("e:2"))
    sms = await store.enqueue(sms_message(key="s:3", to=PHONE, text="Code 42"))
    provider = Provider()
    async with running(Worker(store, provider, config=fast_config())):
        await in_state(store, email.id, State.SENT)
        # A few more claim turns: the SMS is never claimed, never dead-lettered.
        await wait_until(lambda: provider.requests, what="the email sent")
    untouched = await store.get(sms.id)
    assert untouched is not None
    assert (untouched.state, untouched.claims, untouched.attempts) == (State.PENDING, 0, 0)
    assert [r.key for r in provider.requests] == ["e:2"]
    texts = SandboxSmsProvider()
    async with running(Worker(store, texts, config=fast_config())):
        await in_state(store, sms.id, State.SENT)
    assert [r.key for r in texts.sent] == ["s:3"]
    assert (await store.get(email.id)).claims == 1  # type: ignore[union-attr]


async def test_sandbox_sms_faults_are_the_email_sandboxs(store: Store) -> None:
    # reject= matches the phone number: a permanent refusal, dead-lettered.
    provider = SandboxSmsProvider(SandboxConfig(reject=r"^\+1999"))
    ok = await store.enqueue(sms_message(key="s:ok", to=PHONE, text="fine"))
    bad = await store.enqueue(sms_message(key="s:bad", to="+19995550100", text="refused"))
    async with running(Worker(store, provider, config=fast_config())):
        await in_state(store, ok.id, State.SENT)
        dead = await in_state(store, bad.id, State.DEAD)
    assert "recipient rejected" in (dead.last_error or "")
    assert provider.engine.stats.rejected == 1 and provider.segments_billed == 1


# -- the fallback ----------------------------------------------------------------------------
async def test_a_dead_email_gets_its_sms_as_a_delivery_of_its_own(
        store: Store, side: SideDB) -> None:
    provider = Provider()
    provider.script_key("reset:9", Outcome.permanent("550 mailbox unavailable"))
    r = await store.enqueue(reset("reset:9", text="Ваш код 123456"))  # Cyrillic: UCS-2
    texts = SandboxSmsProvider()
    async with running(Worker(store, provider, config=fast_config())):
        await in_state(store, r.id, State.DEAD)
        sms = await wait_until(lambda: fallback_of(store, "reset:9"), what="the fallback")
    assert (sms.channel, sms.recipient, sms.lane, sms.state) == (
        "sms", PHONE, "interactive", State.PENDING)
    # Recorded before sending: encoding and segments, and where it came from.
    assert sms.metadata["sms"] == {"encoding": UCS2, "segments": 1, "units": 14}
    assert sms.metadata["fallback_of"] == "reset:9"
    assert sms.metadata["fallback_reason"] == "dead"
    assert sms.attempts == 0  # its own budget
    pair = await store.sms_fallback_pair(r.id)
    assert pair is not None and (pair.email_id, pair.sms_id, pair.reason) == (r.id, sms.id,
                                                                              "dead")
    assert await store.sms_fallback_pair(sms.id) == pair
    assert "sms_fallback" in await event_kinds(store, r.id)
    assert (await event_kinds(store, sms.id))[:2] == ["enqueued", "fallback_of"]
    async with running(Worker(store, texts, config=fast_config())):
        await in_state(store, sms.id, State.SENT)
    assert [(s.key, s.encoding, s.segments) for s in texts.sent] == [
        ("sms-fallback:reset:9", UCS2, 1)]
    assert side.count("postlane_sms_fallbacks") == 1


async def test_an_expired_email_falls_back(store: Store, side: SideDB) -> None:
    r = await store.enqueue(reset("reset:exp", text="Code 1"))
    side.shift(r.id, "expires_at", -1.0)
    async with running(Worker(store, Provider(), config=fast_config())):
        await in_state(store, r.id, State.EXPIRED)
        sms = await wait_until(lambda: fallback_of(store, "reset:exp"), what="the fallback")
    assert sms.metadata["fallback_reason"] == "expired"
    assert sms.metadata["sms"]["encoding"] == GSM7


async def test_an_email_still_unsent_after_its_time_falls_back_once(
        store: Store, side: SideDB) -> None:
    r = await store.enqueue(reset("reset:slow", after=timedelta(minutes=2)))
    keeper = sweeper(store)
    assert await keeper.fallbacks() == 0  # enqueued just now: not yet
    side.shift(r.id, "created_at", -119.0)
    assert await keeper.fallbacks() == 0
    side.shift(r.id, "created_at", -121.0)
    # Five sweeps at once, as a fleet of workers would run them: one SMS.
    created = await asyncio.gather(*(sweeper(store).fallbacks() for _ in range(5)))
    assert sum(created) == 1
    sms = await fallback_of(store, "reset:slow")
    assert sms is not None and sms.metadata["fallback_reason"] == "unsent"
    assert side.count("postlane_deliveries", "channel = 'sms'") == 1
    assert side.count("postlane_sms_fallbacks") == 1
    email = await store.get(r.id)
    assert email is not None and email.state is State.PENDING  # the email still may go


async def test_the_lanes_policy_sets_when_unless_the_message_does(
        store: Store, side: SideDB) -> None:
    a = await store.enqueue(reset("reset:lane"))
    b = await store.enqueue(reset("reset:own", on=["dead"]))
    for r in (a, b):
        side.shift(r.id, "created_at", -61.0)
    assert await sweeper(store).fallbacks() == 0  # no lane waits for unsent by default
    assert await sweeper(store, after_s=60.0).fallbacks() == 1
    assert await fallback_of(store, "reset:lane") is not None
    assert await fallback_of(store, "reset:own") is None  # it asked for dead only


async def test_a_sent_email_never_falls_back_and_a_declined_one_is_recorded(
        store: Store, side: SideDB) -> None:
    sent = await store.enqueue(reset("reset:ok"))
    declined = await store.enqueue(reset("reset:no", on=["unsent"]))
    provider = Provider()
    provider.script_key("reset:no", Outcome.permanent("550 no"))
    async with running(Worker(store, provider, config=fast_config())):
        await in_state(store, sent.id, State.SENT)
        await in_state(store, declined.id, State.DEAD)
        await wait_until(lambda: store.sms_fallback_pair(declined.id), what="the decision")
    pair = await store.sms_fallback_pair(declined.id)
    assert pair is not None and pair.sms_id is None and pair.reason == "dead"
    assert "sms_fallback_skipped" in await event_kinds(store, declined.id)
    assert await store.sms_fallback_pair(sent.id) is None
    assert side.count("postlane_deliveries", "channel = 'sms'") == 0
    # Decided: later sweeps do not read it again.
    assert [d.id for d in await store.list_fallback_candidates(None)] == []


async def test_a_bad_fallback_is_refused_at_enqueue_and_nothing_stored(
        store: Store, side: SideDB) -> None:
    with pytest.raises(InvalidAddress, match=r"sms_fallback\.to"):
        await store.enqueue(reset("reset:b1", to="0151 1234"))
    with pytest.raises(InvalidMessage, match="segments"):
        await store.enqueue(reset("reset:b2", text="ж" * 700))
    bad = replace(msg("reset:b3"), metadata={"sms_fallback": {"to": PHONE}})
    with pytest.raises(InvalidMessage, match=r"sms_fallback\.text"):
        await store.enqueue(bad)
    bad = replace(msg("reset:b4"), metadata={"sms_fallback": {"to": PHONE, "text": "x",
                                                              "on": ["never"]}})
    with pytest.raises(InvalidMessage, match="unknown trigger"):
        await store.enqueue(bad)
    assert side.count("postlane_deliveries") == 0


async def test_a_fleet_of_sweepers_on_their_own_connections_creates_each_fallback_once(
        store: Store, side: SideDB) -> None:
    """Stress: 60 emails past their time, four stores (connections) of their own sweeping at
    once, each several times, in small batches: exactly one SMS and one pair per email."""
    from conftest import store_url

    from postlane import open_store

    results = await store.enqueue_many([reset(f"reset:s{i}", after=timedelta(seconds=30))
                                        for i in range(60)])
    for r in results:
        side.shift(r.id, "created_at", -60.0)
    stores = [await open_store(store_url(store)).__aenter__() for _ in range(4)]
    try:
        async def sweep(s: Store) -> int:
            keeper = sweeper(s)
            total = 0
            for _ in range(8):
                total += await keeper.fallbacks()
            return total
        import postlane.worker.housekeeping as housekeeping_module

        housekeeping_module.BATCH = 7  # many small overlapping rounds
        try:
            created = await asyncio.gather(*(sweep(s) for s in stores))
        finally:
            housekeeping_module.BATCH = 100
    finally:
        for s in stores:
            await s.close()
    rest = await sweeper(store).fallbacks()  # what the rounds did not reach
    assert sum(created) + rest == 60
    assert side.count("postlane_deliveries", "channel = 'sms'") == 60
    assert side.count("postlane_sms_fallbacks") == 60
    assert side.count("postlane_events", "kind = 'fallback_of'") == 60
    assert side.count("postlane_events", "kind = 'sms_fallback'") == 60


async def test_the_guard_refuses_an_email_that_moved_on(store: Store) -> None:
    from postlane.core.fallback import fallback_message, spec_of

    r = await store.enqueue(reset("reset:race", after=timedelta(seconds=1)))
    email = await store.get(r.id)
    assert email is not None
    spec = spec_of(email.metadata)
    assert spec is not None
    [claimed] = await store.claim_batch("interactive", 1, "w", LEASE)
    from postlane.core.records import Transition

    await store.set_state_if_sending_many("w", [Transition(
        id=claimed.id, claims=claimed.claims, state=State.SENT, event="sent")])
    # The sweep saw it pending; meanwhile it was sent: no SMS.
    assert await store.create_sms_fallback(
        r.id, ["pending"], fallback_message(email, spec, "unsent"), "unsent") is None
    assert await fallback_of(store, "reset:race") is None
    assert await store.sms_fallback_pair(r.id) is None


async def test_the_sweep_reads_only_the_flagged_rows_of_a_table_without_statistics(
        fresh_pg_url: str) -> None:
    """Every worker sweeps once a second, during the drain of a bulk load too, when
    autovacuum has not analysed the new rows yet. Without statistics a join of the two
    tables was planned from the deliveries' side, a scan of every row per sweep (also where
    no message asks for a fallback at all); the sweep must start from the few flagged
    messages however the planner guesses."""
    def blocks_read(conn: psycopg.Connection[Any]) -> int:
        [[plan]] = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
                                + Q["fallback_candidates"], {"after_s": 0.0, "limit": 100})
        top = plan[0]["Plan"]
        return int(top["Shared Hit Blocks"] + top["Shared Read Blocks"])

    async with open_store(fresh_pg_url) as s:
        await s.migrate()
        with psycopg.connect(fresh_pg_url, autocommit=True) as conn, SideDB(fresh_pg_url) as side:
            for table in ("postlane_deliveries", "postlane_messages"):
                conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
            # A newsletter's worth: at this size, and with these rows, the planner's guesses
            # without statistics chose the scan (at 50,000 they did not).
            text = ("Hello,\n\n"
                    + "This is the body of a message, about as long as a short one. " * 4)
            for start in range(0, 100_000, 10_000):
                await s.enqueue_many([
                    msg(f"news:{i}", lane="bulk", to=f"user{i}@example.com",
                        subject="Your digest", text=text, metadata={"user": i})
                    for i in range(start, start + 10_000)])
            assert conn.execute("SELECT reltuples FROM pg_class "
                                "WHERE relname = 'postlane_deliveries'").fetchone() == (-1,)
            # A few index pages, not the deliveries' thousand pages (or 200,000 lookups).
            assert blocks_read(conn) < 20
            r = await s.enqueue(reset("reset:flagged", after=timedelta(minutes=2)))
            side.shift(r.id, "created_at", -121.0)  # due
            assert blocks_read(conn) < 20
        assert await s.list_fallback_candidates(0.0) == [await s.get(r.id)]
