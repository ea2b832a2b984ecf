"""The Twilio adapter against a fake of Twilio's Messages API served by uvicorn on loopback.

The fake follows Twilio's documented request and answers: ``POST
/2010-04-01/Accounts/{AccountSid}/Messages.json``, form-encoded ``To``, ``From`` (or
``MessagingServiceSid``) and ``Body``, HTTP Basic auth with the account SID and auth token;
``201`` with the message resource (``sid``, ``status``, ``num_segments``); refusals as
``{"code", "message", "more_info", "status"}``: 20003 (401, authentication), 20404 (404, an
unknown account), 21211 (400, an invalid 'To' number), 21606 (400, a 'From' number not of
the account), 20429 (429, too many requests), 21611 (400, the sender's queue is full).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import parse_qs, quote

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from postlane.core.outcomes import OutcomeClass
from postlane.core.sms import sms_message
from postlane.core.states import DeadReason, State
from postlane.errors import ConfigurationError
from postlane.providers.registry import open_provider
from postlane.providers.sandbox_server import bind
from postlane.providers.twilio import TwilioProvider
from postlane.store import Store
from postlane.worker import Worker
from tests.factories import delivery
from tests.integration.worker_helpers import fast_config, in_state, running

SID = "AC" + "0123456789abcdef" * 2
TOKEN = "twilio-Secret-token"
SENDER = "+15005550006"


def error(status: int, code: int, message: str) -> JSONResponse:
    return JSONResponse({"code": code, "message": message,
                         "more_info": f"https://www.twilio.com/docs/errors/{code}",
                         "status": status}, status)


class FakeTwilio:
    """What reached the fake, and what it answers next (``script``: codes to answer)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.accepted: list[dict[str, str]] = []
        self.script: list[int] = []
        self.ids = itertools.count(1)
        self.app = FastAPI()
        self.app.add_api_route("/2010-04-01/Accounts/{account}/Messages.json", self.create,
                               methods=["POST"])

    async def create(self, account: str, request: Request) -> JSONResponse:
        form = {k: v[-1] for k, v in parse_qs((await request.body()).decode()).items()}
        self.requests.append({"headers": dict(request.headers), "form": form,
                              "account": account})
        expected = "Basic " + base64.b64encode(f"{SID}:{TOKEN}".encode()).decode()
        if request.headers.get("authorization") != expected:
            return error(401, 20003, "Authenticate")
        if account != SID:
            return error(404, 20404, f"The requested resource /2010-04-01/Accounts/{account}/"
                         "Messages.json was not found")
        if self.script:
            code = self.script.pop(0)
            if code == 20429:
                return error(429, 20429, "Too Many Requests")
            if code == 21611:
                return error(400, 21611, "This 'From' number has exceeded the maximum number "
                             "of queued messages")
            if code == 500:
                return JSONResponse({"code": 20500, "message": "Internal Server Error",
                                     "status": 500}, 500)
        to = form.get("To", "")
        if not to.startswith("+") or not to[1:].isdigit() or to.startswith("+1555"):
            return error(400, 21211, f"The 'To' number {to} is not a valid phone number.")
        if form.get("From") not in (SENDER, None) and "MessagingServiceSid" not in form:
            return error(400, 21606, f"The From phone number {form.get('From')} is not a "
                         "valid, SMS-capable inbound phone number or short code for your "
                         "account.")
        if not form.get("Body"):
            return error(400, 21602, "Message body is required.")
        sid = f"SM{next(self.ids):032x}"
        self.accepted.append(form)
        return JSONResponse({"sid": sid, "account_sid": SID, "to": to,
                             "from": form.get("From"), "body": form["Body"],
                             "status": "queued", "num_segments": "1"}, 201)


@pytest.fixture
async def twilio() -> AsyncIterator[tuple[FakeTwilio, str]]:
    fake = FakeTwilio()
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(fake.app, log_level="warning", lifespan="off",
                                           timeout_graceful_shutdown=1))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield fake, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()


def url_for(base: str, *, sid: str = SID, token: str = TOKEN, sender: str = SENDER,
            extra: str = "") -> str:
    return (f"twilio://{sid}:{token}@?from={quote(sender)}&base_url={quote(base)}"
            f"&account_retry_after=7{extra}")


@asynccontextmanager
async def adapter(url: str) -> AsyncIterator[TwilioProvider]:
    provider = open_provider(url)
    assert isinstance(provider, TwilioProvider)
    await provider.open()
    try:
        yield provider
    finally:
        await provider.close()


def sms(key: str, to: str = "+14155550100", text: str = "Your code is 123456") -> Any:
    message = sms_message(key=key, to=to, text=text)
    return delivery(key, channel="sms", recipient=to, sender=None, subject="", text=text,
                    metadata=dict(message.metadata))


