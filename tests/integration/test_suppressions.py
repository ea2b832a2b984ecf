"""The suppression list on both engines: scope, reason, source event and expiry; soft
bounces counted per address within a window; rates per lane; one-click unsubscribe's
idempotence."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import pytest
from typer.testing import CliRunner

from postlane import Message
from postlane.cli.main import app
from postlane.core.deliverability import SuppressionPolicy
from postlane.core.records import ProviderEvent
from postlane.core.unsubscribe import sign
from postlane.store import Store
from postlane.webhooks.unsubscribe import InvalidToken, one_click
from tests.conftest import SideDB, msg, store_url

pytestmark = pytest.mark.asyncio

SECRET = b"0123456789abcdef0123456789abcdef"


def soft(event_id: str, address: str = "full@example.com") -> ProviderEvent:
    return ProviderEvent("test", event_id, "soft_bounced", None, address, lane="bulk")


async def sent(store: Store, side: SideDB, key: str, to: str, lane: str = "bulk",
               pmid: str | None = None) -> int:
    result = await store.enqueue(msg(key, to=to, lane=lane))
    side.query("UPDATE postlane_deliveries SET state = 'sent', provider_message_id = ? "
               "WHERE id = ?", (pmid or f"pm-{key}", result.id))
    side.shift(result.id, "finished_at", 0)
    return result.id


def expire_suppression(side: SideDB, address: str, seconds_ago: float = 60.0) -> None:
    if side.engine == "sqlite":
        side.query("UPDATE postlane_suppressions SET expires_at = "
                   "(julianday('now') - 2440587.5) * 86400.0 - ? WHERE address = ?",
                   (seconds_ago, address))
    else:
        side.query("UPDATE postlane_suppressions SET expires_at = now() - "
                   "make_interval(secs => ?::float8) WHERE address = ?", (seconds_ago, address))


async def test_an_expired_suppression_no_longer_applies(store: Store, side: SideDB) -> None:
    assert await store.suppress("ann@example.com", "*", "operator", expires_in=timedelta(days=1))
    result = await store.enqueue(msg("welcome:1", to="ann@example.com"))
    delivery = await store.get(result.id)
    assert delivery is not None
    assert await store.suppressed_among([delivery]) == {result.id: "operator"}
    expire_suppression(side, "ann@example.com")
    assert await store.suppressed_among([delivery]) == {}
    [entry] = await store.list_suppressions("ann@example.com")
    assert entry.expires_at is not None and not entry.active(side.now())


async def test_an_entry_is_only_replaced_by_one_that_ends_later(store: Store,
                                                                side: SideDB) -> None:
    address = "bob@example.com"
    assert await store.suppress(address, "*", "3 soft bounces", source_event="t:1",
                                expires_in=timedelta(days=7))
    # A shorter one does not shorten it; a permanent one makes it permanent.
    assert not await store.suppress(address, "*", "2 soft bounces",
                                    expires_in=timedelta(days=1))
    assert await store.suppress(address, "*", "hard bounce", source_event="t:2")
    [entry] = await store.list_suppressions(address)
    assert (entry.reason, entry.source_event, entry.expires_at) == ("hard bounce", "t:2", None)
    # Nothing replaces a permanent one, not even another permanent one (idempotent).
    assert not await store.suppress(address, "*", "operator")
    assert not await store.suppress(address, "*", "x", expires_in=timedelta(days=99))
    # An expired entry is replaced by anything.
    assert await store.suppress("cy@example.com", "bulk", "a", expires_in=timedelta(days=1))
    expire_suppression(side, "cy@example.com")
    assert await store.suppress("cy@example.com", "bulk", "b", expires_in=timedelta(hours=1))
    [entry] = await store.list_suppressions("cy@example.com")
    assert entry.reason == "b" and entry.active(side.now())


async def test_soft_bounces_count_within_the_window_only(store: Store, side: SideDB) -> None:
    policy = SuppressionPolicy(3, timedelta(days=7), timedelta(days=2))
    for i in (1, 2):
        result = await store.record_provider_event(soft(f"s{i}"), policy)
        assert result.suppressed is None
    # Both fall out of the window: the third is the first that counts again.
    side.query("UPDATE postlane_provider_events SET received_at = received_at - ?"
               if side.engine == "sqlite" else
               "UPDATE postlane_provider_events SET received_at = received_at - "
               "make_interval(secs => ?::float8)", (8 * 86400.0,))
    assert (await store.record_provider_event(soft("s3"), policy)).suppressed is None
    assert (await store.record_provider_event(soft("s4"), policy)).suppressed is None
    assert await store.list_suppressions("full@example.com") == []
    again = await store.record_provider_event(soft("s5"), policy)
    assert again.suppressed == "full@example.com"
    [entry] = await store.list_suppressions("full@example.com")
    assert (entry.stream, entry.reason, entry.source_event) == ("*", "3 soft bounces", "test:s5")
    assert entry.expires_at is not None
    days = (entry.expires_at - side.now()).total_seconds() / 86400
    assert 1.99 < days <= 2.0
    # Another address's soft bounces are its own.
    assert (await store.record_provider_event(soft("o1", "other@example.com"), policy)
            ).suppressed is None


async def test_events_matched_by_key_or_by_the_stream_they_name(store: Store,
                                                                side: SideDB) -> None:
    delivery_id = await sent(store, side, "digest:k", "key@example.com")
    by_key = ProviderEvent("smtp", "dsn:1", "bounced", "<unknown@x>", "key@example.com",
                           idempotency_key="digest:k")
    assert (await store.record_provider_event(by_key)).delivery_id == delivery_id
    # A complaint for no delivery and no stream: kept in the event log, suppresses nothing.
    lost = ProviderEvent("smtp", "fbl:1", "complained", "<nobody@x>", "lost@example.com")
    result = await store.record_provider_event(lost)
    assert (result.delivery_id, result.suppressed) == (None, None)
    assert await store.list_suppressions("lost@example.com") == []
    # An unsubscribe names its stream: it suppresses even after its delivery was pruned.
    gone = ProviderEvent("postlane", "unsubscribe:bulk:999", "unsubscribed", None,
                         "pruned@example.com", delivery_id=999, lane="bulk")
    assert (await store.record_provider_event(gone)).suppressed == "pruned@example.com"
    [entry] = await store.list_suppressions("pruned@example.com")
    assert (entry.stream, entry.reason, entry.delivery_id) == ("bulk", "unsubscribed", None)


async def test_rates_per_lane_and_event_totals(store: Store, side: SideDB) -> None:
    for i in range(4):
        await sent(store, side, f"digest:{i}", f"r{i}@example.com", pmid=f"pm{i}")
    await sent(store, side, "reset:0", "r0@example.com", lane="interactive", pmid="pr0")
    await store.record_provider_event(ProviderEvent("t", "b1", "bounced", "pm0"))
    await store.record_provider_event(ProviderEvent("t", "c1", "complained", "pm1"))
    await store.record_provider_event(ProviderEvent("t", "d1", "delivered", "pm2"))
    await store.record_provider_event(ProviderEvent("t", "d2", "delivered", "pr0"))
    await store.record_provider_event(ProviderEvent("t", "x1", "bounced", "nobody"))
    figures = await store.deliverability(timedelta(hours=24))
    assert figures["bulk"].sent == 4 and figures["interactive"].sent == 1
    assert figures["bulk"].bounce_rate == 0.25 and figures["bulk"].complaint_rate == 0.25
    assert figures["interactive"].bounce_rate == 0.0
    assert figures["bulk"].as_json()["bounced"] == 1
    assert await store.provider_event_totals() == {
        ("bounced", "bulk"): 1, ("complained", "bulk"): 1, ("delivered", "bulk"): 1,
        ("delivered", "interactive"): 1, ("bounced", ""): 1}
    # Outside the window nothing counts.
    side.query("UPDATE postlane_provider_events SET received_at = received_at - ?"
               if side.engine == "sqlite" else
               "UPDATE postlane_provider_events SET received_at = received_at - "
               "make_interval(secs => ?::float8)", (2 * 86400.0,))
    assert (await store.deliverability(timedelta(hours=24)))["bulk"].events == {}


async def test_one_click_is_idempotent_and_survives_an_operators_lift(store: Store,
                                                                      side: SideDB) -> None:
    delivery_id = await sent(store, side, "digest:oc", "oc@example.com")
    token = sign(SECRET, "oc@example.com", "bulk", delivery_id)
    first = await one_click(store, (SECRET,), token)
    second = await one_click(store, (SECRET,), token)
    assert first.first and not second.first
    assert len(await store.list_suppressions("oc@example.com")) == 1
    kinds = [e.kind for e in await store.timeline(delivery_id)]
    assert kinds.count("provider:unsubscribed") == 1
    assert await store.unsuppress("oc@example.com") == 1
    await one_click(store, (SECRET,), token)  # they click again: unsubscribed again
    [entry] = await store.list_suppressions("oc@example.com")
    assert entry.stream == "bulk"
    with pytest.raises(InvalidToken, match="not configured"):
        await one_click(store, (), token)
    with pytest.raises(InvalidToken):
        await one_click(store, (b"another-secret-0123456789abcdef",), token)


async def test_a_bulk_suppression_leaves_the_other_lanes_alone(store: Store) -> None:
    await store.suppress("mix@example.com", "bulk", "unsubscribed")
    bulk = await store.enqueue(Message(key="d:1", to="MIX@example.com", subject="s",
                                       text="t", lane="bulk"))
    reset = await store.enqueue(Message(key="r:1", to="mix@example.com", subject="s",
                                        text="t"))
    rows = [await store.get(bulk.id), await store.get(reset.id)]
    assert await store.suppressed_among([r for r in rows if r]) == {bulk.id: "unsubscribed"}


async def test_status_shows_the_rates_per_lane_and_marks_what_a_provider_would_act_on(
        store: Store, side: SideDB) -> None:
    for i in range(10):
        await sent(store, side, f"digest:s{i}", f"s{i}@example.com", pmid=f"ps{i}")
    await store.record_provider_event(ProviderEvent("t", "b1", "bounced", "ps0"))
    runner = CliRunner(env={"COLUMNS": "160"})
    url = store_url(store)
    result = await asyncio.to_thread(runner.invoke, app, ["--db", url, "status"])
    assert result.exit_code == 0, result.output
    assert "deliverability (last 24 h)" in result.output
    [row] = [line for line in result.output.splitlines() if line.strip().startswith("bulk ")
             and "%" in line]
    assert "1 (10.00%)" in row and "0 (0.00%)" in row  # 1 of 10 bounced, none complained
    assert "bulk: bounce rate 10.00% is over 5%" in result.output
    as_json = await asyncio.to_thread(runner.invoke, app, ["--db", url, "status", "--json"])
    figures = json.loads(as_json.output)["deliverability"]
    assert figures["lanes"]["bulk"]["bounce_rate"] == 0.1
    assert figures["bounce_rate_limit"] == 0.05 and figures["window_s"] == 86400


async def test_a_claims_hints_never_skip_a_suppressed_address_or_stored_parts(
    store: Store,
) -> None:
    """The claim may tell the worker to skip the suppression check or the read of parts
    (``Delivery.may_be_suppressed``, ``has_attachments``). A hint may only ever say "look":
    every address the exact check suppresses, in any spelling or case, and every delivery
    with parts must be marked; a plain one is left unmarked."""
    from postlane.core.attachments import Attachment

    await store.suppress("gone@example.com", "*", "hard_bounce")
    await store.suppress("anna@xn--bcher-kva.de", "bulk", "complaint")
    addresses = {
        "plain": "someone@example.com",
        "suppressed": "gone@example.com",
        "suppressed-upper": "Gone@EXAMPLE.com",
        "suppressed-unicode": "anna@bücher.de",
        "suppressed-punycode": "ANNA@xn--bcher-kva.de",
        "unicode-plain": "otto@bücher.de",
    }
    for name, address in addresses.items():
        await store.enqueue(Message(key=f"hint:{name}", to=address, subject="s", text="t",
                                    lane="bulk"))
    await store.enqueue(Message(key="hint:parts", to="parts@example.com", subject="s",
                                text="t", lane="bulk",
                                attachments=(Attachment("a.txt", b"x", "text/plain"),)))
    claimed = await store.claim_batch("bulk", 50, "w", timedelta(minutes=1))
    by_key = {d.key: d for d in claimed}
    assert len(by_key) == len(addresses) + 1
    exact = await store.suppressed_among(claimed)
    assert {by_key[k].id for k in by_key if k.startswith("hint:suppressed")} == set(exact)
    for delivery in claimed:
        if delivery.id in exact:
            assert delivery.may_be_suppressed, delivery.key
    assert by_key["hint:unicode-plain"].may_be_suppressed  # not ASCII: checked exactly
    assert by_key["hint:parts"].has_attachments is not False
    parts = await store.attachments_among([d.id for d in claimed])
    assert set(parts) == {by_key["hint:parts"].id}
    # Plain rows are left unmarked: no check, no read.
    assert not by_key["hint:plain"].may_be_suppressed
    assert by_key["hint:plain"].has_attachments is False
    assert by_key["hint:parts"].has_attachments is True
