"""The SES adapter against ``moto`` running as a server on loopback.

moto accepts a verified sender and rejects an unverified one, but it never throttles, never
pauses an account and never sits on a request; a small stub in front of it does those
(answering as SES would: the error code in ``x-amzn-ErrorType``) and passes the rest on.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from email import message_from_string
from typing import Any

import boto3
import botocore.exceptions
import httpx
import pytest
import uvicorn
from conftest import msg
from fastapi import FastAPI, Request, Response
from moto.core import DEFAULT_ACCOUNT_ID
from moto.server import ThreadedMotoServer
from moto.ses.models import ses_backends

from postlane.core.outcomes import OutcomeClass
from postlane.core.policy import RetryPolicy
from postlane.core.states import State
from postlane.limiter import MemoryLimiter
from postlane.limiter.auto import AccountLimits, QuotaShape, apply_limits
from postlane.providers.registry import open_provider
from postlane.providers.sandbox_server import bind
from postlane.providers.ses import SESProvider
from postlane.store import Store
from postlane.worker import Worker, WorkerConfig
from tests.factories import delivery

REGION = "eu-west-1"
SECRET = "moto-Secret-Key"




@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def moto(moto_url: str) -> str:
    """A fresh moto with the domain example.org verified."""
    httpx.post(f"{moto_url}/moto-api/reset")
    client = boto3.session.Session(aws_access_key_id="testing",
                                   aws_secret_access_key=SECRET,
                                   region_name=REGION).client("sesv2", endpoint_url=moto_url)
    client.create_email_identity(EmailIdentity="example.org")
    return moto_url


def sent_messages() -> list[Any]:
    return list(ses_backends[DEFAULT_ACCOUNT_ID][REGION].sent_messages)


def keys_sent() -> Counter[str]:
    keys: Counter[str] = Counter()
    for sent in sent_messages():
        keys[message_from_string(sent.raw_data)["X-Postlane-Key"]] += 1
    return keys


@asynccontextmanager
async def ses(url: str) -> AsyncIterator[SESProvider]:
    provider = open_provider(url)
    assert isinstance(provider, SESProvider)
    await provider.open()
    try:
        yield provider
    finally:
        await provider.close()


def ses_url(endpoint: str, **options: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in {"endpoint_url": endpoint, **options}.items())
    return f"ses://testing:{SECRET}@{REGION}?{query}"


# -- against moto ---------------------------------------------------------------------------
async def test_accepted_by_moto_with_the_key_header(moto: str) -> None:
    async with ses(ses_url(moto, configuration_set="events")) as provider:
        outcome = await provider.send(delivery())
    assert outcome.kind is OutcomeClass.ACCEPTED and outcome.provider_message_id
    (sent,) = sent_messages()
    parsed = message_from_string(sent.raw_data)
    assert parsed["X-Postlane-Key"] == "reset:42"
    assert parsed["Message-ID"].endswith("@example.org>")


async def test_unverified_sender_is_account_trouble(moto: str) -> None:
    async with ses(ses_url(moto)) as provider:
        outcome = await provider.send(delivery(sender="app@unverified.example"))
    assert outcome.kind is OutcomeClass.ACCOUNT
    assert "MessageRejected" in (outcome.response or "")
    assert SECRET not in (outcome.response or "")
    assert sent_messages() == []


async def test_refused_endpoint_is_transient() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with ses(ses_url(f"http://127.0.0.1:{port}", connect_timeout="1")) as provider:
        outcome = await provider.send(delivery())
    assert outcome.kind is OutcomeClass.TRANSIENT


# -- a stub in front of moto: throttling, pauses, silence -----------------------------------
class Stub:
    """Answers SES's SendEmail with scripted errors first, then passes requests to moto."""

    def __init__(self, moto: str) -> None:
        self.moto = moto
        self.script: list[tuple[int, str]] = []
        self.account: dict[str, Any] | None = None
        """GetAccount's answer (moto does not implement it), None: pass it to moto."""
        self.hang = False
        self.answers: Counter[str] = Counter()
        self.release = asyncio.Event()
        self.client = httpx.AsyncClient()
        self.app = FastAPI()
        self.app.add_api_route("/{path:path}", self.handle, methods=["GET", "POST"])

    async def handle(self, request: Request, path: str) -> Response:
        body = await request.body()
        if self.hang:
            self.answers["hang"] += 1
            await self.release.wait()
        if path == "v2/email/account" and self.account is not None:
            self.answers["GetAccount"] += 1
            return Response(json.dumps(self.account), 200, media_type="application/json")
        if self.script:
            status, code = self.script.pop(0)
            self.answers[code] += 1
            return Response(f'{{"message": "{code} (stub)"}}', status,
                            headers={"x-amzn-ErrorType": code},
                            media_type="application/json")
        self.answers["moto"] += 1
        headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        answer = await self.client.request(request.method, f"{self.moto}/{path}",
                                           content=body, headers=headers)
        return Response(answer.content, answer.status_code,
                        media_type=answer.headers.get("content-type"))


@pytest.fixture
async def stub(moto: str) -> AsyncIterator[tuple[Stub, str]]:
    stub = Stub(moto)
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(stub.app, log_level="warning", lifespan="off",
                                           timeout_graceful_shutdown=1))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield stub, f"http://127.0.0.1:{port}"
    finally:
        stub.release.set()
        server.should_exit = True
        await task
        await stub.client.aclose()
        sock.close()