async def test_a_send_is_the_documented_form_with_basic_auth(
        twilio: tuple[FakeTwilio, str]) -> None:
    fake, base = twilio
    async with adapter(url_for(base)) as provider:
        outcome = await provider.send(sms("otp:1"))
    assert outcome.kind is OutcomeClass.ACCEPTED
    assert outcome.provider_message_id is not None
    assert outcome.provider_message_id.startswith("SM")
    [request] = fake.requests
    assert request["form"] == {"To": "+14155550100", "From": SENDER,
                               "Body": "Your code is 123456"}
    assert request["headers"]["content-type"] == "application/x-www-form-urlencoded"
    assert request["headers"]["x-postlane-key"] == "otp:1"


async def test_a_messaging_service_replaces_the_sender(twilio: tuple[FakeTwilio, str]) -> None:
    fake, base = twilio
    url = f"twilio://{SID}:{TOKEN}@?messaging_service=MG123&base_url={quote(base)}"
    async with adapter(url) as provider:
        assert (await provider.send(sms("otp:2"))).kind is OutcomeClass.ACCEPTED
    assert fake.requests[0]["form"]["MessagingServiceSid"] == "MG123"
    assert "From" not in fake.requests[0]["form"]


@pytest.mark.parametrize(("script", "to", "kind", "words"), [
    ([], "+15550001111", OutcomeClass.PERMANENT, "invalid 'To' phone number"),  # 21211
    ([20429], "+14155550100", OutcomeClass.THROTTLED, "too many requests"),
    ([21611], "+14155550100", OutcomeClass.THROTTLED, "queue is full"),
    ([500], "+14155550100", OutcomeClass.TRANSIENT, "Internal Server Error"),
])
async def test_refusals_map_by_twilio_code(
        twilio: tuple[FakeTwilio, str], script: list[int], to: str, kind: OutcomeClass,
        words: str) -> None:
    fake, base = twilio
    fake.script = list(script)
    async with adapter(url_for(base)) as provider:
        outcome = await provider.send(sms("otp:x", to=to))
    assert outcome.kind is kind
    assert words in (outcome.response or "")
    if script == [21611]:
        assert outcome.retry_after_s == 7.0  # the account's wait: no Retry-After was given


async def test_bad_credentials_and_a_foreign_sender_are_the_accounts_trouble(
        twilio: tuple[FakeTwilio, str]) -> None:
    _, base = twilio
    async with adapter(url_for(base, token="wrong")) as provider:
        outcome = await provider.send(sms("otp:3"))
    assert outcome.kind is OutcomeClass.ACCOUNT and "20003" in (outcome.response or "")
    assert TOKEN not in (outcome.response or "") and "wrong" not in (outcome.response or "")
    async with adapter(url_for(base, sender="+14150000000")) as provider:
        outcome = await provider.send(sms("otp:4"))
    assert outcome.kind is OutcomeClass.ACCOUNT and "21606" in (outcome.response or "")


async def test_an_email_delivery_is_refused_unsent(twilio: tuple[FakeTwilio, str]) -> None:
    fake, base = twilio
    async with adapter(url_for(base)) as provider:
        outcome = await provider.send(delivery("e:1"))
    assert outcome.kind is OutcomeClass.PERMANENT
    assert fake.requests == []


def test_url_problems_are_named_and_the_token_never_shown() -> None:
    with pytest.raises(ConfigurationError, match="account SID"):
        open_provider(f"twilio://nope:{TOKEN}@?from=%2B15005550006")
    with pytest.raises(ConfigurationError, match="needs a sender") as caught:
        open_provider(f"twilio://{SID}:{TOKEN}@")
    assert TOKEN not in str(caught.value)
    with pytest.raises(ConfigurationError, match="unknown option") as caught:
        open_provider(f"twilio://{SID}:{TOKEN}@?from=%2B15005550006&bogus=1")
    assert TOKEN not in str(caught.value)
    provider = open_provider(f"twilio://{SID}:{TOKEN}@?from=%2B15005550006")
    assert TOKEN not in repr(provider)
    assert provider.channel == "sms" and provider.account == f"twilio:{SID}"


async def test_a_worker_sends_sms_through_twilio_and_dead_letters_an_invalid_number(
        store: Store, twilio: tuple[FakeTwilio, str]) -> None:
    fake, base = twilio
    fake.script = [20429]  # the first request is throttled: no attempt spent
    good = await store.enqueue(sms_message(key="otp:ok", to="+14155550100", text="Code 1"))
    bad = await store.enqueue(sms_message(key="otp:bad", to="+15550001111", text="Code 2"))
    provider = open_provider(url_for(base))
    async with running(Worker(store, provider, config=fast_config())):
        sent = await in_state(store, good.id, State.SENT)
        dead = await in_state(store, bad.id, State.DEAD)
    assert sent.provider_message_id is not None and sent.provider_message_id.startswith("SM")
    assert sent.attempts == 1
    assert dead.dead_reason == DeadReason.PERMANENT
    assert "21211" in (dead.last_error or "")
    assert [f["To"] for f in fake.accepted] == ["+14155550100"]
