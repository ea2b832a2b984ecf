"""``postlane`` — every verb is a few lines over a core or store call; no rules live here."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from postlane.core.durations import parse_duration
from postlane.core.message import Delivery, Message
from postlane.errors import PostlaneError
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
    def __init__(self, db: str) -> None:
        self.db = db


@app.callback()
def _global(
    ctx: typer.Context,
    db: Annotated[str | None, typer.Option(
        "--db", envvar=DATABASE_URL_ENV, show_envvar=True,
        help="Database URL: sqlite:///path.db or postgresql://... "
             "[default: sqlite:///postlane.db]")] = None,
) -> None:
    ctx.obj = Context(database_url(db))


def run_with_store(
    ctx: typer.Context, action: Callable[[Store], Awaitable[T]], *, migrated: bool = True
) -> T:
    """Open the store named by ``--db``, run ``action``, and turn Postlane errors into exit 1."""

    async def _run() -> T:
        async with open_store(ctx.obj.db) as store:
            if migrated:
                ensure_migrated(await store.pending_migrations())
            return await action(store)

    try:
        return asyncio.run(_run())
    except PostlaneError as exc:
        err_console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None


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
    expires_in: Annotated[str | None, typer.Option(
        help="Validity window, e.g. 15m; no retry is scheduled past it.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the delivery as JSON.")] = False,
) -> None:
    """Queue one message (durable when this returns)."""
    try:
        window = parse_duration(expires_in) if expires_in else None
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--expires-in") from None
    message = Message(key=key, to=to, subject=subject, text=text, html=html, lane=lane,
                      sender=sender, expires_in=window)

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
        return (await store.stats()).as_json()

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


def main() -> None:
    app()
