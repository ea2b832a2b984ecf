"""The FastAPI application: ``/v1`` (JSON, API keys), ``/dashboard`` (HTML, a session from
an API key), ``/metrics`` (Prometheus) and ``/healthz``; one store per process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from postlane import __version__
from postlane.api import access_log, problems
from postlane.api.auth_first import AuthFirst
from postlane.api.models import Health
from postlane.api.routes import router
from postlane.api.routes_callbacks import router as callbacks_router
from postlane.api.routes_content import router as content_router
from postlane.api.routes_unsubscribe import router as unsubscribe_router
from postlane.api.sessions import Sessions
from postlane.api.state import AppState, app_state
from postlane.core.attachments import AttachmentLimits
from postlane.core.deliverability import SuppressionPolicy
from postlane.core.lanes import DEFAULT_LANES
from postlane.core.unsubscribe import secrets_from_env
from postlane.core.validation import Limits
from postlane.metrics import CONTENT_TYPE, FleetSampler, StoreCollector
from postlane.store import open_store
from postlane.store.migrations import ensure_migrated

log = logging.getLogger("postlane.api")

DEFAULT_MAX_BODY_BYTES = 1024 * 1024

DESCRIPTION = """\
Postlane's HTTP API: queue messages idempotently, find them and their timelines, triage
and replay dead letters, pause lanes, read the four numbers.

**Authentication.** `Authorization: Bearer pl_...` with a key from `postlane apikey create
--scopes ...`. Scopes: `send` (queue messages), `read` (every GET), `operate` (replay,
discard, pause, resume, manage templates). No key or an unknown one: 401; a key without
the scope: 403.

**Idempotency.** `POST /v1/messages` requires an `Idempotency-Key` header (400 without it):
the delivery's idempotency key. Repeating a request with the same key and body returns the
original answer; the same key with a different body is refused with 422.

**Errors** are problem details (RFC 9457, `application/problem+json`): `type`, `title`,
`status`, `detail`, plus `field` or `errors` for invalid input. Bodies over the size limit
(1 MiB by default; 16 MiB for `POST /v1/messages`, whose attachments travel as base64) are
refused with 413.
"""


DEFAULT_MAX_UPLOAD_BYTES = 512 * 1024 * 1024
UPLOAD_PREFIX = "/v1/imports/"
DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""``POST /v1/messages`` only: a message with attachments in base64 (10 MB of parts, the
default per-message limit, is 13.4 MB as base64). Every other body keeps the 1 MiB limit."""


def message_body_limit(attachments: AttachmentLimits, max_body_bytes: int) -> int:
    """The body limit of ``POST /v1/messages`` for these attachment limits: the parts in
    base64 (4 bytes for every 3) beside everything else a message body holds."""
    return max(DEFAULT_MAX_MESSAGE_BYTES,
               -(-attachments.max_total_bytes * 4 // 3) + max_body_bytes)
MESSAGES_PATH = "/v1/messages"
INBOUND_MAIL_PATH = "/v1/webhooks/smtp"
MAX_INBOUND_MAIL_BYTES = 10 * 1024 * 1024
"""A bounce may quote the whole message it returns (``webhooks.dsn.MAX_BYTES``)."""


class BodyTooLarge(HTTPException):
    """Raised while a body is read; an HTTPException so that FastAPI's body parsing lets it
    through (it turns other errors into a vague 400)."""

    def __init__(self, seen: int, limit: int) -> None:
        super().__init__(413, f"the request body is over {limit} bytes ({seen} bytes read so "
                              f"far); the limit is {limit} bytes")


class BodyLimit:
    """Refuse request bodies over ``max_bytes`` with 413, by Content-Length when declared and
    by counting otherwise (chunked uploads)."""

    def __init__(self, app: ASGIApp, max_bytes: int,
                 max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_upload_bytes = max_upload_bytes
        self.max_message_bytes = max(max_message_bytes, max_bytes)

    def limit_for(self, scope: Scope) -> int:
        """CSV uploads that start an import may be large, and so may a message carrying
        attachments or a bounce quoting the message it returns; everything else is small."""
        path = str(scope.get("path", ""))
        if scope.get("method") == "POST":
            if path.startswith(UPLOAD_PREFIX):
                return self.max_upload_bytes
            if path.rstrip("/") == MESSAGES_PATH:
                return self.max_message_bytes
            if path == INBOUND_MAIL_PATH:
                return max(self.max_bytes, MAX_INBOUND_MAIL_BYTES)
        return self.max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope)
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._refuse(scope, receive, send, int(declared), limit)
            return
        seen = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(seen, limit)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except BodyTooLarge:
            if started:  # pragma: no cover - every route reads its body before answering
                raise
            await self._refuse(scope, receive, send, seen, limit)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, size: int,
                      limit: int) -> None:
        response = problems.body_too_large(
            f"the request body is {size} bytes; the limit is {limit} bytes")
        await response(scope, receive, send)


SWAGGER_UI = "/docs/assets"


def interactive_docs(app: FastAPI) -> None:
    """``/docs``: Swagger UI from the files vendored in the package (``api/static/
    swagger-ui``), not a CDN: it works on a closed network and tells no third party who
    reads the docs. The spec validator badge (which calls out to swagger.io) is off."""
    assets = Path(str(resources.files("postlane.api").joinpath("static", "swagger-ui")))
    app.mount(SWAGGER_UI, StaticFiles(directory=assets), name="swagger-ui")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/openapi.json", title="Postlane API",
            swagger_js_url=f"{SWAGGER_UI}/swagger-ui-bundle.js",
            swagger_css_url=f"{SWAGGER_UI}/swagger-ui.css",
            swagger_favicon_url=f"{SWAGGER_UI}/favicon-32x32.png",
            swagger_ui_parameters={"validatorUrl": None})


