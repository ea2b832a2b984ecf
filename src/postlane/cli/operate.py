"""``postlane cancel`` and ``postlane resolve``: an operator's hand on single deliveries."""

from __future__ import annotations

import getpass
from typing import Annotated

import typer

from postlane import operations
from postlane.cli.shell import console, run_with_store
from postlane.operations import OperationRefused, Resolution
from postlane.store.base import Store


def cancel(
    ctx: typer.Context,
    delivery_id: Annotated[int, typer.Argument(help="The delivery to withdraw.")],
    reason: Annotated[str, typer.Option(help="Why; kept in its timeline.")] = "",
) -> None:
    """Withdraw a pending (or ambiguous) delivery before it is sent."""

    async def _cancel(store: Store) -> str | None:
        try:
            await operations.cancel(store, delivery_id, by=getpass.getuser(), reason=reason)
        except OperationRefused as exc:
            return str(exc)
        return None

    problem = run_with_store(ctx, _cancel)
    if problem:
        console.print(problem, markup=False)
        raise typer.Exit(1)
    console.print(f"delivery {delivery_id} cancelled")


def resolve(
    ctx: typer.Context,
    delivery_id: Annotated[int, typer.Argument(help="An ambiguous delivery.")],
    as_: Annotated[Resolution, typer.Option(
        "--as", help="sent: the provider has it (you checked); resend: send it again with "
                     "the same key (a duplicate is possible); dead: give up, dead-letter it.")],
    provider_message_id: Annotated[str | None, typer.Option(
        help="With --as sent: the provider's id for it, if you found one.")] = None,
    note: Annotated[str, typer.Option(help="Why; kept in its timeline.")] = "",
) -> None:
    """Settle an ambiguous delivery held for an operator (the lane's `hold` policy)."""

    async def _resolve(store: Store) -> str | None:
        try:
            await operations.resolve(store, delivery_id, as_, by=getpass.getuser(), note=note,
                                     provider_message_id=provider_message_id)
        except OperationRefused as exc:
            return str(exc)
        return None

    problem = run_with_store(ctx, _resolve)
    if problem:
        console.print(problem, markup=False)
        raise typer.Exit(1)
    console.print(f"delivery {delivery_id} resolved as {as_}")
