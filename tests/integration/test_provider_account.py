"""The provider's word, read right, end to end: the real ``Worker`` on both store engines
against real servers on loopback (and SES on moto).

- Account-level trouble -- SMTP answering 535 to AUTH, an HTTP API answering 401, SES
  refusing an unverified sender -- opens the breaker at once with the cause recorded, and
  leaves every delivery pending with its attempts unspent: nothing is dead-lettered. Once
  the account is fixed, the breaker's probe goes through and everything is sent, each
  delivery on its first attempt.
- A 4xx that carries ``Retry-After`` is retried at that time, never dead-lettered.

The breaker's clock is the worker's injected one: the recovery half moves it past the
cool-down instead of waiting for it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import boto3
import pytest
import uvicorn
from conftest import msg
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from moto.core import DEFAULT_ACCOUNT_ID
from moto.ses.models import ses_backends

from postlane.core.breaker import CONTROL_PREFIX, BreakerConfig, BreakerRecord
from postlane.core.states import State
from postlane.providers.base import Provider
from postlane.providers.registry import open_provider
from postlane.providers.sandbox_server import bind
from postlane.store import Store
from postlane.worker import Worker
from postlane.worker.drain import DrainResult, drain_within
from tests.integration.test_provider_ses import (  # noqa: F401  (the moto fixtures)
    REGION,
    SECRET,
    moto,
    moto_url,
    ses_url,
)
from tests.integration.test_provider_smtp import Handler, smtp_server
from tests.integration.worker_helpers import event_kinds, fast_config, running, wait_until

TOKEN = "acct-Token-42"
KEYS = [f"acct:{i}" for i in range(6)]
HOLD = BreakerConfig(min_failures=10_000, cooldown_s=600.0, max_cooldown_s=1200.0)
"""A cool-down far longer than the test: no probe runs until the clock is moved."""


# -- the servers ---------------------------------------------------------------------------
class Login:
    """aiosmtpd's authenticator: refuses every login until ``accept`` is set."""

    def __init__(self) -> None:
        self.accept = False
        self.attempts = 0

    def __call__(self, server: Any, session: Any, envelope: Any, mechanism: str,
                 auth_data: Any) -> Any:
        from aiosmtpd.smtp import AuthResult

        self.attempts += 1
        return AuthResult(success=self.accept, handled=False)


class Api:
    """A JSON email API on loopback: 401 while the token is wrong, scripted answers first."""

    def __init__(self) -> None:
        self.token = "the-old-one"
        self.script: list[tuple[int, dict[str, str]]] = []
        """Next answers before any acceptance: (status, headers)."""
        self.answers: Counter[int] = Counter()
        self.accepted: Counter[str] = Counter()
        self.app = FastAPI()
        self.app.add_api_route("/send", self.send, methods=["POST"])

    async def send(self, request: Request) -> JSONResponse:
        await request.body()
        if request.headers.get("authorization") != f"Bearer {self.token}":
            self.answers[401] += 1
            return JSONResponse({"error": "invalid API token"}, 401)
        if self.script:
            status, headers = self.script.pop(0)
            self.answers[status] += 1
            return JSONResponse({"error": "busy, come back later"}, status, headers=headers)
        key = request.headers["idempotency-key"]
        self.accepted[key] += 1
        self.answers[200] += 1
        return JSONResponse({"id": f"api-{len(self.accepted)}"})


@pytest.fixture
async def api() -> AsyncIterator[tuple[Api, str]]:
    fake = Api()
    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(fake.app, log_level="warning", lifespan="off",
                                           timeout_graceful_shutdown=1))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield fake, f"http://127.0.0.1:{sock.getsockname()[1]}/send"
    finally:
        server.should_exit = True
        await task
        sock.close()


# -- the two halves: held while broken, sent once fixed ------------------------------------
async def held_for_account_trouble(store: Store, provider: Provider,
                                   caplog: pytest.LogCaptureFixture) -> BreakerRecord:
    """Run a worker until the account's trouble has opened the breaker; stop it; check that
    every delivery waits in ``pending`` unspent and nothing was dead-lettered."""
    worker = Worker(store, provider, config=fast_config(breaker=HOLD))
    name = CONTROL_PREFIX + provider.account
    with caplog.at_level(logging.ERROR, logger="postlane.breaker"):
        async with running(worker):
            async def opened() -> bool:
                controls = await store.get_controls()
                states = (await store.stats()).states
                return name in controls and not states.get("sending")
            await wait_until(opened, timeout=20, what="the breaker open, nothing in flight")
    assert worker.counters["outcome:account"] >= 1
    for key in KEYS:
        delivery = await store.get(key)
        assert delivery is not None
        assert (delivery.state, delivery.attempts) == (State.PENDING, 0), key
    stats = await store.stats()
    assert stats.states.get("dead", 0) == 0 and not stats.dead_letters
    tried = [d for d in [await store.get(k) for k in KEYS] if d is not None and d.claims]
    assert tried
    for delivery in tried:  # each attempt that met the trouble went back unspent
        assert "account_trouble" in await event_kinds(store, delivery.id)
    alerts = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ALERT")]
    assert len(alerts) == 1 and "account trouble" in alerts[0]
    record = BreakerRecord.from_json((await store.get_controls())[name].value)
    assert record.state == "open" and record.reason.startswith("account trouble: ")
    return record


async def sent_once_fixed(store: Store, provider: Provider) -> None:
    """With the account fixed, a worker whose clock is past the cool-down probes, closes the
    breaker and drains: every delivery sent on its first attempt."""
    worker = Worker(store, provider, config=fast_config(breaker=HOLD, drain=True))
    worker.breaker.clock = lambda: time.time() + HOLD.max_cooldown_s
    async with asyncio.timeout(30):
        await worker.run()
    for key in KEYS:
        delivery = await store.get(key)
        assert delivery is not None
        assert (delivery.state, delivery.attempts) == (State.SENT, 1), key
    assert CONTROL_PREFIX + provider.account not in await store.get_controls()


