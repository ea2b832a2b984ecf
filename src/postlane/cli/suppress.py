"""``postlane suppress list|add|remove``: the addresses Postlane will not send to."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Annotated

import typer

from postlane.cli.durations import positive_duration
from postlane.cli.shell import console, ids, run_with_store, table, when
from postlane.core.records import Suppression
from postlane.core.redaction import mask_address
from postlane.core.validation import check_address
from postlane.errors import InvalidAddress
from postlane.store.base import Store

suppress = typer.Typer(help="The suppression list: hard bounces, complaints, unsubscribes, "
                            "repeated soft bounces (for a while).",
                       no_args_is_help=True, rich_markup_mode=None)


@suppress.command("list")
def list_(ctx: typer.Context,
          address: Annotated[str | None, typer.Option(help="Only this address.")] = None,
          limit: int = 100, as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Suppressed addresses, newest first."""

    async def _list(store: Store) -> list[Suppression]:
        return await store.list_suppressions(address, limit)

    rows = run_with_store(ctx, _list)
    if as_json:
        print(json.dumps([{"address": r.address, "stream": r.stream, "reason": r.reason,
                           "delivery_id": r.delivery_id, "created_at": r.created_at.isoformat(),
                           "source_event": r.source_event,
                           "expires_at": r.expires_at.isoformat() if r.expires_at else None,
                           "active": r.active(datetime.now(UTC))}
                          for r in rows]))
        return
    grid = table("address", "stream", "reason", "since (UTC)", "until (UTC)",
                 title=f"suppressions ({len(rows)})", keep=("address",))
    now = datetime.now(UTC)
    for r in rows:
        until = ("removed" if r.expires_at is None
                 else when(r.expires_at) + ("" if r.active(now) else " (over)"))
        grid.add_row(r.address if address else mask_address(r.address), r.stream, r.reason,
                     when(r.created_at), until)
    console.print(grid)
    for r in rows if address else ():
        console.print(f"{r.stream}: from {r.source_event or 'an operator'}"
                      + (f", delivery {r.delivery_id}" if r.delivery_id else ""),
                      markup=False, highlight=False)
    if rows and not address:
        console.print("addresses are masked (#: a hash of the whole address); "
                      "--address ADDRESS shows one in full", style="dim")


@suppress.command()
def add(ctx: typer.Context, address: str,
        stream: Annotated[str, typer.Option(help="A lane, or * for every lane.")] = "*",
        reason: Annotated[str, typer.Option(help="Why.")] = "operator",
        for_: Annotated[timedelta | None, typer.Option(
            "--for", parser=positive_duration, metavar="DURATION",
            help="Only for this long (e.g. 7d); default: until removed.")] = None,
        ) -> None:
    """Stop sending to ADDRESS."""
    try:
        check_address(address, field="address")
    except InvalidAddress as exc:
        raise typer.BadParameter(str(exc)) from None

    async def _add(store: Store) -> bool:
        return await store.suppress(address, stream, reason, expires_in=for_)

    created = run_with_store(ctx, _add)
    console.print("suppressed" if created else "already suppressed")


@suppress.command()
def remove(
    ctx: typer.Context, address: str,
    stream: Annotated[str | None, typer.Option(help="Only this stream.")] = None,
    replay: Annotated[bool, typer.Option(
        help="Also send, with their original keys, the deliveries it stopped.")] = False,
) -> None:
    """Lift a suppression (and optionally replay what it stopped)."""

    async def _remove(store: Store) -> tuple[int, list[int]]:
        removed = await store.unsuppress(address, stream)
        requeued = await store.requeue_suppressed(address) if replay else []
        return removed, requeued

    removed, requeued = run_with_store(ctx, _remove)
    console.print(f"lifted {removed} suppression(s)"
                  + (f"; requeued deliveries: {ids(requeued)}" if replay else ""))
