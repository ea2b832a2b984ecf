"""The API's doors on a real server on loopback (uvicorn): no body is read before the key
is checked, and the access log names no recipient."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest
import uvicorn
from conftest import store_url
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from postlane.api import create_app
from postlane.api.keys import create_key
from postlane.providers.sandbox_server import bind
from postlane.store import Store

UPLOAD_BYTES = 200 * 1024 * 1024
"""What the client says it will send; it sends only the first chunk unless it is read."""
CHUNK = 64 * 1024


@dataclass
class BodyMeter:
    """Counts the body bytes the app pulled from the server (around the whole app)."""

    app: ASGIApp
    read: dict[str, int] = field(default_factory=dict)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        self.read.setdefault(path, 0)

        async def counting() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                self.read[path] += len(message.get("body", b""))
            return message

        await self.app(scope, counting, send)


@asynccontextmanager
async def serving(store: Store, **config: object) -> AsyncIterator[tuple[int, BodyMeter]]:
    """The Postlane app on uvicorn in this event loop, on a free loopback port."""
    meter = BodyMeter(create_app(store_url(store), sample_interval_s=0, dashboard=False,
                                 max_body_bytes=1024 * 1024))
    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(meter, lifespan="on", timeout_graceful_shutdown=0,
                                           **config))  # type: ignore[arg-type]
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield sock.getsockname()[1], meter
    finally:
        server.should_exit = True
        await task
        sock.close()


async def start_upload(port: int, token: str | None) -> tuple[bytes, int]:
    """Announce a 200 MB multipart upload, send its first 64 KiB, and read the answer.
    Returns the status line and how many body bytes had been sent when it came."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    writer.write((
        "POST /v1/imports/big?template=welcome HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth
        + "Content-Type: multipart/form-data; boundary=XyZ\r\n"
        f"Content-Length: {UPLOAD_BYTES}\r\n\r\n").encode())
    first = (b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="u.csv"\r\n'
             b"Content-Type: text/csv\r\n\r\nuser_id,email\r\n")
    chunk = first + b"x" * (CHUNK - len(first))
    writer.write(chunk)
    await writer.drain()
    try:
        async with asyncio.timeout(30):
            status = await reader.readline()
    finally:
        writer.close()
    return status, len(chunk)


@pytest.mark.parametrize(("scopes", "status"), [(None, 401), ("pl_unknown", 401),
                                                 ("read", 403)])
async def test_an_upload_is_refused_before_a_byte_of_it_is_read(
    store: Store, scopes: str | None, status: int
) -> None:
    token = scopes
    if scopes == "read":
        token = (await create_key(store, "read", name="reader"))[1]
    async with serving(store) as (port, meter):
        line, sent = await start_upload(port, token)
    assert line.startswith(f"HTTP/1.1 {status} ".encode()), line
    assert sent < UPLOAD_BYTES  # the answer came while the client was still sending
    assert meter.read["/v1/imports/big"] == 0  # and the app never pulled the body


async def test_an_authorised_upload_is_read(store: Store) -> None:
    """The meter counts: with a key that may upload, the body is read."""
    token = (await create_key(store, "operate", name="ops"))[1]
    async with serving(store) as (port, meter):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        part = (b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="u.csv"'
                b"\r\nContent-Type: text/csv\r\n\r\nuser_id,email\r\n1,a@example.com\r\n"
                b"--XyZ--\r\n")
        writer.write((
            "POST /v1/imports/small?template=nope HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {token}\r\nConnection: close\r\n"
            "Content-Type: multipart/form-data; boundary=XyZ\r\n"
            f"Content-Length: {len(part)}\r\n\r\n").encode() + part)
        await writer.drain()
        async with asyncio.timeout(30):
            line = await reader.readline()
        writer.close()
    assert line.startswith(b"HTTP/1.1 404 "), line  # no template "nope": read, then refused
    assert meter.read["/v1/imports/small"] == len(part)


async def test_the_access_log_redacts_recipient_addresses(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    import httpx

    token = (await create_key(store, "read", name="reader"))[1]
    caplog.set_level(logging.INFO, logger="uvicorn.access")
    # log_config=None: uvicorn's access logger propagates to the capture.
    async with serving(store, log_config=None, access_log=True) as (port, _), \
            httpx.AsyncClient() as client:
        found = await client.get(
            f"http://127.0.0.1:{port}/v1/messages",
            params={"recipient": "ada.lovelace@example.com"},
            headers={"Authorization": f"Bearer {token}"})
        await client.get(f"http://127.0.0.1:{port}/v1/messages?recipient=bob@example.org",
                         headers={"Authorization": f"Bearer {token}"})
    assert found.status_code == 200
    lines = [r.getMessage() for r in caplog.records if r.name == "uvicorn.access"]
    assert len(lines) == 2, lines
    assert "recipient=a***@example.com" in lines[0] and "recipient=b***@example.org" in lines[1]
    assert not any("lovelace" in line or "bob" in line for line in lines), lines


def test_every_v1_route_but_the_webhooks_is_checked_before_its_body() -> None:
    from postlane.api.auth_first import required_scope
    from postlane.api.routes import router
    from postlane.api.routes_content import router as content_router

    unchecked = sorted(route.path for route in [*router.routes, *content_router.routes]
                       if required_scope(getattr(route, "dependant", None)) is None)
    assert unchecked == ["/v1/webhooks/{provider}"]  # verified by the provider's signature
