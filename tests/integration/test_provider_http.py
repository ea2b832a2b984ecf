"""The HTTP adapters against a small fake ESP served by uvicorn on loopback.

The fake speaks three dialects -- the generic JSON API (``POST /send``), Postmark
(``POST /email``) and Resend (``POST /emails``) -- and honours ``Idempotency-Key`` where the
real service does. A script makes it answer 429 (Retry-After in seconds or as an HTTP date),
or accept a message and then sit on the answer past the client's timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import itertools
import socket
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from email.utils import format_datetime
from typing import Any

import pytest
import uvicorn
from conftest import msg
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from postlane.core.outcomes import OutcomeClass
from postlane.core.policy import RetryPolicy
from postlane.providers.http import HttpApiProvider
from postlane.providers.registry import open_provider
from postlane.providers.sandbox_server import bind
from postlane.store import Store
from postlane.worker import Worker, WorkerConfig
from tests.factories import delivery

TOKEN = "tok-Secret-123"




class FakeESP:
    """What reached the provider, and what it answers next."""

    def __init__(self) -> None:
        self.script: list[tuple[str, Any]] = []
        """Next answers, in order: ("429", retry_after) or ("hang", seconds)."""
        self.messages: dict[str, str] = {}  # idempotency key -> id (what was accepted)
        self.deliveries: Counter[str] = Counter()  # key -> times really sent
        self.requests: list[dict[str, Any]] = []
        self.client_ports: set[int] = set()
        self.ids = itertools.count(1)
        self.release = asyncio.Event()
        self.app = FastAPI()
        self.app.add_api_route("/send", self.generic, methods=["POST"])
        self.app.add_api_route("/email", self.postmark, methods=["POST"])
        self.app.add_api_route("/emails", self.resend, methods=["POST"])

    async def _take(self, request: Request, key: str | None, dedupe: bool
                    ) -> tuple[JSONResponse | None, str | None]:
        body = await request.json()
        self.requests.append({"headers": dict(request.headers), "body": body})
        if request.client is not None:
            self.client_ports.add(request.client.port)
        if dedupe and key and key in self.messages:
            return None, self.messages[key]
        if self.script:
            action, value = self.script.pop(0)
            if action == "429":
                return JSONResponse({"name": "rate_limit_exceeded", "ErrorCode": 429,
                                     "message": "slow down"}, 429,
                                    headers={"Retry-After": str(value)}), None
            if action == "hang":
                message_id = self._accept(key or f"anon-{len(self.requests)}")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.release.wait(), value)
                return None, message_id
        return None, self._accept(key or f"anon-{len(self.requests)}")

    def _accept(self, key: str) -> str:
        message_id = f"esp-{next(self.ids)}"
        self.messages[key] = message_id
        self.deliveries[key] += 1
        return message_id

    async def generic(self, request: Request) -> JSONResponse:
        error, message_id = await self._take(request, request.headers.get("idempotency-key"),
                                             dedupe=True)
        return error or JSONResponse({"id": message_id})

    async def postmark(self, request: Request) -> JSONResponse:
        if request.headers.get("x-postmark-server-token") != TOKEN:
            return JSONResponse({"ErrorCode": 10, "Message": "Bad or missing API token"}, 401)
        body = await request.json()
        if body["To"].startswith("inactive"):
            return JSONResponse({"ErrorCode": 406, "Message": "Inactive recipient"}, 422)
        error, message_id = await self._take(request, None, dedupe=False)
        return error or JSONResponse({"To": body["To"], "ErrorCode": 0, "Message": "OK",
                                      "MessageID": message_id})

    async def resend(self, request: Request) -> JSONResponse:
        if request.headers.get("authorization") != f"Bearer {TOKEN}":
            return JSONResponse({"statusCode": 403, "name": "invalid_api_key",
                                 "message": "API key is invalid"}, 403)
        error, message_id = await self._take(request, request.headers.get("idempotency-key"),
                                             dedupe=True)
        return error or JSONResponse({"id": message_id})


@pytest.fixture
async def esp() -> AsyncIterator[tuple[FakeESP, str]]:
    fake = FakeESP()
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
        fake.release.set()
        server.should_exit = True
        await task
        sock.close()


@asynccontextmanager
async def adapter(url: str) -> AsyncIterator[HttpApiProvider]:
    provider = open_provider(url)
    assert isinstance(provider, HttpApiProvider)
    await provider.open()
    try:
        yield provider
    finally:
        await provider.close()


# -- the generic JSON adapter ---------------------------------------------------------------
async def test_generic_json_send_and_keep_alive(esp: tuple[FakeESP, str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    fake, base = esp
    monkeypatch.setenv("POSTLANE_HTTP_TOKEN", TOKEN)
    async with adapter(f"{base}/send?pool=3") as http:
        outcomes = await asyncio.gather(*(http.send(delivery(f"k:{i}")) for i in range(30)))
    assert {o.kind for o in outcomes} == {OutcomeClass.ACCEPTED}
    assert len(fake.messages) == 30
    assert len(fake.client_ports) <= 3  # kept alive and reused
    first = fake.requests[0]
    assert first["headers"]["authorization"] == f"Bearer {TOKEN}"
    assert first["headers"]["idempotency-key"].startswith("k:")
    assert set(first["body"]) >= {"to", "from", "subject", "text", "html", "headers",
                                  "metadata"}


@pytest.mark.parametrize("form", ["seconds", "http-date"])
async def test_429_with_retry_after_in_both_forms(esp: tuple[FakeESP, str], form: str) -> None:
    fake, base = esp
    when = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=20)
    fake.script = [("429", "2" if form == "seconds" else format_datetime(when, usegmt=True))]
    async with adapter(f"{base}/send") as http:
        outcome = await http.send(delivery())
    assert outcome.kind is OutcomeClass.THROTTLED
    assert outcome.retry_after_s is not None
    if form == "seconds":
        assert outcome.retry_after_s == 2.0
    else:
        assert 15 <= outcome.retry_after_s <= 20
    assert fake.messages == {}


async def test_timeout_after_acceptance_is_ambiguous_and_the_retry_is_deduplicated(
    esp: tuple[FakeESP, str],
) -> None:
    fake, base = esp
    fake.script = [("hang", 5.0)]
    async with adapter(f"{base}/send?timeout=0.3") as http:
        first = await http.send(delivery())
        again = await http.send(delivery(attempts=1))
    assert first.kind is OutcomeClass.AMBIGUOUS
    assert again.kind is OutcomeClass.ACCEPTED
    assert again.provider_message_id == fake.messages["reset:42"]
    assert fake.deliveries["reset:42"] == 1


async def test_refused_connection_is_transient() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with adapter(f"http://127.0.0.1:{port}/send?connect_timeout=1") as http:
        outcome = await http.send(delivery())
    assert outcome.kind is OutcomeClass.TRANSIENT


# -- Postmark and Resend over the wire ------------------------------------------------------
async def test_postmark_over_the_wire(esp: tuple[FakeESP, str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    base = esp[1]
    monkeypatch.setenv("POSTLANE_POSTMARK_TOKEN", TOKEN)
    async with adapter(f"postmark://?base_url={base}&message_stream=outbound") as pm:
        accepted = await pm.send(delivery())
        inactive = await pm.send(delivery("k:2", recipient="inactive@example.com"))
    assert accepted.kind is OutcomeClass.ACCEPTED and accepted.provider_message_id == "esp-1"
    assert inactive.kind is OutcomeClass.PERMANENT and "406" in (inactive.response or "")
    async with adapter(f"postmark://:wrong@?base_url={base}") as pm:
        bad_token = await pm.send(delivery("k:3"))
    assert bad_token.kind is OutcomeClass.ACCOUNT
    assert "wrong" not in (bad_token.response or "")


async def test_resend_honours_the_idempotency_key(esp: tuple[FakeESP, str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    fake, base = esp
    monkeypatch.setenv("POSTLANE_RESEND_TOKEN", TOKEN)
    async with adapter(f"resend://?base_url={base}") as rs:
        first = await rs.send(delivery())
        again = await rs.send(delivery(attempts=1))
    assert first.kind is again.kind is OutcomeClass.ACCEPTED
    assert first.provider_message_id == again.provider_message_id
    assert fake.deliveries["reset:42"] == 1


# -- end to end: the Worker over Resend's dialect --------------------------------------------
async def test_worker_over_http_with_429s_and_timeouts_after_acceptance(
    store: Store, esp: tuple[FakeESP, str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake, base = esp
    monkeypatch.setenv("POSTLANE_RESEND_TOKEN", TOKEN)
    count = 200
    keys = [f"http:{i}" for i in range(count)]
    fake.script = ([("429", "0.2")] * 10 + [("hang", 5.0)] * 8) * 2
    await store.enqueue_many([msg(k, lane="bulk", sender="app@example.org",
                                  to=f"user{i}@example.com") for i, k in enumerate(keys)])
    provider = open_provider(f"resend://?base_url={base}&timeout=0.4&pool=10")
    worker = Worker(store, provider, config=WorkerConfig(
        concurrency=20, drain=True, controls_interval_s=0.05, poll_interval_s=0.1,
        retry=RetryPolicy(base_s=0.05, cap_s=1.0, throttle_default_s=0.1),
    ))
    async with asyncio.timeout(90):
        await worker.run()
    stats = await store.stats()
    assert stats.states.get("sent", 0) == count, stats.states
    assert set(fake.deliveries) == set(keys)
    assert max(fake.deliveries.values()) == 1
    assert worker.counters["outcome:ambiguous"] == 16
    assert worker.counters["outcome:throttled"] == 20