def create_app(
    store_url: str,
    *,
    lanes: Sequence[str] | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_message_bytes: int | None = None,
    attachment_limits: AttachmentLimits | None = None,
    session_secret: str | bytes | None = None,
    sample_interval_s: float = 5.0,
    cookie_secure: bool = False,
    dashboard: bool = True,
    unsubscribe_secrets: Sequence[bytes] | None = None,
) -> FastAPI:
    """The Postlane HTTP app over the database at ``store_url``.

    ``lanes``: the configured lane names (default: interactive, bulk). ``session_secret``
    signs dashboard sessions (default: ``$POSTLANE_SESSION_SECRET`` or one per process).
    ``sample_interval_s``: how often the dashboard's in-memory charts sample the store.
    ``cookie_secure``: set when served over HTTPS. ``attachment_limits``: sizes per part
    and per message, checked at enqueue (default 10 MB each). ``max_message_bytes``: the body
    limit of ``POST /v1/messages`` alone, where attachments travel as base64 (default: room
    for the per-message limit, at least 16 MiB). ``unsubscribe_secrets`` verify one-click
    unsubscribe tokens (default: ``$POSTLANE_UNSUBSCRIBE_SECRET``).
    """
    attachment_limits = attachment_limits or AttachmentLimits()
    if max_message_bytes is None:
        max_message_bytes = message_body_limit(attachment_limits, max_body_bytes)
    lane_names = tuple(lanes) if lanes else tuple(lane.name for lane in DEFAULT_LANES)
    SuppressionPolicy.from_env()  # a bad POSTLANE_SOFT_BOUNCE_* fails the start, not a webhook
    state = AppState(store_url=store_url, lanes=lane_names,
                     sessions=Sessions(session_secret), max_body_bytes=max_body_bytes,
                     cookie_secure=cookie_secure,
                     unsubscribe_secrets=tuple(unsubscribe_secrets)
                     if unsubscribe_secrets is not None else secrets_from_env())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = open_store(store_url, limits=Limits(lanes=lane_names,
                                                    attachments=attachment_limits))
        await store.open()
        sampler_task: asyncio.Task[None] | None = None
        redactor = access_log.install()
        try:
            ensure_migrated(await store.pending_migrations())
            state.store = store
            state.sampler = FleetSampler(store, interval_s=max(sample_interval_s, 0.1))
            state.collector = StoreCollector(state.sampler)
            if sample_interval_s > 0:
                sampler_task = asyncio.create_task(state.sampler.run(), name="stats-sampler")
            yield
        finally:
            if sampler_task is not None:
                sampler_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampler_task
            state.store = None
            access_log.uninstall(redactor)
            await store.close()

    app = FastAPI(
        title="Postlane", version=__version__, description=DESCRIPTION, lifespan=lifespan,
        docs_url=None, redoc_url=None,  # /docs is served below, from the package's files
        openapi_tags=[
            {"name": "messages", "description": "Queue messages and follow them."},
            {"name": "dead letters", "description": "Triage, staged replay, discard."},
            {"name": "operating", "description": "Pauses and the four numbers."},
            {"name": "templates", "description": "Versioned templates."},
            {"name": "imports", "description": "Bulk import runs: counters and pauses."},
            {"name": "webhooks", "description": "Provider delivery events."},
            {"name": "unsubscribe", "description": "One-click unsubscribe of bulk mail."},
            {"name": "callbacks", "description": "Status callbacks to the application."},
            {"name": "service", "description": "Health and metrics."},
        ],
    )
    app.state.postlane = state
    problems.install(app)
    app.include_router(router)
    app.include_router(content_router)
    app.include_router(unsubscribe_router)
    app.include_router(callbacks_router)

    @app.get("/healthz", response_model=Health, tags=["service"], summary="Liveness")
    async def healthz() -> Health:
        return Health(status="ok")

    @app.get("/metrics", tags=["service"], summary="Prometheus metrics (no API key)",
             response_class=Response,
             responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                              "description": "The exposition format, version 0.0.4."},
                        **problems.problem_responses(503)})
    async def metrics(request: Request) -> Response:
        """Gauges read from the store at scrape time (a reading younger than a second is
        reused): depth and oldest age per lane, attempts, states, open dead letters, pauses,
        breakers. Aggregates only; nothing about a single message."""
        current = app_state(request)
        current.require_store()
        assert current.collector is not None
        return Response(await current.collector.render(), media_type=CONTENT_TYPE)

    interactive_docs(app)

    if dashboard:
        from postlane.dashboard import mount

        mount(app)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version,
                                 description=app.description, routes=app.routes,
                                 tags=app.openapi_tags)
            app.openapi_schema = problems.complete_error_responses(schema)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes,
                       max_message_bytes=max_message_bytes)
    app.add_middleware(AuthFirst, state=state,  # outermost: it runs first
                       routes=[*router.routes, *content_router.routes,
                               *callbacks_router.routes])
    return app
