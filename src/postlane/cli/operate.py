"""``postlane cancel`` and ``postlane resolve``: an operator's hand on one delivery, or on a
selection of them.

A selection acts in two runs, as ``POST /v1/messages/cancel`` does: the first (or
``--dry-run``) counts it and prints the bound to confirm with; the second, with
``--expected`` and ``--upto-id`` from that count, acts on the deliveries up to that id only,
and refuses if the selection grew past the count meanwhile. Nothing is touched by a run that
confirms nothing, so a typo in a filter costs a preview, not a lane.
"""

from __future__ import annotations

import getpass
from collections.abc import Awaitable, Callable
from typing import Annotated

import typer

from postlane import operations
from postlane.cli.dlq import Import, Lane, Template
from postlane.cli.shell import console, run_with_store
from postlane.core.records import DeliveryFilter
from postlane.operations import (
    BulkResult,
    ConfirmationRequired,
    OperationRefused,
    Resolution,
)
from postlane.store.base import Store

Recipient = Annotated[str | None, typer.Option(help="Only this recipient.")]
Expected = Annotated[int | None, typer.Option(
    help="Confirm a selection: the count its preview printed.")]
UptoId = Annotated[int | None, typer.Option(
    help="Confirm a selection: the highest id its preview printed; none above is touched.")]
DryRun = Annotated[bool, typer.Option(help="Only count the selection.")]


def _state_option(action: str) -> object:
    states = operations.BULK_STATES[action]
    return typer.Option(help=f"Select this state: {', '.join(states)} [default: {states[0]}].")


def cancel(
    ctx: typer.Context,
    delivery_id: Annotated[int | None, typer.Argument(
        help="The delivery to withdraw. Without it: a selection (--lane, --import, ...).")
    ] = None,
    reason: Annotated[str, typer.Option(help="Why; kept in each timeline.")] = "",
    lane: Lane = None,
    state: Annotated[str | None, _state_option("cancel")] = None,
    template: Template = None, import_id: Import = None, recipient: Recipient = None,
    expected: Expected = None, upto_id: UptoId = None, dry_run: DryRun = False,
) -> None:
    """Withdraw a pending (or ambiguous) delivery before it is sent, or every queued one
    of a selection (previewed, then confirmed)."""
    who = getpass.getuser()
    selection = _selection(delivery_id, lane, state, template, import_id, recipient)
    if selection is not None:
        _bulk(ctx, "cancel", "cancelled", lambda store: operations.cancel_matching(
            store, selection, by=who, reason=reason, expected=expected, upto_id=upto_id,
            dry_run=dry_run), confirming=expected is not None)
        return
    assert delivery_id is not None  # _selection asks for one or the other

    async def _cancel(store: Store) -> str | None:
        try:
            await operations.cancel(store, delivery_id, by=who, reason=reason)
        except OperationRefused as exc:
            return str(exc)
        return None

    _single(ctx, _cancel, f"delivery {delivery_id} cancelled")


def resolve(
    ctx: typer.Context,
    as_: Annotated[Resolution, typer.Option(
        "--as", help="sent: the provider has it (you checked); resend: send it again with "
                     "the same key (a duplicate is possible); dead: give up, dead-letter it.")],
    delivery_id: Annotated[int | None, typer.Argument(
        help="An ambiguous delivery. Without it: a selection (--lane, --import, ...).")
    ] = None,
    provider_message_id: Annotated[str | None, typer.Option(
        help="With --as sent and one delivery: the provider's id for it, if you found one.")
    ] = None,
    note: Annotated[str, typer.Option(help="Why; kept in each timeline.")] = "",
    lane: Lane = None,
    template: Template = None, import_id: Import = None, recipient: Recipient = None,
    expected: Expected = None, upto_id: UptoId = None, dry_run: DryRun = False,
) -> None:
    """Settle an ambiguous delivery held for an operator (the lane's `hold` policy), or
    every ambiguous one of a selection alike (previewed, then confirmed)."""
    who = getpass.getuser()
    selection = _selection(delivery_id, lane, None, template, import_id, recipient)
    if selection is not None:
        if provider_message_id is not None:
            raise typer.BadParameter("belongs to one delivery, not to a selection",
                                     param_hint="--provider-message-id")
        _bulk(ctx, "resolve", f"resolved as {as_}", lambda store: operations.resolve_matching(
            store, selection, as_, by=who, note=note, expected=expected, upto_id=upto_id,
            dry_run=dry_run), confirming=expected is not None)
        return
    assert delivery_id is not None

    async def _resolve(store: Store) -> str | None:
        try:
            await operations.resolve(store, delivery_id, as_, by=who, note=note,
                                     provider_message_id=provider_message_id)
        except OperationRefused as exc:
            return str(exc)
        return None

    _single(ctx, _resolve, f"delivery {delivery_id} resolved as {as_}")


def _selection(delivery_id: int | None, lane: str | None, state: str | None,
               template: str | None, import_id: str | None,
               recipient: str | None) -> DeliveryFilter | None:
    """The selection the filters name; None for one delivery. Exactly one of the two: a
    bare command selects nothing rather than everything."""
    given = any(v is not None for v in (lane, state, template, import_id, recipient))
    if delivery_id is not None:
        if given:
            raise typer.BadParameter("give a delivery id or a selection's filters, not both")
        return None
    if not given:
        raise typer.BadParameter("give a delivery id, or a selection: --lane, --state, "
                                 "--template, --import or --recipient")
    try:
        return DeliveryFilter(state=state, lane=lane, template_id=template,
                              import_id=import_id, recipient=recipient)
    except ValueError as exc:  # an unknown state, said with the states it takes
        raise typer.BadParameter(str(exc), param_hint="--state") from None


def _single(ctx: typer.Context, act: Callable[[Store], Awaitable[str | None]],
            done: str) -> None:
    problem = run_with_store(ctx, act)
    if problem:
        console.print(problem, markup=False)
        raise typer.Exit(1)
    console.print(done)


def _bulk(ctx: typer.Context, action: str, verb: str,
          act: Callable[[Store], Awaitable[BulkResult]], *, confirming: bool) -> None:
    """Run a bulk action; print its preview (and how to confirm it) or what it did. A
    preview asked for (``--dry-run``) exits 0; a run that did nothing for want of a
    confirmation, or whose confirmation no longer holds, exits 1."""

    async def _run(store: Store) -> tuple[BulkResult | None, str]:
        try:
            return await act(store), ""
        except ConfirmationRequired as exc:
            return exc.preview, str(exc)
        except OperationRefused as exc:
            return None, str(exc)

    result, problem = run_with_store(ctx, _run)
    if result is None:
        console.print(problem, markup=False)
        raise typer.Exit(1)
    what = ", ".join(f"{k}={v}" for k, v in result.selection.as_dict().items())
    if result.dry_run:
        console.print(f"{result.matched} deliveries match ({what})", markup=False)
        if result.matched:
            console.print(f"to {action} them: the same command with --expected "
                          f"{result.matched} --upto-id {result.upto_id}", markup=False)
        if problem:  # the action refused: unconfirmed, or the selection grew
            console.print("nothing done" + (f": {problem}" if confirming else ""),
                          markup=False)
            raise typer.Exit(1)
        return
    console.print(f"{result.acted} of {result.matched} deliveries {verb} ({what}, ids up to "
                  f"{result.upto_id})", markup=False)
    if result.acted < result.matched:
        console.print(f"{result.matched - result.acted} left the selection meanwhile "
                      "(sent, claimed or settled)", markup=False)
