"""``postlane`` — every verb is a few lines over a core or store call; no rules live here.

Every command is registered here, statically, from modules that import only
``postlane.cli.shell`` (never this module): the tree is known without running anything.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from postlane.cli import apikeys as apikeys_cli
from postlane.cli import bounces as bounces_cli
from postlane.cli import callbacks as callbacks_cli
from postlane.cli import check as check_cli
from postlane.cli import demo as demo_cli
from postlane.cli import dlq as dlq_cli
from postlane.cli import imports as imports_cli
from postlane.cli import operate as operate_cli
from postlane.cli import sandbox as sandbox_cli
from postlane.cli import serve as serve_cli
from postlane.cli import suppress as suppress_cli
from postlane.cli import templates as templates_cli
from postlane.cli import worker as worker_cli
from postlane.cli.config import load_config
from postlane.cli.durations import duration_option
from postlane.cli.shell import (
    Context,
    console,
    delivery_json,
    err_console,
    one_line,
    run_async,
    run_with_store,
    table,
)
from postlane.core.fallback import with_sms_fallback
from postlane.core.message import Delivery, Message
from postlane.core.sms import sms_message
from postlane.errors import InvalidMessage, MissingExtra
from postlane.logs import LOG_FORMATS
from postlane.status import breaker_reason, fleet_status
from postlane.store import DATABASE_URL_ENV, Store, database_url

app = typer.Typer(
    name="postlane",
    help="Postlane: a durable send pipeline for transactional email.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help texts are plain: "[default: ...]" must reach the reader
)


@app.callback()
def _global(
    ctx: typer.Context,
    db: Annotated[str | None, typer.Option(
        "--db", envvar=DATABASE_URL_ENV, show_envvar=True,
        help="Database URL: sqlite:///path.db or postgresql://... "
             "[default: sqlite:///postlane.db]")] = None,
    config: Annotated[Path | None, typer.Option(
        "--config", envvar="POSTLANE_CONFIG", show_envvar=True,
        help="TOML file of defaults: top-level `db`, and a table per command "
             "([worker] rate = \"200/s\"). [default: ./postlane.toml if present]")] = None,
    log_format: Annotated[str | None, typer.Option(
        "--log-format", envvar="POSTLANE_LOG_FORMAT", show_envvar=True,
        help=f"Log lines of `worker` and `serve`: {' or '.join(LOG_FORMATS)} (one JSON "
             "object per line, for a log pipeline). [default: text]")] = None,
) -> None:
    settings = load_config(config, ctx.command)
    ctx.default_map = {k: v for k, v in settings.items() if isinstance(v, dict)}
    explicit = db or settings.get("db") or os.environ.get(DATABASE_URL_ENV)
    chosen_format = log_format or settings.get("log_format") or "text"
    if chosen_format not in LOG_FORMATS:
        raise typer.BadParameter(f"{chosen_format!r} is not one of {', '.join(LOG_FORMATS)}",
                                 param_hint="--log-format")
    ctx.obj = Context(database_url(explicit), db_explicit=bool(explicit),
                      log_format=chosen_format)


@app.command()
def migrate(ctx: typer.Context) -> None:
    """Create or upgrade the schema (idempotent)."""

    async def _migrate(store: Store) -> list[str]:
        return await store.migrate()

    applied = run_with_store(ctx, _migrate, migrated=False)
    if applied:
        console.print(f"applied: {', '.join(applied)}", soft_wrap=True)  # one line
    else:
        console.print("schema is up to date")


@app.command()
def enqueue(
    ctx: typer.Context,
    to: Annotated[str, typer.Option(help="Recipient address (an E.164 number for SMS).")],
    key: Annotated[str, typer.Option(help="Idempotency key, derived from the business event.")],
    lane: Annotated[str, typer.Option(help="Lane: interactive or bulk.")] = "interactive",
    subject: Annotated[str, typer.Option(help="Subject line.")] = "",
    text: Annotated[str | None, typer.Option(help="Plain-text body.")] = None,
    html: Annotated[str | None, typer.Option(help="HTML body.")] = None,
    sender: Annotated[str | None, typer.Option("--from", help="Sender address.")] = None,
    expires_in: Annotated[timedelta | None, duration_option(
        help="Validity window, e.g. 15m; no retry is scheduled past it.")] = None,
    channel: Annotated[str, typer.Option(
        help="email, or sms (an SMS worker sends it; its segments are recorded).")] = "email",
    sms_fallback_to: Annotated[str | None, typer.Option(
        help="An email's SMS fallback: the number (with --sms-fallback-text; docs/sms.md).")
    ] = None,
    sms_fallback_text: Annotated[str | None, typer.Option(
        help="An email's SMS fallback: the text.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the delivery as JSON.")] = False,
) -> None:
    """Queue one message (durable when this returns)."""
    try:
        message = _message(key=key, to=to, subject=subject, text=text, html=html, lane=lane,
                           sender=sender, expires_in=expires_in, channel=channel,
                           fallback=(sms_fallback_to, sms_fallback_text))
    except InvalidMessage as exc:
        raise typer.BadParameter(str(exc)) from None

    async def _enqueue(store: Store) -> tuple[bool, Delivery]:
        result = await store.enqueue(message)
        delivery = await store.get(result.id)
        assert delivery is not None
        return result.created, delivery

    created, delivery = run_with_store(ctx, _enqueue)
    if as_json:
        print(json.dumps({**delivery_json(delivery), "created": created}))
    else:
        verb = "queued" if created else "already queued (same key)"
        console.print(f"{verb}: delivery {delivery.id} key={delivery.key} lane={delivery.lane} "
                      f"state={delivery.state}")


def _message(*, channel: str, fallback: tuple[str | None, str | None],
             **fields: Any) -> Message:
    """The message ``postlane enqueue`` was asked for: an email (with its SMS fallback, when
    given) or an SMS with its segments recorded."""
    fallback_to, fallback_text = fallback
    if channel == "sms":
        if fallback_to or fallback_text:
            raise InvalidMessage("--sms-fallback-* belong to an email, not to an SMS")
        return sms_message(key=fields["key"], to=fields["to"], text=fields["text"] or "",
                           lane=fields["lane"], expires_in=fields["expires_in"])
    message = Message(channel=channel, **fields)
    if fallback_to or fallback_text:
        if not (fallback_to and fallback_text):
            raise InvalidMessage("an SMS fallback needs --sms-fallback-to and "
                                 "--sms-fallback-text")
        message = with_sms_fallback(message, to=fallback_to, text=fallback_text)
    return message


@app.command()
def status(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """The four numbers: depth and oldest age per lane, states, attempts, dead letters."""

    async def _stats(store: Store) -> dict[str, Any]:
        return (await fleet_status(store)).as_json()

    stats = run_with_store(ctx, _stats)
    if as_json:
        print(json.dumps(stats))
        return
    grid = table("lane", "depth", "oldest age (s)", title="lanes", right=("depth",
                                                                        "oldest age (s)"))
    for name, lane in stats["lanes"].items():
        grid.add_row(name, str(lane["depth"]), f"{lane['oldest_age_s']:.1f}")
    console.print(grid)
    console.print("states:  " + "  ".join(f"{k}={v}" for k, v in stats["states"].items()))
    console.print("attempts: " + ("  ".join(f"#{k}={v}" for k, v in stats["attempts"].items())
                                  or "(nothing active)"))
    dead = stats["dead_letters"]
    console.print("dead letters: " + ("  ".join(f"{k}={v}" for k, v in dead.items()) or "0"))
    channels = stats["pending_by_channel"]
    if set(channels) - {"email"}:  # a channel needs a worker of its own (--provider)
        console.print("pending by channel: " + "  ".join(f"{k}={v}" for k, v in
                                                         sorted(channels.items())))
    if stats["sms_fallbacks"]:
        console.print("sms fallbacks: " + "  ".join(f"{k}={v}" for k, v in
                                                    sorted(stats["sms_fallbacks"].items())))
    if stats["paused_lanes"] or stats["paused_imports"]:
        console.print(f"[yellow]paused:[/yellow] lanes "
                      f"{escape(', '.join(stats['paused_lanes']) or 'none')}; imports "
                      f"{escape(', '.join(stats['paused_imports']) or 'none')}")
    for account, record in stats["breakers"].items():
        console.print(f"[red]breaker {account}: {record['state']}[/red] "
                      f"({escape(breaker_reason(record))})")
    _print_deliverability(stats["deliverability"])


def _print_deliverability(figures: dict[str, Any]) -> None:
    """Bounces and complaints per lane with their rates, and a line for each rate over the
    limit a provider would act on."""
    hours = figures["window_s"] / 3600
    grid = table("lane", "sent", "bounced", "complained", "soft", "unsub",
                 title=f"deliverability (last {hours:g} h)",
                 right=("sent", "bounced", "complained", "soft", "unsub"), keep=("lane",))
    over = []
    for name, lane in figures["lanes"].items():
        bounce, complaint = lane["bounce_rate"], lane["complaint_rate"]
        grid.add_row(name, str(lane["sent"]), f"{lane['bounced']} ({bounce:.2%})",
                     f"{lane['complained']} ({complaint:.2%})", str(lane["soft_bounced"]),
                     str(lane["unsubscribed"]))
        if bounce > figures["bounce_rate_limit"]:
            over.append(f"{name}: bounce rate {bounce:.2%} is over "
                        f"{figures['bounce_rate_limit']:.0%}")
        if complaint > figures["complaint_rate_limit"]:
            over.append(f"{name}: complaint rate {complaint:.2%} is over "
                        f"{figures['complaint_rate_limit']:.1%}")
    console.print(grid)
    for line in over:
        console.print(f"[red]{escape(line)}[/red] (providers review or pause senders there; "
                      "see docs/deliverability.md)")


@app.command()
def prune(
    ctx: typer.Context,
    finished_older_than: Annotated[timedelta, duration_option(
        help="Delete sent, expired and cancelled deliveries finished longer ago.")
    ] = "7d",  # type: ignore[assignment]
    dead_older_than: Annotated[timedelta, duration_option(
        help="Delete dead letters older than this (long enough to survive a weekend).")
    ] = "7d",  # type: ignore[assignment]
) -> None:
    """Retention: delete finished deliveries and their timeline, keeping the hot table small."""

    async def _prune(store: Store) -> int:
        return await store.prune(finished_older_than, dead_older_than)

    console.print(f"pruned {run_with_store(ctx, _prune)} deliveries")


app.command()(demo_cli.demo)
app.command()(worker_cli.worker)
app.command()(check_cli.check)
app.command()(worker_cli.pause)
app.command()(worker_cli.resume)
app.command()(sandbox_cli.sandbox)
app.command()(dlq_cli.timeline)
app.command()(operate_cli.cancel)
app.command()(operate_cli.resolve)
app.add_typer(dlq_cli.dlq, name="dlq")
app.add_typer(templates_cli.templates, name="templates")
app.command("import")(imports_cli.import_)
app.add_typer(imports_cli.imports, name="imports")
app.add_typer(suppress_cli.suppress, name="suppress")
app.add_typer(bounces_cli.bounces, name="bounces")
app.command()(serve_cli.serve)
app.add_typer(apikeys_cli.apikey, name="apikey")
app.add_typer(callbacks_cli.callbacks, name="callbacks")

__all__ = ["Context", "app", "console", "delivery_json", "err_console", "main", "run_async",
           "run_with_store"]


def main() -> None:
    try:
        app()
    except MissingExtra as exc:  # raised outside run_async: opening a provider or limiter
        err_console.print(f"[red]error:[/red] {escape(one_line(str(exc)))}", soft_wrap=True)
        raise SystemExit(1) from None