async def test_read_timeout_after_the_request_left_is_ambiguous(stub: tuple[Stub, str]) -> None:
    fake, url = stub
    fake.hang = True
    async with ses(ses_url(url, timeout="0.3")) as provider:
        outcome = await provider.send(delivery())
    assert fake.answers["hang"] == 1  # exactly one request: botocore did not retry it
    assert outcome.kind is OutcomeClass.AMBIGUOUS


@pytest.mark.parametrize(("status", "code", "kind", "retry_after"), [
    (429, "TooManyRequestsException", OutcomeClass.THROTTLED, None),
    (400, "SendingPausedException", OutcomeClass.THROTTLED, 60.0),
    (400, "MailFromDomainNotVerifiedException", OutcomeClass.ACCOUNT, None),
    (500, "InternalServiceErrorException", OutcomeClass.TRANSIENT, None),
])
async def test_stubbed_errors_over_the_wire(stub: tuple[Stub, str], status: int, code: str,
                                            kind: OutcomeClass,
                                            retry_after: float | None) -> None:
    fake, url = stub
    fake.script = [(status, code)]
    async with ses(ses_url(url)) as provider:
        outcome = await provider.send(delivery())
    assert (outcome.kind, outcome.retry_after_s) == (kind, retry_after)
    assert fake.answers[code] == 1 and fake.answers["moto"] == 0  # no botocore retry


# -- end to end through the Worker ----------------------------------------------------------
async def test_worker_sends_through_ses_exactly_once_despite_throttling_and_a_pause(
    store: Store, stub: tuple[Stub, str],
) -> None:
    fake, url = stub
    count = 120
    fake.script = ([(429, "TooManyRequestsException")] * 15
                   + [(400, "SendingPausedException")] * 10)
    keys = [f"ses:{i}" for i in range(count)]
    await store.enqueue_many([msg(k, lane="bulk", sender="app@example.org",
                                  to=f"user{i}@example.com") for i, k in enumerate(keys)])
    provider = open_provider(ses_url(url, configuration_set="events", pool="8",
                                     account_retry_after="0.2"))
    worker = Worker(store, provider, config=WorkerConfig(
        concurrency=16, drain=True, controls_interval_s=0.05, poll_interval_s=0.1,
        retry=RetryPolicy(base_s=0.05, cap_s=1.0, throttle_default_s=0.1),
    ))
    async with asyncio.timeout(90):
        await worker.run()
    assert fake.answers["TooManyRequestsException"] == 15
    assert fake.answers["SendingPausedException"] == 10
    seen = keys_sent()
    assert set(seen) == set(keys) and max(seen.values()) == 1
    for key in keys[:20]:
        sent = await store.get(key)
        assert sent is not None and sent.state is State.SENT
        assert sent.attempts == 1  # throttles and pauses spent no attempt
        assert sent.provider_message_id



# -- --rate auto: GetAccount's SendQuota ---------------------------------------------------------
def get_account(rate: float, daily: float, sent: float) -> dict[str, Any]:
    """GetAccount's answer as the SESv2 API reference documents it (the parts we read)."""
    return {"SendQuota": {"Max24HourSend": daily, "MaxSendRate": rate,
                          "SentLast24Hours": sent},
            "SendingEnabled": True, "ProductionAccessEnabled": True,
            "EnforcementStatus": "HEALTHY", "DedicatedIpAutoWarmupEnabled": False}


async def test_account_limits_come_from_get_account(stub: tuple[Stub, str]) -> None:
    fake, url = stub
    fake.account = get_account(14.0, 50000.0, 1234.0)
    async with ses(ses_url(url)) as provider:
        limits = await provider.account_limits()
        assert limits == AccountLimits(max_send_rate=14.0, max_24h_send=50_000,
                                       sent_last_24h=1234)
        limiter = MemoryLimiter(rate=1.0)
        await apply_limits(limiter, limits, headroom=0.02, shape=QuotaShape())
        assert limiter.rate == pytest.approx(14 * 0.98)
        assert limiter.quota is not None and limiter.quota.quota == 50_000
        # SES raised the account: the next refresh follows it.
        fake.account = get_account(50.0, 200000.0, 0.0)
        await apply_limits(limiter, await provider.account_limits(), headroom=0.02,
                           shape=QuotaShape())
    assert limiter.rate == pytest.approx(50 * 0.98)
    assert limiter.quota is not None and limiter.quota.quota == 200_000
    assert fake.answers["GetAccount"] == 2 and fake.answers["moto"] == 0


async def test_an_unlimited_daily_quota_is_no_quota(stub: tuple[Stub, str]) -> None:
    fake, url = stub
    fake.account = get_account(200.0, -1.0, 5.0)  # -1: no 24-hour limit
    async with ses(ses_url(url)) as provider:
        limits = await provider.account_limits()
    assert (limits.max_send_rate, limits.max_24h_send) == (200.0, None)


async def test_moto_has_no_get_account_so_auto_refuses_to_start(moto: str,
                                                                tmp_path: Any) -> None:
    """moto (5.x) answers GetAccount 404: the adapter raises, and ``worker --rate auto``
    stops at start with a clear error instead of sending without a ceiling."""
    async with ses(ses_url(moto)) as provider:
        with pytest.raises(botocore.exceptions.ClientError):
            await provider.account_limits()
    from typer.testing import CliRunner

    from postlane.cli.main import app

    result = await asyncio.to_thread(CliRunner().invoke, app, [
        "--db", f"sqlite:///{tmp_path}/none.db", "worker", "--provider", ses_url(moto),
        "--rate", "auto", "--drain"])
    assert result.exit_code == 1, result.output
    assert "--rate auto: could not read the account's limits from ses" in result.output
    assert SECRET not in result.output
