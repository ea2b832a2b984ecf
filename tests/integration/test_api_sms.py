"""The HTTP API and the second channel, on both engines: an email sent with an SMS fallback
in its metadata, refused for good; ``GET /v1/messages/{id}`` of either half names the pair;
``GET /v1/status`` counts fallbacks and pending deliveries by channel; a bad fallback is a 422
with nothing stored."""

from __future__ import annotations

from datetime import timedelta

from test_api import Api, api, body  # noqa: F401  (api: the fixture)
from test_sms_fallback import sweeper

from postlane.core.records import Transition
from postlane.core.states import State

FALLBACK = {"to": "+14155550100", "text": "Your reset code is 123456"}


async def test_either_half_of_the_pair_names_the_other(api: Api) -> None:
    sent = await api.send("reset:api", body(metadata={"sms_fallback": FALLBACK}))
    assert sent.status_code == 201, sent.text
    email_id = sent.json()["id"]
    [claimed] = await api.store.claim_batch("interactive", 1, "w", timedelta(seconds=30))
    await api.store.set_state_if_sending_many("w", [Transition(
        id=claimed.id, claims=claimed.claims, state=State.DEAD, event="dead_lettered",
        dead_reason="permanent", error="550 no such user")])
    assert await sweeper(api.store).fallbacks() == 1
    email = (await api.client.get(f"/v1/messages/{email_id}", headers=api.auth("read"))).json()
    pair = email["fallback"]
    assert (pair["email_id"], pair["reason"]) == (email_id, "dead")
    assert "sms_fallback" in [e["kind"] for e in email["timeline"]]
    sms = (await api.client.get(f"/v1/messages/{pair['sms_id']}",
                                headers=api.auth("read"))).json()
    assert sms["fallback"] == pair
    assert sms["message"]["channel"] == "sms"
    assert sms["message"]["key"] == "sms-fallback:reset:api"
    assert sms["message"]["metadata"]["sms"] == {"encoding": "GSM-7", "segments": 1,
                                                 "units": 25}
    status = (await api.client.get("/v1/status", headers=api.auth("read"))).json()
    assert status["sms_fallbacks"] == {"dead": 1}
    assert status["pending_by_channel"] == {"sms": 1}
    plain = await api.send("plain:1", body())
    detail = (await api.client.get(f"/v1/messages/{plain.json()['id']}",
                                   headers=api.auth("read"))).json()
    assert detail["fallback"] is None


async def test_a_bad_fallback_is_refused_and_nothing_stored(api: Api) -> None:
    answer = await api.send("reset:bad", body(metadata={"sms_fallback": {
        "to": "0151-1234", "text": "x"}}))
    assert answer.status_code == 422, answer.text
    assert "sms_fallback.to" in answer.text
    assert await api.store.get("reset:bad") is None
