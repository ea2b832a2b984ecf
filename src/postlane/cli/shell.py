"""What every ``postlane`` command shares: the consoles, the context, running against a store.

Below ``cli/main.py`` and every command module, so a command imports these helpers without
importing the module that registers it (no circle, no registration at a distance).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, NoReturn, TypeVar

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from postlane.core.message import Delivery
from postlane.errors import PostlaneError
from postlane.store import Store, open_store
from postlane.store.migrations import ensure_migrated

T = TypeVar("T")

console = Console()
err_console = Console(stderr=True)


class Context:
    """``ctx.obj`` of every command: what the global options named."""

    def __init__(self, db: str, *, db_explicit: bool, log_format: str = "text") -> None:
        self.db = db
        self.db_explicit = db_explicit
        """Whether --db, the environment or the config file named a database."""
        self.log_format = log_format
        """``text`` or ``json``: how ``worker`` and ``serve`` write their log lines."""


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
    err_console.print(f"[red]error:[/red] {escape(one_line(str(exc)))}", soft_wrap=True)
    raise typer.Exit(1) from None


def one_line(text: str) -> str:
    """A driver's multi-line message (psycopg's ``connection failed: ...\\nMultiple
    connection attempts failed...``) as one line an operator can grep."""
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


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


def table(*columns: str, title: str | None = None, right: tuple[str, ...] = (),
          keep: tuple[str, ...] = ()) -> Table:
    """A table that stays readable at 80 columns: light borders, and cells that wrap or fold
    rather than end in ``…`` (a cut key or date is useless to an operator on call).

    ``right``: columns of numbers; ``keep``: values never broken (an id, a key, a reason),
    others wrap first. No header word is split, and a ``(UTC)`` column keeps its date whole.
    """
    grid = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left")
    for column in columns:
        shortest = max(len(word) for word in column.split())
        if column.endswith("(UTC)"):
            shortest = max(shortest, len("2026-12-01"))
        grid.add_column(column, justify="right" if column in right else "left",
                        overflow="fold", no_wrap=column in keep, min_width=shortest)
    return grid


def when(value: datetime | None) -> str:
    """A time as the tables show it: UTC, to the second, the date kept whole."""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def ids(values: list[int], shown: int = 20) -> str:
    """Delivery ids as an operator reads them: ``4, 5, 9 and 12 more`` (never a Python list)."""
    head = ", ".join(str(v) for v in values[:shown]) or "none"
    return head + (f" and {len(values) - shown} more" if len(values) > shown else "")


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


__all__ = [
    "Context",
    "console",
    "delivery_json",
    "err_console",
    "fail",
    "ids",
    "one_line",
    "run_async",
    "run_with_store",
    "table",
    "when",
]
