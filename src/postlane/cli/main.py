"""``postlane`` — every verb is a few lines over a core or store call; no rules live here."""

from __future__ import annotations

import asyncio
import json
import os
import tomllib
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from postlane.cli.durations import duration_option
from postlane.core.message import Delivery, Message
from postlane.errors import MissingExtra, PostlaneError
from postlane.status import breaker_reason, fleet_status
from postlane.store import DATABASE_URL_ENV, Store, database_url, open_store
from postlane.store.migrations import ensure_migrated

T = TypeVar("T")

app = typer.Typer(
    name="postlane",
    help="Postlane: a durable send pipeline for transactional email.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)


class Context:
    def __init__(self, db: str, *, db_explicit: bool) -> None:
        self.db = db
        self.db_explicit = db_explicit
        """Whether --db, the environment or the config file named a database."""


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
) -> None:
    settings = load_config(config)
    ctx.default_map = {k: v for k, v in settings.items() if isinstance(v, dict)}
    explicit = db or settings.get("db") or os.environ.get(DATABASE_URL_ENV)
    ctx.obj = Context(database_url(explicit), db_explicit=bool(explicit))


def load_config(path: Path | None) -> dict[str, Any]:
    """Read the TOML configuration; command-line options and the environment win over it."""
    if path is None:
        path = Path("postlane.toml")
        if not path.exists():
            return {}
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise typer.BadParameter(f"configuration file {path} does not exist",
                                 param_hint="--config") from None
    except tomllib.TOMLDecodeError as exc:
        raise typer.BadParameter(f"{path}: {exc}", param_hint="--config") from None
    # Option names may be written as in the CLI (batch-size) or as Python (batch_size).
    return {
        key: ({k.replace("-", "_"): v for k, v in value.items()}
              if isinstance(value, dict) else value)
        for key, value in data.items()
    }


def run_async(coro: Awaitable[T]) -> T:
    """Run ``coro``; a Postlane error becomes a one-line message and exit status 1."""

    async def _await() -> T:
        return await coro

    try:
        return asyncio.run(_await())
    except PostlaneError as exc:
        fail(exc)


def fail(exc: PostlaneError) -> NoReturn:
    """A Postlane error as one line on stderr (escaped: ``postlane[ses]`` is not markup)."""
    err_console.print(f"[red]error:[/red] {escape(str(exc))}")
    raise typer.Exit(1) from None


def run_with_store(
    ctx: typer.Context, action: Callable[[Store], Awaitable[T]], *, migrated: bool = True
) -> T:
    """Open the store named by ``--db``, run ``action``, and turn Postlane errors into exit 1."""

    async def _run() -> T:
        async with open_store(ctx.obj.db) as store:
            if migrated:
                ensure_migrated(await store.pending_migrations())
            return await action(store)

    return run_async(_run())


@app.command()
def migrate(ctx: typer.Context) -> None:
    """Create or upgrade the schema (idempotent)."""

    async def _migrate(store: Store) -> list[str]:
        return await store.migrate()

    applied = run_with_store(ctx, _migrate, migrated=False)
    if applied:
        console.print(f"applied: {', '.join(applied)}")
    else:
        console.print("schema is up to date")


@app.command()
def enqueue(
    ctx: typer.Context,
    to: Annotated[str, typer.Option(help="Recipient address.")],
    key: Annotated[str, typer.Option(help="Idempotency key, derived from the business event.")],
    lane: Annotated[str, typer.Option(help="Lane: interactive or bulk.")] = "interactive",
    subject: Annotated[str, typer.Option(help="Subject line.")] = "",
    text: Annotated[str | None, typer.Option(help="Plain-text body.")] = None,
    html: Annotated[str | None, typer.Option(help="HTML body.")] = None,
    sender: Annotated[str | None, typer.Option("--from", help="Sender address.")] = None,
    expires_in: Annotated[timedelta | None, duration_option(
        help="Validity window, e.g. 15m; no retry is scheduled past it.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the delivery as JSON.")] = False,
) -> None:
    """Queue one message (durable when this returns)."""
    message = Message(key=key, to=to, subject=subject, text=text, html=html, lane=lane,
                      sender=sender, expires_in=expires_in)

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
    table = Table(title="lanes")
    table.add_column("lane")
    table.add_column("depth", justify="right")
    table.add_column("oldest age (s)", justify="right")
    for name, lane in stats["lanes"].items():
        table.add_row(name, str(lane["depth"]), f"{lane['oldest_age_s']:.1f}")
    console.print(table)
    console.print("states:  " + "  ".join(f"{k}={v}" for k, v in stats["states"].items()))
    console.print("attempts: " + ("  ".join(f"#{k}={v}" for k, v in stats["attempts"].items())
                                  or "(nothing active)"))
    dead = stats["dead_letters"]
    console.print("dead letters: " + ("  ".join(f"{k}={v}" for k, v in dead.items()) or "0"))
    if stats["paused_lanes"] or stats["paused_imports"]:
        console.print(f"[yellow]paused:[/yellow] lanes {stats['paused_lanes']} "
                      f"imports {stats['paused_imports']}")
    for account, record in stats["breakers"].items():
        console.print(f"[red]breaker {account}: {record['state']}[/red] "
                      f"({escape(breaker_reason(record))})")


def delivery_json(delivery: Delivery) -> dict[str, Any]:
    """A delivery as JSON for ``--json`` output (recipient included: the operator asked)."""

    def _t(value: datetime | None) -> str | None:
        return value.isoformat() if value else None

    return {
        "id": delivery.id, "key": delivery.key, "state": str(delivery.state),
        "lane": delivery.lane, "channel": delivery.channel, "to": delivery.recipient,
        "subject": delivery.subject, "attempts": delivery.attempts,
        "run_at": _t(delivery.run_at), "expires_at": _t(delivery.expires_at),
        "created_at": _t(delivery.created_at), "sent_at": _t(delivery.sent_at),
        "provider_message_id": delivery.provider_message_id,
        "dead_reason": delivery.dead_reason, "last_error": delivery.last_error,
    }


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


def _register() -> None:
    from postlane.cli import demo as demo_cli
    from postlane.cli import dlq as dlq_cli
    from postlane.cli import worker as worker_cli

    app.command()(demo_cli.demo)
    app.command()(worker_cli.worker)
    app.command()(__import__("postlane.cli.check", fromlist=["check"]).check)
    app.command()(worker_cli.pause)
    app.command()(worker_cli.resume)
    app.command()(__import__("postlane.cli.sandbox", fromlist=["sandbox"]).sandbox)
    app.command()(dlq_cli.timeline)
    from postlane.cli import operate as operate_cli

    app.command()(operate_cli.cancel)
    app.command()(operate_cli.resolve)
    app.add_typer(dlq_cli.dlq, name="dlq")
    __import__("postlane.cli.templates", fromlist=["register"]).register(app)
    __import__("postlane.cli.imports", fromlist=["register"]).register(app)
    from postlane.cli import suppress as suppress_cli

    app.add_typer(suppress_cli.suppress, name="suppress")
    app.command()(__import__("postlane.cli.serve", fromlist=["serve"]).serve)
    app.add_typer(__import__("postlane.cli.apikeys", fromlist=["apikey"]).apikey, name="apikey")


_register()


def main() -> None:
    try:
        app()
    except MissingExtra as exc:  # raised outside run_async: opening a provider or limiter
        err_console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise SystemExit(1) from None
