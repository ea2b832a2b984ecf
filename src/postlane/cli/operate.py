"""``postlane cancel`` and ``postlane resolve``: an operator's hand on single deliveries."""

from __future__ import annotations

import getpass
from enum import StrEnum
from typing import Annotated

import typer

from postlane.cli.main import console, run_with_store
from postlane.core.states import DeadReason, State
from postlane.store.base import Store, Transition


def cancel(
    ctx: typer.Context,
    delivery_id: Annotated[int, typer.Argument(help="The delivery to withdraw.")],
    reason: Annotated[str, typer.Option(help="Why; kept in its timeline.")] = "",
) -> None:
    """Withdraw a pending (or ambiguous) delivery before it is sent."""

    async def _cancel(store: Store) -> bool:
        return await store.cancel(delivery_id, reason or f"cancelled by {getpass.getuser()}")

    if not run_with_store(ctx, _cancel):
        console.print(f"delivery {delivery_id} is not pending or ambiguous; nothing cancelled")
        raise typer.Exit(1)
    console.print(f"delivery {delivery_id} cancelled")


class Resolution(StrEnum):
    SENT = "sent"
    RESEND = "resend"
    DEAD = "dead"


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
        delivery = await store.get(delivery_id)
        if delivery is None:
            return f"no delivery {delivery_id}"
        if delivery.state is not State.AMBIGUOUS:
            return f"delivery {delivery_id} is {delivery.state}, not ambiguous"
        detail = {"resolution": f"operator: {as_}", "by": getpass.getuser(), "note": note}
        state, event, reason = {
            Resolution.SENT: (State.SENT, "reconciled", None),
            Resolution.RESEND: (State.PENDING, "reconciled", None),
            Resolution.DEAD: (State.DEAD, "dead_lettered", DeadReason.AMBIGUOUS_UNRESOLVED),
        }[as_]
        applied = await store.set_state_if_ambiguous_many([Transition(
            delivery.id, delivery.claims, state, event, delay_s=0.0, spend_attempt=False,
            provider_message_id=provider_message_id, dead_reason=reason, detail=detail,
        )])
        return None if applied else f"delivery {delivery_id} changed meanwhile; look again"

    problem = run_with_store(ctx, _resolve)
    if problem:
        console.print(problem)
        raise typer.Exit(1)
    console.print(f"delivery {delivery_id} resolved as {as_}")
