"""The sandbox over HTTP: ``SandboxEngine`` served by FastAPI and uvicorn (``postlane sandbox``).

    POST /v1/messages          JSON {to, from, subject, text, html, headers, metadata,
                               template_id} with an Idempotency-Key header.
                               200 {id} | 429 + Retry-After | 503 | 400 | 404.
                               Accept-then-timeout: the message is recorded as accepted,
                               then the answer waits ``timeout_delay_s`` before it is sent.
    GET  /v1/messages/{key}    200 {id, key} if the key was accepted, else 404.
    GET  /sandbox/stats        the engine's counters, ``accepted_keys`` and ``by_second``.

With a webhook URL it also posts delivery events (delivered, bounced, complained), signed
with Standard Webhooks, to ``POST /v1/webhooks/sandbox`` of ``postlane serve``.

Retry-After is sent in seconds with up to three decimals (the rate limit's window ends
within the second); ``postlane.core.policy.parse_retry_after`` reads both that and dates.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import signal
import socket
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from postlane.extras import requires
from postlane.providers.sandbox import SandboxConfig, SandboxEngine
from postlane.providers.sandbox_events import SandboxEvents, http_sender

with requires("server", "the HTTP sandbox (postlane sandbox)"):
    import uvicorn
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

log = logging.getLogger("postlane.sandbox")


def received_parts(value: Any) -> list[dict[str, Any]]:
    """The generic adapter's ``attachments`` as the engine records them (sizes decoded)."""
    if value is None:
        return []
    return [{"filename": str(a["filename"]), "content_type": str(a["content_type"]),
             "kind": str(a.get("kind") or "attachment"),
             "size": len(base64.b64decode(a["content"], validate=True))} for a in value]


def create_app(engine: SandboxEngine) -> FastAPI:
    """The HTTP face of ``engine``; its config's ``timeout_delay_s`` and ``latency_s`` apply."""
    app = FastAPI(title="Postlane sandbox", docs_url=None, redoc_url=None)

    @app.post("/v1/messages")
    async def post_message(request: Request) -> JSONResponse:
        key = request.headers.get("idempotency-key", "").strip()
        if not key:
            return JSONResponse({"error": "the Idempotency-Key header is required"}, 400)
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError):
            return JSONResponse({"error": "the body is not JSON"}, 400)
        if not isinstance(body, dict) or not isinstance(body.get("to"), str):
            return JSONResponse({"error": "the body needs a 'to' address"}, 400)
        template = body.get("template_id")
        config = engine.config
        if config.latency_s:
            await asyncio.sleep(config.latency_s)
        try:
            parts = received_parts(body.get("attachments"))
        except (TypeError, ValueError, KeyError, binascii.Error):
            return JSONResponse({"error": "attachments: a list of {filename, content_type, "
                                          "content (base64)}"}, 400)
        answer = engine.submit(key, body["to"], template if isinstance(template, str) else None,
                               parts)
        headers = {}
        if answer.retry_after_s is not None:
            headers["Retry-After"] = format_retry_after(answer.retry_after_s)
        if answer.hang:
            await asyncio.sleep(config.timeout_delay_s)
        return JSONResponse(answer.body, answer.status, headers=headers)

    @app.get("/v1/messages/{key:path}")
    async def get_message(key: str) -> JSONResponse:
        found = engine.lookup(key)
        if found is None:
            return JSONResponse({"error": "unknown key"}, 404)
        parts = engine.attachments.get(key)
        return JSONResponse({"id": found, "key": key, **({"attachments": parts} if parts else {})})

    @app.get("/sandbox/stats")
    async def stats() -> dict[str, Any]:
        return engine.stats.as_json(engine.accepted_keys())

    return app


def format_retry_after(seconds: float) -> str:
    if seconds == int(seconds):
        return str(int(seconds))
    return f"{seconds:.3f}"


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (``port=0``: any free port), so the address is known up front."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(1024)
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def listen_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def serve(config: SandboxConfig, sock: socket.socket, *,
                on_ready: Callable[[str], None] | None = None,
                events: SandboxEvents | None = None,
                webhook_url: str | None = None) -> SandboxEngine:
    """Serve until SIGINT/SIGTERM; returns the engine (its stats) when stopped. With
    ``events`` and ``webhook_url``, delivery events are posted there, signed, every half
    second (as a real provider posts them a little after accepting)."""
    engine = SandboxEngine(config)
    poster: asyncio.Task[None] | None = None
    if events is not None and webhook_url:
        events.attach(engine)
        poster = asyncio.create_task(_post_events(events, webhook_url))
    server = uvicorn.Server(uvicorn.Config(
        create_app(engine), log_level="warning", access_log=False, lifespan="off",
        timeout_graceful_shutdown=1, timeout_keep_alive=30,
    ))
    if on_ready is not None:
        on_ready(listen_url(sock))
    # uvicorn shuts down gracefully on SIGINT/SIGTERM and then re-raises the signal to the
    # handler that was there before it; a quiet one here lets the caller report and exit 0.
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, _stopped) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        await server.serve(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if poster is not None:
            poster.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poster
    return engine


async def _post_events(events: SandboxEvents, url: str) -> None:
    send = http_sender(url)
    while True:
        await asyncio.sleep(0.5)
        try:
            await events.flush(send)
        except Exception as exc:  # the receiver is down: a real provider retries later too
            log.warning("sandbox: posting delivery events to %s failed: %s", url, exc)


def _stopped(signum: int, frame: FrameType | None) -> None:
    """The signal was handled by uvicorn's graceful shutdown already."""
