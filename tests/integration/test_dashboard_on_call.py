"""The dashboard's on-call pages over HTTP, on both engines (the browser drives them in
``tests/acceptance/test_dashboard_browser.py``): the messages browser and its pages, bulk
actions behind a count, a confirmation, a CSRF token and the ``operate`` scope, a message's
preview that loads nothing remote, workers, throughput, and the breaker banner."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from postlane import Message, State
from postlane.api import create_app
from postlane.api.keys import create_key
from postlane.core.breaker import CONTROL_PREFIX, BreakerConfig, account_trouble
from postlane.core.records import Claim, Transition, WorkerHeartbeat
from postlane.store import Store
from tests.conftest import store_url


@pytest.fixture
async def client(store: Store) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(store_url(store), sample_interval_s=0)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://dash") as c:
            yield c


async def sign_in(client: httpx.AsyncClient, store: Store, scopes: str = "read,operate"
                  ) -> None:
    _, token = await create_key(store, scopes, name="ops")
    response = await client.post("/dashboard/login", data={"api_key": token})
    assert response.status_code == 303


def csrf(page: str) -> str:
    match = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert match, "no CSRF token in the page"
    return match[1]


def hidden_fields(page: str) -> dict[str, str]:
    return {name: html.unescape(value) for name, value in
            re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', page)}


def notice(page: str) -> str:
    match = re.search(r'<p class="notice (?:ok|error)" role="status">([^<]*)</p>', page)
    return html.unescape(match[1]) if match else ""


async def states(store: Store, ids: list[int]) -> set[State]:
    found = [await store.get(i) for i in ids]
    return {d.state for d in found if d is not None}


async def spring(store: Store, n: int) -> list[int]:
    return [(await store.enqueue(Message(key=f"spring:{i}", to=f"u{i}@example.com", text="t",
                                         lane="bulk", import_id="spring"))).id
            for i in range(n)]


async def test_the_browser_pages_through_a_filtered_selection(client: httpx.AsyncClient,
                                                              store: Store) -> None:
    await sign_in(client, store)
    ids = await spring(store, 60)
    await store.enqueue(Message(key="reset:1", to="ada@example.com", text="t"))
    page = (await client.get("/dashboard/messages", params={"import_id": "spring"})).text
    assert "<strong>60</strong> messages in this selection" in page
    shown = [int(i) for i in re.findall(r'<tr data-id="(\d+)">', page)]
    assert shown == sorted(ids, reverse=True)[:50]
    older = re.search(r'<a href="([^"]+)" rel="next">Older', page)
    assert older is not None
    query = parse_qs(urlsplit(html.unescape(older[1])).query)
    assert query == {"import_id": ["spring"], "before": [str(shown[-1])]}
    page = (await client.get(html.unescape(older[1]))).text
    assert [int(i) for i in re.findall(r'<tr data-id="(\d+)">', page)] == sorted(ids)[:10][::-1]
    assert 'rel="next"' not in page and "« Newest" in page

    refused = await client.get("/dashboard/messages", params={"state": "stuck"})
    assert refused.status_code == 400 and "unknown state &#39;stuck&#39;" in refused.text
    refused = await client.get("/dashboard/messages", params={"before": "x1"})
    assert refused.status_code == 400 and "is not a delivery id" in refused.text


async def test_a_bulk_cancel_is_counted_confirmed_and_kept_to_its_count(
        client: httpx.AsyncClient, store: Store) -> None:
    await sign_in(client, store)
    ids = await spring(store, 3)
    browser = (await client.get("/dashboard/messages", params={"import_id": "spring"})).text
    assert 'href="/dashboard/bulk/cancel?import_id=spring"' in browser
    confirm = (await client.get("/dashboard/bulk/cancel", params={"import_id": "spring"})).text
    assert "Cancel <strong>3</strong> queued deliveries" in confirm
    fields = hidden_fields(confirm)
    assert fields["import_id"] == "spring" and fields["state"] == "queued"
    assert (fields["expected"], fields["upto_id"]) == ("3", str(ids[-1]))  # the preview's
    late = (await store.enqueue(Message(key="spring:late", to="late@example.com", text="t",
                                        lane="bulk", import_id="spring"))).id
    # Without the form's token (a forged form from elsewhere), nothing happens.
    forged = await client.post("/dashboard/bulk/cancel", data={**fields, "csrf": "0" * 32})
    assert forged.status_code == 303
    assert "the form expired" in notice((await client.get(forged.headers["location"])).text)
    assert await states(store, ids) == {State.PENDING}
    # A selection that holds more than was confirmed is refused whole (the operation's rule).
    grown = await client.post("/dashboard/bulk/cancel", data={**fields, "expected": "2"})
    assert "holds 3 deliveries now, more than the 2 confirmed" in notice(
        (await client.get(grown.headers["location"])).text)
    assert await states(store, ids) == {State.PENDING}
    done = await client.post("/dashboard/bulk/cancel", data={**fields, "reason": "bad list"})
    assert done.status_code == 303
    assert done.headers["location"] == "/dashboard/messages?state=queued&import_id=spring"
    page = (await client.get(done.headers["location"])).text
    assert notice(page) == "cancelled 3 queued deliveries"
    # The same form again: nothing is left to cancel, and nothing newer is taken.
    again = await client.post("/dashboard/bulk/cancel", data=fields)
    assert notice((await client.get(again.headers["location"])).text) == (
        "cancelled 0 queued deliveries")
    for delivery_id in ids:
        delivery = await store.get(delivery_id)
        assert delivery is not None and delivery.state is State.CANCELLED
        event = (await store.timeline(delivery_id))[-1]
        assert event.data == {"reason": "bad list", "by": "apikey:ops#1"}
    still = await store.get(late)  # enqueued after the count: not part of what was confirmed
    assert still is not None and still.state is State.PENDING


async def test_a_read_only_key_gets_no_bulk_action(client: httpx.AsyncClient,
                                                   store: Store) -> None:
    await sign_in(client, store, "read")
    ids = await spring(store, 2)
    page = (await client.get("/dashboard/messages")).text
    assert "/dashboard/bulk/" not in page
    confirm = (await client.get("/dashboard/bulk/cancel")).text
    assert "lacks the 'operate' scope" in confirm
    assert 'action="/dashboard/bulk/cancel"' not in confirm
    refused = await client.post("/dashboard/bulk/cancel", data={"csrf": csrf(page)})
    assert "lacks the 'operate' scope" in notice((await client.get(
        refused.headers["location"])).text)
    assert await states(store, ids) == {State.PENDING}


async def test_a_bulk_resolve_asks_how(client: httpx.AsyncClient, store: Store) -> None:
    await sign_in(client, store)
    ids = await spring(store, 2)
    claimed = await store.claim_batch("bulk", 10, "w", timedelta(seconds=30))
    await store.start_attempts("w", [Claim(d.id, d.claims) for d in claimed])
    await store.set_state_if_sending_many("w", [Transition(
        d.id, d.claims, State.AMBIGUOUS, "ambiguous", detail={"outcome": "ambiguous"})
        for d in claimed])
    confirm = (await client.get("/dashboard/bulk/resolve", params={"state": "ambiguous"})).text
    assert "Resolve <strong>2</strong> ambiguous deliveries" in confirm
    fields = hidden_fields(confirm)
    unchosen = await client.post("/dashboard/bulk/resolve", data=fields)
    assert "choose how to resolve" in notice((await client.get(
        unchosen.headers["location"])).text)
    done = await client.post("/dashboard/bulk/resolve", data={**fields, "resolution": "sent"})
    assert notice((await client.get(done.headers["location"])).text) == (
        "resolved 2 ambiguous deliveries as sent")
    assert await states(store, ids) == {State.SENT}
    wrong = await client.get("/dashboard/bulk/resolve", params={"state": "sent"})
    assert wrong.status_code == 400 and "resolve applies to deliveries in state ambiguous" \
        in wrong.text


async def test_a_message_page_previews_its_content_without_remote_loads(
        client: httpx.AsyncClient, store: Store) -> None:
    await sign_in(client, store)
    result = await store.enqueue(Message(
        key="receipt:1", to="ada@example.com", subject="Your receipt", text="Total: 12 EUR",
        html='<p>Total: <b>12 EUR</b></p><img src="https://tracker.example/p.gif">'))
    claimed = await store.claim_batch("interactive", 1, "w", timedelta(seconds=30))
    await store.start_attempts("w", [Claim(d.id, d.claims) for d in claimed])
    await store.set_state_if_sending_many("w", [Transition(
        result.id, claimed[0].claims, State.SENT, "sent", error="250 2.0.0 Ok: queued as 4F2",
        provider_message_id="4F2", detail={"outcome": "accepted", "duration_ms": 12.5})])
    page = (await client.get(f"/dashboard/messages/{result.id}")).text
    assert "<dt>Provider reply</dt>" in page and "Last error" not in page
    assert "250 2.0.0 Ok: queued as 4F2" in page and "(or the last error" not in page
    assert '<pre class="text-part">Total: 12 EUR</pre>' in page
    assert (f'sandbox="" referrerpolicy="no-referrer" src="/dashboard/messages/{result.id}/html"'
            in page)
    assert "12.5 ms" in page  # the attempt, with its duration
    frame = await client.get(f"/dashboard/messages/{result.id}/html")
    assert frame.status_code == 200 and "tracker.example" in frame.text
    policy = frame.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "img-src data:" in policy
    assert "sandbox" in policy and "frame-ancestors 'self'" in policy
    assert frame.headers["x-content-type-options"] == "nosniff"
    plain = await store.enqueue(Message(key="code:1", to="bob@example.com", text="123456"))
    assert (await client.get(f"/dashboard/messages/{plain.id}/html")).status_code == 404
    page = (await client.get(f"/dashboard/messages/{plain.id}")).text
    assert "No HTML part." in page and 'action="/dashboard/messages/' in page  # Cancel
    cancelled = await client.post(f"/dashboard/messages/{plain.id}/cancel",
                                  data={"csrf": csrf(page)})
    assert notice((await client.get(cancelled.headers["location"])).text) == (
        f"cancelled delivery {plain.id}")


async def test_workers_and_throughput_come_from_the_database(client: httpx.AsyncClient,
                                                             store: Store) -> None:
    await sign_in(client, store)
    page = (await client.get("/dashboard/workers")).text
    assert "No worker has written a heartbeat" in page
    await store.record_heartbeat(WorkerHeartbeat(
        owner="mail-1:4242:abc", host="mail-1", pid=4242, version="0.1.0", provider="ses",
        lanes={"interactive": 0.7, "bulk": 0.3}, in_flight=17, interval_s=5.0),
        {("bulk", "sent"): 1200, ("bulk", "throttled"): 30, ("interactive", "dead"): 2})
    page = (await client.get("/dashboard/workers")).text
    row = re.search(r'<tr data-owner="mail-1:4242:abc" class="alive">(.*?)</tr>', page, re.S)
    assert row is not None
    for text in ("mail-1", "4242", "bulk 30%, interactive 70%", "17", "ses", "running"):
        assert text in row[1]
    page = (await client.get("/dashboard/outcomes")).text
    bulk = re.search(r'data-lane="bulk">(.*?)</section>', page, re.S)
    assert bulk is not None
    assert re.search(r'data-outcome="sent">.*?1,200 <span class="muted">\(average 0\.01/s\)',
                     bulk[1], re.S)
    assert re.search(r'data-outcome="throttled">.*?>30<', bulk[1], re.S)
    assert bulk[1].count("<svg") == 5


async def test_the_breaker_banner_is_on_every_page_and_probes_now(
        client: httpx.AsyncClient, store: Store) -> None:
    await sign_in(client, store)
    assert "breaker-banner" not in (await client.get("/dashboard")).text
    record = account_trouble(1000.0, BreakerConfig(), "535 5.7.8 Authentication failed")
    record = type(record)(**{**record.as_json(), "until": 10.0**12})  # far in the future
    await store.set_control(CONTROL_PREFIX + "smtp", record.as_json())
    for path in ("/dashboard", "/dashboard/messages", "/dashboard/workers",
                 "/dashboard/outcomes", "/dashboard/dead-letters"):
        page = (await client.get(path)).text
        assert "Breaker open for smtp" in page, path
        assert "535 5.7.8 Authentication failed" in page, path
    page = (await client.get("/dashboard/workers")).text
    probed = await client.post("/dashboard/breakers/smtp/probe",
                               data={"csrf": csrf(page), "back_to": "/dashboard/workers"})
    assert probed.headers["location"] == "/dashboard/workers"
    assert "a worker sends the probe" in notice((await client.get("/dashboard/workers")).text)
    until = (await store.get_controls())[CONTROL_PREFIX + "smtp"].value["until"]
    assert until < 10.0**12


async def dead_digests(store: Store, n: int) -> list[int]:
    ids = [(await store.enqueue(Message(key=f"digest:{i}", to=f"r{i}@example.com", text="t",
                                        lane="bulk"))).id for i in range(n)]
    claimed = await store.claim_batch("bulk", n, "w", timedelta(seconds=30))
    await store.start_attempts("w", [Claim(d.id, d.claims) for d in claimed])
    await store.set_state_if_sending_many("w", [Transition(
        d.id, d.claims, State.DEAD, "dead_lettered", dead_reason="permanent",
        detail={"outcome": "permanent"}) for d in claimed])
    return ids


async def test_bulk_discard_and_staged_replay_from_the_browser(client: httpx.AsyncClient,
                                                               store: Store) -> None:
    await sign_in(client, store)
    ids = await dead_digests(store, 4)
    confirm = (await client.get("/dashboard/bulk/discard", params={"key": "digest:3"})).text
    assert "of <strong>1</strong> dead deliveries" in confirm
    done = await client.post("/dashboard/bulk/discard", data={
        **hidden_fields(confirm), "reason": "reader left"})
    assert notice((await client.get(done.headers["location"])).text) == (
        "discarded 1 dead letter")
    assert (await store.timeline(ids[3]))[-1].data == {"by": "apikey:ops#1",
                                                       "reason": "reader left"}
    fields = hidden_fields((await client.get("/dashboard/bulk/replay",
                                             params={"state": "dead", "lane": "bulk"})).text)
    first = await client.post("/dashboard/bulk/replay", data=fields)
    assert notice((await client.get(first.headers["location"])).text) == (
        f"replayed the canary, delivery {ids[0]}; once it is sent, replay the rest of this "
        "selection")
    again = await client.post("/dashboard/bulk/replay", data=fields)
    assert "the canary has not been sent yet" in notice(
        (await client.get(again.headers["location"])).text)
    assert await states(store, ids[1:3]) == {State.DEAD}
    assert (await store.timeline(ids[0]))[-1].data["by"] == "apikey:ops#1"


async def test_one_ambiguous_message_is_resolved_from_its_page(client: httpx.AsyncClient,
                                                               store: Store) -> None:
    await sign_in(client, store)
    result = await store.enqueue(Message(key="invoice:1", to="b@example.com", text="t"))
    claimed = await store.claim_batch("interactive", 1, "w", timedelta(seconds=30))
    await store.start_attempts("w", [Claim(d.id, d.claims) for d in claimed])
    await store.set_state_if_sending_many("w", [Transition(
        result.id, claimed[0].claims, State.AMBIGUOUS, "ambiguous", error="timed out",
        detail={"outcome": "ambiguous"})])
    page = (await client.get(f"/dashboard/messages/{result.id}")).text
    assert "<dt>Last error</dt>" in page and 'name="resolution"' in page
    done = await client.post(f"/dashboard/messages/{result.id}/resolve", data={
        "csrf": csrf(page), "resolution": "dead", "note": "not in the provider's log"})
    assert notice((await client.get(done.headers["location"])).text) == (
        f"resolved delivery {result.id} as dead")
    delivery = await store.get(result.id)
    assert delivery is not None and delivery.state is State.DEAD
    assert (await store.timeline(result.id))[-1].data["note"] == "not in the provider's log"