# -- SMTP: 535 to AUTH ---------------------------------------------------------------------
async def test_smtp_535_holds_every_delivery_until_the_login_works(
    store: Store, caplog: pytest.LogCaptureFixture,
) -> None:
    await store.enqueue_many([msg(k, sender="app@example.org") for k in KEYS])
    handler, login = Handler(), Login()
    async with smtp_server(handler, authenticator=login, auth_require_tls=False) as server:
        # No TLS on this test server: the explicit opt-out to log in without it.
        url = (f"smtp://mailer:{SECRET}@127.0.0.1:{server.port}"
               "?starttls=0&allow_plain_auth=1&helo=client.test")
        record = await held_for_account_trouble(store, open_provider(url), caplog)
        assert "535" in record.cause and SECRET not in record.cause
        assert handler.received == [] and login.attempts >= 1
        login.accept = True
        await sent_once_fixed(store, open_provider(url))
    assert len(handler.received) == len(KEYS)


# -- HTTP: 401 -----------------------------------------------------------------------------
async def test_http_401_holds_every_delivery_until_the_token_works(
    store: Store, api: tuple[Api, str], caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake, url = api
    monkeypatch.setenv("POSTLANE_HTTP_TOKEN", TOKEN)
    await store.enqueue_many([msg(k, sender="app@example.org") for k in KEYS])
    record = await held_for_account_trouble(store, open_provider(url), caplog)
    assert record.cause.startswith("401") and "invalid API token" in record.cause
    assert fake.answers[401] >= 1 and not fake.accepted
    fake.token = TOKEN  # the operator rotated the key at the provider
    await sent_once_fixed(store, open_provider(url))
    assert set(fake.accepted) == set(KEYS) and max(fake.accepted.values()) == 1


# -- SES on moto: the sender identity is not verified ---------------------------------------
async def test_ses_unverified_sender_holds_every_delivery_until_it_is_verified(
    store: Store, moto: str, caplog: pytest.LogCaptureFixture,
) -> None:
    await store.enqueue_many([msg(k, sender="app@unverified.example") for k in KEYS])
    url = ses_url(moto)
    record = await held_for_account_trouble(store, open_provider(url), caplog)
    assert "MessageRejected" in record.cause and "not have authority" in record.cause
    assert "app@unverified.example" not in record.cause  # addresses are redacted
    backend = ses_backends[DEFAULT_ACCOUNT_ID][REGION]
    assert list(backend.sent_messages) == []
    boto3.session.Session(
        aws_access_key_id="testing", aws_secret_access_key=SECRET, region_name=REGION,
    ).client("sesv2", endpoint_url=moto).create_email_identity(
        EmailIdentity="unverified.example")
    await sent_once_fixed(store, open_provider(url))
    assert len(backend.sent_messages) == len(KEYS)


# -- a 4xx with Retry-After ----------------------------------------------------------------
async def test_a_4xx_with_retry_after_is_retried_then_not_dead_lettered(
    store: Store, api: tuple[Api, str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake, url = api
    fake.token = TOKEN
    monkeypatch.setenv("POSTLANE_HTTP_TOKEN", TOKEN)
    # More refusals than the lane's whole budget (6 attempts): none may spend one.
    fake.script = [(400, {"Retry-After": "0.05"})] * 8 + [(409, {"Retry-After": "0"})] * 2
    delivery_id = (await store.enqueue(msg("later:1", sender="app@example.org"))).id
    provider = open_provider(url)
    worker = Worker(store, provider, config=fast_config(drain=True))
    async with asyncio.timeout(30):
        await worker.run()
    delivery = await store.get(delivery_id)
    assert delivery is not None
    assert (delivery.state, delivery.attempts) == (State.SENT, 1)
    assert fake.answers[400] == 8 and fake.answers[409] == 2 and fake.accepted["later:1"] == 1
    assert worker.counters["outcome:throttled"] == 10
    kinds = await event_kinds(store, delivery_id)
    assert kinds.count("throttled") == 10 and "dead_lettered" not in kinds
    assert not (await store.stats()).dead_letters


# -- a drain against an account that stays broken gives up ----------------------------------
async def test_a_drain_gives_up_on_an_account_that_stays_broken(
    store: Store, api: tuple[Api, str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake, url = api
    monkeypatch.setenv("POSTLANE_HTTP_TOKEN", TOKEN)  # the API still expects the old token
    await store.enqueue_many([msg(k, sender="app@example.org") for k in KEYS])
    worker = Worker(store, open_provider(url), config=fast_config(breaker=HOLD, drain=True))
    result = await drain_within(worker, 1.0)
    assert not result.drained
    assert result.reason.startswith(f"gave up draining after 1 s: {len(KEYS)} deliveries "
                                    "still waiting; breaker http:127.0.0.1 open (account "
                                    "trouble: 401")
    for key in KEYS:  # stopped gracefully: nothing left leased, nothing spent
        delivery = await store.get(key)
        assert delivery is not None
        assert (delivery.state, delivery.attempts, delivery.lease_owner) == (
            State.PENDING, 0, None)

    fake.token = TOKEN
    worker = Worker(store, open_provider(url), config=fast_config(breaker=HOLD, drain=True))
    worker.breaker.clock = lambda: time.time() + HOLD.max_cooldown_s
    assert await drain_within(worker, 30.0) == DrainResult(True)
