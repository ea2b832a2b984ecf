"""Webhooks over HTTP: a bad signature is a 401 problem (never a 500); a good one is recorded."""

from __future__ import annotations

import base64
import time

import pytest

from postlane.providers.sandbox_events import webhook_request
from tests.integration.test_api import Api, api, problem  # noqa: F401  (the fixture)

pytestmark = pytest.mark.asyncio

SECRET = "whsec_" + base64.b64encode(b"api-webhook-secret-0123456789").decode()
OTHER = "whsec_" + base64.b64encode(b"somebody-else-entirely-xyz").decode()


@pytest.fixture(autouse=True)
def secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POSTLANE_WEBHOOK_SECRET_SANDBOX", f"{OTHER},{SECRET}")  # a rotation


def signed(**kw: object) -> tuple[dict[str, str], bytes]:
    return webhook_request(SECRET, "email.delivered", "sbx-1", "a@example.com", **kw)  # type: ignore[arg-type]


def broken(breakage: str) -> tuple[dict[str, str], bytes]:
    now = int(time.time())
    if breakage == "wrong secret":
        return webhook_request("whsec_" + base64.b64encode(b"wrong-secret-wrong").decode(),
                               "email.delivered", "sbx-1", "a@example.com")
    if breakage == "stale":
        return signed(timestamp=now - 3600)
    if breakage == "future":
        return signed(timestamp=now + 3600)
    headers, body = signed()
    if breakage == "tampered":
        return headers, body.replace(b"delivered", b"bounced")
    if breakage.startswith("missing"):
        del headers[f"webhook-{breakage.removeprefix('missing ')}"]
    elif breakage == "malformed":
        headers["webhook-signature"] = "v1,###not base64###"
    elif breakage == "garbage timestamp":
        headers["webhook-timestamp"] = "soon"
    return headers, body


@pytest.mark.parametrize("breakage", [
    "tampered", "wrong secret", "stale", "future", "missing id", "missing timestamp",
    "missing signature", "malformed", "garbage timestamp",
])
async def test_bad_webhooks_are_401(api: Api, breakage: str) -> None:
    headers, body = broken(breakage)
    response = await api.client.post("/v1/webhooks/sandbox", content=body, headers=headers)
    problem(response, 401)


async def test_a_good_webhook_is_recorded_once(api: Api) -> None:
    headers, body = signed(event_id="evt-http-1")
    first = await api.client.post("/v1/webhooks/sandbox", content=body, headers=headers)
    again = await api.client.post("/v1/webhooks/sandbox", content=body, headers=headers)
    assert first.status_code == 200 and again.status_code == 200, first.text
    assert "duplicate" in again.text


async def test_bounces_and_complaints_are_counted_per_lane_once_each(api: Api) -> None:
    from datetime import timedelta

    from postlane import Message, State
    from postlane.store.base import Transition

    for key, pmid in (("b:1", "sbx-b1"), ("b:2", "sbx-b2")):
        await api.store.enqueue(Message(key=key, to=f"{key[2]}@example.com", text="t",
                                        lane="bulk"))
        (held,) = await api.store.claim_batch("bulk", 1, "w", timedelta(seconds=30))
        await api.store.set_state_if_sending_many("w", [Transition(
            held.id, held.claims, State.SENT, "sent", provider_message_id=pmid)])
    for kind, pmid, event_id in (("email.bounced", "sbx-b1", "e1"),
                                 ("email.bounced", "sbx-b1", "e1"),  # a repeat: once
                                 ("email.complained", "sbx-b2", "e2"),
                                 ("email.bounced", "sbx-unknown", "e3")):  # no delivery
        headers, body = webhook_request(SECRET, kind, pmid, "x@example.com",
                                        event_id=event_id)
        answer = await api.client.post("/v1/webhooks/sandbox", content=body, headers=headers)
        assert answer.status_code == 200, answer.text
    text = (await api.client.get("/metrics")).text
    for line in ('postlane_provider_events_total{kind="bounced",lane="bulk"} 1.0',
                 'postlane_provider_events_total{kind="complained",lane="bulk"} 1.0'):
        assert line in text, line  # once each: the repeat of e1 is not counted again
