"""``postlane sandbox``: a fake ESP over HTTP for demos, staging and load tests."""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta
from typing import Annotated

import typer

from postlane.cli.durations import duration_option
from postlane.cli.shell import console, err_console


def sandbox(
    port: Annotated[int, typer.Option(help="TCP port; 0 picks a free one.")] = 8025,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    rate: Annotated[float | None, typer.Option(
        help="Account ceiling in sends per second (429 with Retry-After above it).")] = None,
    error_rate: Annotated[float, typer.Option(help="Share of requests answered 503.")] = 0.0,
    throttle_rate: Annotated[float, typer.Option(
        help="Share of requests answered 429 at random.")] = 0.0,
    timeout_rate: Annotated[float, typer.Option(
        help="Share of requests accepted and then answered only after --timeout-delay.")
    ] = 0.0,
    timeout_delay: Annotated[timedelta, duration_option(
        help="How long an accept-then-timeout answer is held back.")
    ] = "5s",  # type: ignore[assignment]
    reject: Annotated[str | None, typer.Option(
        help="Regular expression: matching recipients are rejected with 400.")] = None,
    unknown_template: Annotated[list[str] | None, typer.Option(
        help="Template id answered with 404 (repeatable).")] = None,
    latency: Annotated[timedelta, duration_option(
        help="Added to every answer.")] = "0s",  # type: ignore[assignment]
    dedup_window: Annotated[timedelta, duration_option(
        positive=True, help="How long an idempotency key is remembered.")
    ] = "1d",  # type: ignore[assignment]
    retry_after: Annotated[timedelta, duration_option(
        help="Retry-After of a random 429.")] = "1s",  # type: ignore[assignment]
    seed: Annotated[int | None, typer.Option(help="Random seed, for repeatable runs.")] = None,
    webhook_url: Annotated[str | None, typer.Option(
        help="Post delivery events here, e.g. http://127.0.0.1:8080/v1/webhooks/sandbox.")
    ] = None,
    webhook_secret: Annotated[str | None, typer.Option(
        envvar="POSTLANE_WEBHOOK_SECRET_SANDBOX", show_envvar=True,
        help="Standard Webhooks secret (whsec_...) the events are signed with.")] = None,
    bounce: Annotated[str | None, typer.Option(
        help="Regular expression: matching recipients are accepted, then hard-bounce.")
    ] = None,
    complain: Annotated[str | None, typer.Option(
        help="Regular expression: matching recipients are accepted, then complain.")] = None,
) -> None:
    """Serve the sandbox provider over HTTP (use it as sandbox+http://HOST:PORT)."""
    from postlane.providers.sandbox import SandboxConfig
    from postlane.providers.sandbox_events import SandboxEvents
    from postlane.providers.sandbox_server import bind, serve

    for name, value in (("--error-rate", error_rate), ("--throttle-rate", throttle_rate),
                        ("--timeout-rate", timeout_rate)):
        if not 0 <= value <= 1:
            raise typer.BadParameter("must be between 0 and 1", param_hint=name)
    for name, pattern in (("--reject", reject), ("--bounce", bounce), ("--complain", complain)):
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise typer.BadParameter(str(exc), param_hint=name) from None
    events = None
    if webhook_url:
        if not webhook_secret:
            raise typer.BadParameter("--webhook-url needs --webhook-secret (whsec_...)",
                                     param_hint="--webhook-secret")
        events = SandboxEvents(secret=webhook_secret, bounce=bounce, complain=complain)
    config = SandboxConfig(
        rate=rate, error_rate=error_rate, throttle_rate=throttle_rate,
        timeout_rate=timeout_rate, timeout_delay_s=timeout_delay.total_seconds(),
        reject=reject, unknown_templates=frozenset(unknown_template or ()),
        dedup_window_s=dedup_window.total_seconds(),
        retry_after_s=retry_after.total_seconds(), latency_s=latency.total_seconds(),
        seed=seed,
    )
    try:
        sock = bind(host, port)
    except OSError as exc:
        err_console.print(f"[red]error:[/red] cannot listen on {host}:{port}: {exc}")
        raise typer.Exit(1) from None

    def ready(url: str) -> None:
        provider_url = url.replace("http://", "sandbox+http://", 1)
        console.print(f"sandbox listening on {url} (provider URL: {provider_url})",
                      highlight=False, soft_wrap=True)
        console.file.flush()

    engine = asyncio.run(serve(config, sock, on_ready=ready, events=events,
                               webhook_url=webhook_url))
    stats = engine.stats
    console.print(f"sandbox stopped: {stats.accepted} accepted, "
                  f"{stats.duplicates_suppressed} duplicates suppressed, "
                  f"{stats.throttled} throttled, {stats.errors} errors, "
                  f"{stats.timeouts} timeouts, {stats.rejected} rejected", highlight=False)
