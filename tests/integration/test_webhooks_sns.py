"""SES events through Amazon SNS: notifications signed with a key of our own, and its
certificate served by a local plain-HTTP stand-in for ``sns.<region>.amazonaws.com``
(reached through ``SnsCertificates(base_url=...)``, a test-only constructor argument, after
the message's URL passed the same strict check as in production)."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import uvicorn
from conftest import store_url
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from postlane.api import create_app
from postlane.providers.sandbox import SandboxConfig, SandboxProvider
from postlane.providers.sandbox_server import bind
from postlane.store.base import Store
from postlane.webhooks import (
    CertificateUnavailable,
    SnsCertificates,
    WebhookConfig,
    WebhookRejected,
    receive,
)
from postlane.webhooks.signatures import check_cert_url, sns_string_to_sign
from tests.integration.test_webhooks import sent_delivery

TOPIC = "arn:aws:sns:eu-west-1:123456789012:ses-events"
CERT_URL = "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-test.pem"
SENT_AT = dt.datetime(2026, 11, 30, 7, 0, tzinfo=dt.UTC)


def _cert() -> tuple[rsa.RSAPrivateKey, bytes]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sns.amazonaws.com")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(1)
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=1)).sign(key, hashes.SHA256()))
    return key, cert.public_bytes(serialization.Encoding.PEM)


KEY, PEM = _cert()


def sns_body(event: dict[str, Any], *, message_id: str = "sns-1", version: str = "2",
             cert_url: str = CERT_URL, topic: str = TOPIC,
             sent_at: dt.datetime = SENT_AT) -> bytes:
    message = {"Type": "Notification", "MessageId": message_id, "TopicArn": topic,
               "Message": json.dumps(event),
               "Timestamp": sent_at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
               "SignatureVersion": version, "SigningCertURL": cert_url}
    algorithm = hashes.SHA256() if version == "2" else hashes.SHA1()
    signature = KEY.sign(sns_string_to_sign(message), padding.PKCS1v15(), algorithm)
    message["Signature"] = base64.b64encode(signature).decode()
    return json.dumps(message).encode()


def bounce(provider_message_id: str = "pm-1", to: str = "dan@example.com") -> dict[str, Any]:
    return {"eventType": "Bounce", "mail": {"messageId": provider_message_id,
                                            "destination": [to]},
            "bounce": {"bounceType": "Permanent", "bouncedRecipients": [{"emailAddress": to}]}}


@dataclass
class StandIn:
    """The certificate host, on plain HTTP on loopback; ``mode`` says how it answers."""

    base: str = ""
    mode: str = "ok"
    paths: list[str] = field(default_factory=list)
    asked: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def certificate(self, request: Request) -> Response:
        self.paths.append(request.url.path)
        self.asked.set()
        if self.mode == "hold":
            await self.release.wait()
        if self.mode == "error":
            return Response("unavailable", status_code=500)
        if self.mode == "missing":
            return Response("no such key", status_code=404)
        if self.mode == "garbage":
            return Response("<html>not a certificate</html>")
        return Response(PEM, media_type="application/x-pem-file")


@asynccontextmanager
async def stand_in() -> AsyncIterator[StandIn]:
    host = StandIn()
    app = Starlette(routes=[Route("/{name:path}", host.certificate)])
    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off",
                                           timeout_graceful_shutdown=0))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    host.base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        yield host
    finally:
        host.release.set()
        server.should_exit = True
        await task
        sock.close()


@pytest.fixture
async def sent(store: Store) -> str:
    """The provider message id of a delivery to dan@example.com, sent (through the sandbox)."""
    provider = SandboxProvider(SandboxConfig(seed=5))
    delivery = await sent_delivery(store, provider, "receipt:ses", "dan@example.com")
    return str(delivery.provider_message_id)


def config(host: StandIn, *, topics: tuple[str, ...] = (TOPIC,), timeout_s: float = 5.0,
           now: dt.datetime = SENT_AT + dt.timedelta(seconds=30)) -> WebhookConfig:
    return WebhookConfig(certificates=SnsCertificates(base_url=host.base, timeout_s=timeout_s),
                         sns_topics=topics, clock=now.timestamp)


async def test_a_signed_bounce_from_an_allowed_topic_suppresses_once(store: Store,
                                                                     sent: str) -> None:
    async with stand_in() as host:
        settings = config(host)
        for version in ("1", "2"):
            result = await receive(store, "ses", {}, sns_body(
                bounce(sent), message_id=f"m{version}", version=version), settings)
            assert result.status == 200 and result.events[0]["kind"] == "bounced"
    assert [s.address for s in await store.list_suppressions()] == ["dan@example.com"]
    # Fetched once, from the certificate's own path; the second message used the cache.
    assert host.paths == ["/SimpleNotificationService-test.pem"]


@pytest.mark.parametrize(("why", "body", "topics", "now"), [
    ("tampered", sns_body(bounce()).replace(b"Permanent", b"Transient"), (TOPIC,), None),
    ("no topic allowed", sns_body(bounce()), (), None),
    ("another topic", sns_body(bounce(), topic="arn:aws:sns:eu-west-1:999999999999:evil"),
     (TOPIC,), None),
    ("stale", sns_body(bounce()), (TOPIC,), SENT_AT + dt.timedelta(hours=1, seconds=1)),
    ("future", sns_body(bounce()), (TOPIC,), SENT_AT - dt.timedelta(minutes=10)),
    ("http", sns_body(bounce(), cert_url=CERT_URL.replace("https", "http")), (TOPIC,), None),
    ("suffix", sns_body(bounce(), cert_url="https://sns.eu-west-1.amazonaws.com.evil.example"
                                           "/c.pem"), (TOPIC,), None),
    ("subdomain", sns_body(bounce(), cert_url="https://x.sns.eu-west-1.amazonaws.com/c.pem"),
     (TOPIC,), None),
    ("other host", sns_body(bounce(), cert_url="https://evil.example.com/c.pem"), (TOPIC,),
     None),
    ("port", sns_body(bounce(), cert_url="https://sns.eu-west-1.amazonaws.com:8443/c.pem"),
     (TOPIC,), None),
    ("userinfo", sns_body(bounce(), cert_url="https://me@sns.eu-west-1.amazonaws.com/c.pem"),
     (TOPIC,), None),
    ("not a pem", sns_body(bounce(), cert_url="https://sns.eu-west-1.amazonaws.com/c.txt"),
     (TOPIC,), None),
    ("other region", sns_body(bounce(), cert_url=CERT_URL.replace("eu-west-1", "us-east-1")),
     (TOPIC,), None),
])
async def test_refused_notifications_fetch_nothing(
    store: Store, why: str, body: bytes, topics: tuple[str, ...], now: dt.datetime | None
) -> None:
    async with stand_in() as host:
        settings = config(host, topics=topics, **({"now": now} if now else {}))
        with pytest.raises(WebhookRejected):
            await receive(store, "ses", {}, body, settings)
    # Only a tampered message from an allowed topic gets as far as the certificate.
    assert host.paths == (["/SimpleNotificationService-test.pem"] if why == "tampered" else [])
    assert await store.list_suppressions() == []


def test_the_certificate_host_is_exactly_amazons() -> None:
    assert check_cert_url(CERT_URL) == "eu-west-1"
    assert check_cert_url("https://sns.us-gov-west-1.amazonaws.com/a.pem") == "us-gov-west-1"
    for url in ("https://sns.amazonaws.com/a.pem", "https://sns.eu-west-1.amazonaws.com.cn/a.pem",
                "https://sns.eu-west-1.amazonaws.com/a.pem?x=1", "ftp://sns.eu-west-1.amazonaws.com/a.pem"):
        with pytest.raises(WebhookRejected):
            check_cert_url(url)


@pytest.mark.parametrize(("mode", "error"), [
    ("error", CertificateUnavailable), ("hold", CertificateUnavailable),
    ("missing", WebhookRejected), ("garbage", WebhookRejected),
])
async def test_a_certificate_that_cannot_be_had_is_refused_or_unavailable(
    store: Store, mode: str, error: type[Exception]
) -> None:
    async with stand_in() as host:
        host.mode = mode
        with pytest.raises(error):
            await receive(store, "ses", {}, sns_body(bounce()), config(host, timeout_s=0.5))
    assert await store.list_suppressions() == []


async def test_an_unreachable_certificate_host_is_unavailable(store: Store) -> None:
    async with stand_in() as host:
        settings = config(host)
    # The stand-in is gone: connection refused.
    with pytest.raises(CertificateUnavailable):
        await receive(store, "ses", {}, sns_body(bounce()), settings)


async def test_the_fetch_does_not_block_the_event_loop(store: Store) -> None:
    """The stand-in runs on this same event loop: a blocking fetch could never be answered.
    While the fetch waits, the loop runs this test on; then the notification is recorded."""
    async with stand_in() as host:
        host.mode = "hold"
        settings = config(host)
        pending = asyncio.create_task(receive(store, "ses", {}, sns_body(bounce()), settings))
        await asyncio.wait_for(host.asked.wait(), 30)
        assert not pending.done()
        host.mode = "ok"
        host.release.set()
        result = await asyncio.wait_for(pending, 30)
    assert result.status == 200


async def test_the_api_answers_401_and_503_never_500(
    store: Store, sent: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POSTLANE_WEBHOOK_SES_TOPICS", f"arn:aws:sns:us-east-1:1:x, {TOPIC}")
    now = dt.datetime.now(dt.UTC)
    app = create_app(store_url(store), sample_interval_s=0, dashboard=False)
    async with stand_in() as host, app.router.lifespan_context(app):
        app.state.postlane.sns_certificates = SnsCertificates(base_url=host.base)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://api") as client:
            async def post(body: bytes) -> httpx.Response:
                return await client.post("/v1/webhooks/ses", content=body,
                                         headers={"Content-Type": "text/plain"})

            host.mode = "error"
            unavailable = await post(sns_body(bounce(), sent_at=now))
            assert unavailable.status_code == 503, unavailable.text
            assert unavailable.json()["type"].endswith("certificate-unavailable")
            assert unavailable.headers["Retry-After"] == "60"
            stale = await post(sns_body(bounce(), sent_at=now - dt.timedelta(hours=2)))
            assert stale.status_code == 401 and "old" in stale.json()["detail"]
            host.mode = "ok"
            accepted = await post(sns_body(bounce(sent), message_id="m-api", sent_at=now))
            assert accepted.status_code == 200, accepted.text
    assert [s.address for s in await store.list_suppressions()] == ["dan@example.com"]
