"""``postlane serve``: the HTTP API, the dashboard and ``/metrics`` (uvicorn)."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Annotated

import typer

from postlane import tracing
from postlane.cli.durations import duration_option
from postlane.core.attachments import (
    DEFAULT_MAX_ATTACHMENT_BYTES,
    DEFAULT_MAX_ATTACHMENTS_BYTES,
    AttachmentLimits,
)
from postlane.core.lanes import parse_lane_shares
from postlane.errors import ConfigurationError, MissingExtra
from postlane.extras import requires
from postlane.logs import configure_logging, log_effective_configuration


def serve(
    ctx: typer.Context,
    host: Annotated[str, typer.Option(envvar="POSTLANE_HOST", show_envvar=True,
                                      help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(envvar="POSTLANE_PORT", show_envvar=True,
                                      help="Port to listen on.")] = 8080,
    lanes: Annotated[str | None, typer.Option(
        envvar="POSTLANE_LANES", show_envvar=True,
        help="Configured lane shares, as for the worker (default: interactive=70,bulk=30); "
             "only the names matter here.")] = None,
    max_body: Annotated[int, typer.Option(
        envvar="POSTLANE_MAX_BODY", show_envvar=True,
        help="Largest request body in bytes; larger ones get 413.")] = 1024 * 1024,
    max_attachment_bytes: Annotated[int, typer.Option(
        envvar="POSTLANE_MAX_ATTACHMENT_BYTES", show_envvar=True, min=1,
        help="Largest attachment of a message, in bytes (checked at enqueue; see "
             "docs/content.md for each provider's own limit).")] = DEFAULT_MAX_ATTACHMENT_BYTES,
    max_attachments_bytes: Annotated[int, typer.Option(
        envvar="POSTLANE_MAX_ATTACHMENTS_BYTES", show_envvar=True, min=1,
        help="Largest total of a message's attachments, in bytes; POST /v1/messages takes "
             "a body large enough for it in base64.")] = DEFAULT_MAX_ATTACHMENTS_BYTES,
    sample_interval: Annotated[timedelta, duration_option(
        help="Between the dashboard's in-memory samples (0: off).")
    ] = "5s",  # type: ignore[assignment]
    secure_cookies: Annotated[bool, typer.Option(
        help="Mark the dashboard's session cookie Secure (when served over HTTPS).")] = False,
    log_level: Annotated[str, typer.Option(envvar="POSTLANE_LOG_LEVEL",
                                           help="debug, info, warning...")] = "info",
) -> None:
    """Serve the HTTP API (/v1, OpenAPI at /docs), the dashboard (/dashboard) and /metrics.

    API keys: `postlane apikey create --scopes send,read,operate`. Dashboard sessions are
    signed with $POSTLANE_SESSION_SECRET (set it when several servers share an address).
    One-click unsubscribe links (/unsubscribe/TOKEN) verify with
    $POSTLANE_UNSUBSCRIBE_SECRET (docs/deliverability.md).
    """
    with requires("server", "postlane serve"):
        import uvicorn

        from postlane.api import create_app

    try:
        names = [lane.name for lane in parse_lane_shares(lanes)] if lanes else None
    except ConfigurationError as exc:
        raise typer.BadParameter(str(exc), param_hint="--lanes") from None
    try:
        configure_logging(log_level, ctx.obj.log_format)
    except ConfigurationError as exc:
        raise typer.BadParameter(str(exc), param_hint="--log-level") from None
    log_effective_configuration(logging.getLogger("postlane.api"), "serve",
                                {"db": ctx.obj.db, **ctx.params})
    try:
        tracing.enable_from_env()  # POSTLANE_TRACING=otel
    except (ConfigurationError, MissingExtra) as exc:
        raise typer.BadParameter(str(exc), param_hint=tracing.ENV) from None
    try:
        app = create_app(ctx.obj.db, lanes=names, max_body_bytes=max_body,
                         sample_interval_s=sample_interval.total_seconds(),
                         cookie_secure=secure_cookies,
                         attachment_limits=AttachmentLimits(max_attachment_bytes,
                                                            max_attachments_bytes))
    except ConfigurationError as exc:  # the environment: unsubscribe secret, soft bounces
        raise typer.BadParameter(str(exc)) from None
    # log_config=None: uvicorn's own lines go through the handler configured above, in the
    # chosen format, instead of a second set of handlers of uvicorn's.
    uvicorn.run(app, host=host, port=port, log_level=log_level.lower(), proxy_headers=False,
                server_header=False, log_config=None)
