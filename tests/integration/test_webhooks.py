"""Provider webhooks with real signatures, events processed once, and the suppression list."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest

from postlane import Message, State
from postlane.providers.sandbox import SandboxConfig, SandboxProvider
from postlane.providers.sandbox_events import SandboxEvents, webhook_request
from postlane.store.base import Store
from postlane.webhooks import WebhookConfig, WebhookRejected, receive
from postlane.webhooks.signatures import sign_standard
from postlane.worker import Worker, WorkerConfig
from tests.conftest import SideDB, store_url

pytestmark = pytest.mark.asyncio

SECRET = "whsec_" + base64.b64encode(b"sandbox-secret-0123456789abcdef").decode()
OLD_SECRET = "whsec_" + base64.b64encode(b"the-previous-secret-0123456789").decode()
CONFIG = WebhookConfig(secrets={"sandbox": (SECRET,), "resend": (SECRET,)})


async def drain(store: Store, provider: SandboxProvider) -> None:
    await Worker(store, provider, config=WorkerConfig(
        drain=True, concurrency=5, poll_interval_s=0.05, controls_interval_s=0.05)).run()


async def sent_delivery(store: Store, provider: SandboxProvider, key: str, to: str) -> Any:
    result = await store.enqueue(Message(key=key, to=to, subject="s", text="t"))
    await drain(store, provider)
    delivery = await store.get(result.id)
    assert delivery is not None and delivery.state is State.SENT
    return delivery


def tampered(headers: dict[str, str], body: bytes) -> tuple[dict[str, str], bytes]:
    return headers, body.replace(b"delivered", b"bounced!!")


@pytest.mark.parametrize("breakage", [
    "tampered body", "wrong secret", "stale timestamp", "future timestamp",
    "missing id", "missing timestamp", "missing signature", "malformed signature",
    "non-numeric timestamp", "not base64 signature",
])
async def test_bad_signatures_are_rejected(store: Store, breakage: str) -> None:
    now = int(time.time())
    timestamp = {"stale timestamp": now - 3600, "future timestamp": now + 3600}.get(
        breakage, now)
    secret = "whsec_" + base64.b64encode(b"some-other-secret-xx").decode() \
        if breakage == "wrong secret" else SECRET
    headers, body = webhook_request(secret, "email.delivered", "sbx-1", "a@example.com",
                                    timestamp=timestamp)
    if breakage == "tampered body":
        headers, body = tampered(headers, body)
    elif breakage.startswith("missing"):
        del headers[f"webhook-{breakage.split()[1]}"]
    elif breakage == "malformed signature":
        headers["webhook-signature"] = "v1"
    elif breakage == "non-numeric timestamp":
        headers["webhook-timestamp"] = "yesterday"
    elif breakage == "not base64 signature":
        headers["webhook-signature"] = "v1,@@@@ v2,xyz"
    with pytest.raises(WebhookRejected):
        await receive(store, "sandbox", headers, body, CONFIG)


async def test_secret_rotation_accepts_old_and_new(store: Store) -> None:
    rotating = WebhookConfig(secrets={"sandbox": (SECRET, OLD_SECRET)})
    for secret, event_id in ((OLD_SECRET, "evt-old"), (SECRET, "evt-new")):
        headers, body = webhook_request(secret, "email.delivered", "sbx-x", "a@example.com",
                                        event_id=event_id)
        result = await receive(store, "sandbox", headers, body, rotating)
        assert result.status == 200


async def test_duplicate_event_is_processed_once(store: Store) -> None:
    provider = SandboxProvider(SandboxConfig(seed=1))
    delivery = await sent_delivery(store, provider, "receipt:1", "ann@example.com")
    headers, body = webhook_request(SECRET, "email.delivered", delivery.provider_message_id,
                                    "ann@example.com", event_id="evt-1")
    first = await receive(store, "sandbox", headers, body, CONFIG)
    second = await receive(store, "sandbox", headers, body, CONFIG)
    assert first.events[0]["duplicate"] is False
    assert first.events[0]["delivery_id"] == delivery.id
    assert second.events[0]["duplicate"] is True
    kinds = [e.kind for e in await store.timeline(delivery.id)]
    assert kinds.count("provider:delivered") == 1


async def test_out_of_order_events_leave_the_right_final_state(store: Store) -> None:
    provider = SandboxProvider(SandboxConfig(seed=2))
    delivery = await sent_delivery(store, provider, "receipt:2", "bob@example.com")
    pmid = delivery.provider_message_id
    for event_id, kind in (("e1", "email.bounced"), ("e2", "email.delivered")):
        headers, body = webhook_request(SECRET, kind, pmid, "bob@example.com",
                                        event_id=event_id)
        await receive(store, "sandbox", headers, body, CONFIG)
    with SideDB(store_url(store)) as side:
        status = side.scalar("SELECT provider_status FROM postlane_deliveries WHERE id = ?",
                             (delivery.id,))
    assert status == "bounced"  # the late "delivered" did not move it backwards
    kinds = [e.kind for e in await store.timeline(delivery.id)]
    assert kinds[-2:] == ["provider:bounced", "provider:delivered"]
    final = await store.get(delivery.id)
    assert final is not None and final.state is State.SENT


async def test_sandbox_bounce_suppresses_the_next_delivery(store: Store) -> None:
    provider = SandboxProvider(SandboxConfig(seed=3))
    events = SandboxEvents(secret=SECRET, bounce=r"^gone@")
    events.attach(provider.engine)
    await sent_delivery(store, provider, "welcome:1", "gone@example.com")

    async def post(headers: dict[str, str], body: bytes) -> object:
        return await receive(store, "sandbox", headers, body, CONFIG)

    assert await events.flush(post) == 1
    [suppression] = await store.list_suppressions("gone@example.com")
    assert suppression.stream == "*" and suppression.reason == "hard bounce"

    accepted_before = provider.engine.stats.accepted
    nxt = await store.enqueue(Message(key="reset:9", to="Gone@Example.com", subject="s",
                                      text="t"))
    await drain(store, provider)
    delivery = await store.get(nxt.id)
    assert delivery is not None and delivery.state is State.SUPPRESSED
    assert provider.engine.stats.accepted == accepted_before  # never reached the provider
    assert (await store.stats()).dead_letters == {}  # not a dead letter
    assert "suppressed" in [e.kind for e in await store.timeline(nxt.id)]

    # An operator lifts it and sends what was suppressed, with the same key.
    assert await store.unsuppress("gone@example.com") == 1
    assert await store.requeue_suppressed("gone@example.com") == [nxt.id]
    await drain(store, provider)
    delivery = await store.get(nxt.id)
    assert delivery is not None and delivery.state is State.SENT


async def test_resend_uses_svix_headers(store: Store) -> None:
    provider = SandboxProvider(SandboxConfig(seed=4))
    delivery = await sent_delivery(store, provider, "verify:1", "cat@example.com")
    body = json.dumps({"type": "email.complained", "created_at": "2026-11-30T00:00:00Z",
                       "data": {"email_id": delivery.provider_message_id,
                                "to": ["cat@example.com"]}}).encode()
    now = int(time.time())
    headers = {"svix-id": "msg_1", "svix-timestamp": str(now),
               "svix-signature": sign_standard(SECRET, "msg_1", now, body)}
    result = await receive(store, "resend", headers, body, CONFIG)
    assert result.events[0]["suppressed"] == "cat@example.com"
    [suppression] = await store.list_suppressions("cat@example.com")
    assert suppression.stream == "interactive" and suppression.reason == "complaint"
    with pytest.raises(WebhookRejected):
        await receive(store, "resend", {k.replace("svix", "webhook"): v
                                        for k, v in headers.items()}, body, CONFIG)
