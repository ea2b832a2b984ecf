"""An operator's hand on deliveries: cancel, or settle ambiguous ones, one at a time or a
filtered selection at once.

Shared by every operator surface (the CLI, the HTTP API, the dashboard), so the rules of
what may be cancelled or resolved, and what each choice writes in the timeline, live once,
below the shells.

A bulk action is previewed, then confirmed: the preview (``dry_run``) counts the selection
and names the highest id in it; the action takes that count back as ``expected`` and the id
as ``upto_id``. It acts only on deliveries up to that id (nothing that arrived after the
preview), and it is refused when the selection has grown past the count the operator saw
(deliveries that left it meanwhile, sent or claimed, are simply not acted on).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from enum import StrEnum

from postlane.core.attachments import Attachment
from postlane.core.message import Delivery
from postlane.core.records import DeliveryFilter, Transition
from postlane.core.states import DeadReason, State
from postlane.errors import PostlaneError
from postlane.store.roles import OperatorStore

_Act = Callable[[list[Delivery]], Awaitable[set[int]]]


class OperationRefused(PostlaneError):
    """The delivery is not in a state the operation applies to (or changed meanwhile)."""


class Resolution(StrEnum):
    """How an operator settles an ambiguous delivery."""

    SENT = "sent"
    """The provider has it (the operator checked)."""
    RESEND = "resend"
    """Send it again with the same key (a duplicate is possible)."""
    DEAD = "dead"
    """Give up: dead-letter it as ``ambiguous_unresolved``."""


_RESOLVED: dict[Resolution, tuple[State, str, DeadReason | None]] = {
    Resolution.SENT: (State.SENT, "reconciled", None),
    Resolution.RESEND: (State.PENDING, "reconciled", None),
    Resolution.DEAD: (State.DEAD, "dead_lettered", DeadReason.AMBIGUOUS_UNRESOLVED),
}


async def cancel(store: OperatorStore, delivery_id: int, *, by: str, reason: str = "") -> None:
    """Withdraw a pending (or ambiguous) delivery before it is sent; the timeline says who."""
    why = f"{reason} (cancelled by {by})" if reason else f"cancelled by {by}"
    if not await store.cancel(delivery_id, why):
        raise OperationRefused(
            f"delivery {delivery_id} is not pending or ambiguous; nothing cancelled")


async def resolve(
    store: OperatorStore, delivery_id: int, resolution: Resolution, *, by: str, note: str = "",
    provider_message_id: str | None = None,
) -> None:
    """Settle an ambiguous delivery held for an operator (the lane's ``hold`` policy).

    Guarded like every transition: applied only while the delivery is still ambiguous under
    the claim number read here, so a concurrent reconcile or a second operator wins cleanly.
    """
    delivery = await store.get(delivery_id)
    if delivery is None:
        raise OperationRefused(f"no delivery {delivery_id}")
    if delivery.state is not State.AMBIGUOUS:
        raise OperationRefused(f"delivery {delivery_id} is {delivery.state}, not ambiguous")
    applied = await store.set_state_if_ambiguous_many([
        _resolution(delivery, resolution, by, note, provider_message_id)])
    if not applied:
        raise OperationRefused(f"delivery {delivery_id} changed meanwhile; look again")


def _resolution(delivery: Delivery, resolution: Resolution, by: str, note: str,
                provider_message_id: str | None = None) -> Transition:
    detail = {"resolution": f"operator: {resolution}", "by": by, "note": note}
    state, event, reason = _RESOLVED[resolution]
    return Transition(
        delivery.id, delivery.claims, state, event, delay_s=0.0, spend_attempt=False,
        provider_message_id=provider_message_id, dead_reason=reason, detail=detail,
    )


# -- a filtered selection at once ----------------------------------------------------------
@dataclass(frozen=True, slots=True)
class BulkResult:
    """A bulk action's preview (``dry_run``) or outcome."""

    selection: DeliveryFilter
    """The selection as acted on (its state narrowed to what the action applies to)."""
    matched: int
    """Deliveries in the selection (up to ``upto_id``) when it was counted."""
    upto_id: int
    """The highest id counted: the confirmation's bound (0 when nothing matched)."""
    acted: int = 0
    """Cancelled or resolved (0 on a dry run); less than ``matched`` when some left the
    selection meanwhile (sent, claimed, settled by a reconciler)."""
    dry_run: bool = False


BULK_PAGE = 500
"""Deliveries per transaction of a bulk action: short transactions beside the workers."""


def _narrowed(selection: DeliveryFilter, allowed: tuple[str, ...], what: str) -> DeliveryFilter:
    if selection.state is None:
        return replace(selection, state=allowed[0])
    if selection.state not in allowed:
        raise OperationRefused(
            f"{what} applies to deliveries in state {' or '.join(allowed)}, "
            f"not {selection.state}")
    return selection


async def _bulk(
    store: OperatorStore, selection: DeliveryFilter, *, expected: int | None,
    upto_id: int | None, dry_run: bool, act: _Act,
) -> BulkResult:
    matched, top = await store.count_deliveries(selection, upto_id=upto_id)
    if dry_run:
        return BulkResult(selection, matched, top, dry_run=True)
    if expected is None or upto_id is None:
        raise ConfirmationRequired(
            f"{matched} deliveries match; confirm with expected={matched} and "
            f"upto_id={top} (the preview's count and bound)",
            BulkResult(selection, matched, top, dry_run=True))
    if matched > expected:
        raise ConfirmationRequired(
            f"the selection holds {matched} deliveries now, more than the {expected} "
            "confirmed; preview it again", BulkResult(selection, matched, top, dry_run=True))
    acted = 0
    cursor: int | None = None
    while True:
        page = await store.list_deliveries(selection, before=cursor, upto_id=upto_id,
                                           limit=BULK_PAGE)
        if not page:
            break
        acted += len(await act(page))
        cursor = page[-1].id
    return BulkResult(selection, matched, upto_id, acted=acted)


class ConfirmationRequired(OperationRefused):
    """A bulk action without its preview's confirmation, or whose selection grew past it.
    ``preview`` is the selection as counted now."""

    def __init__(self, message: str, preview: BulkResult) -> None:
        super().__init__(message)
        self.preview = preview


async def cancel_matching(
    store: OperatorStore, selection: DeliveryFilter, *, by: str, reason: str = "",
    expected: int | None = None, upto_id: int | None = None, dry_run: bool = False,
) -> BulkResult:
    """Cancel the queued deliveries of a selection (state ``queued``, ``pending`` or
    ``retrying``; none given: ``queued``). Ambiguous ones are ``resolve_matching``'s."""
    selection = _narrowed(selection, ("queued", "pending", "retrying"), "cancel")
    why = reason or f"cancelled by {by}"

    async def act(page: list[Delivery]) -> set[int]:
        return await store.cancel_many([d.id for d in page], why, by)

    return await _bulk(store, selection, expected=expected, upto_id=upto_id,
                       dry_run=dry_run, act=act)


async def resolve_matching(
    store: OperatorStore, selection: DeliveryFilter, resolution: Resolution, *, by: str,
    note: str = "", expected: int | None = None, upto_id: int | None = None,
    dry_run: bool = False,
) -> BulkResult:
    """Settle the ambiguous deliveries of a selection alike, each guarded as in
    ``resolve`` (a delivery a reconciler settled meanwhile is left as it is)."""
    selection = _narrowed(selection, ("ambiguous",), "resolve")

    async def act(page: list[Delivery]) -> set[int]:
        return await store.set_state_if_ambiguous_many(
            [_resolution(d, resolution, by, note) for d in page
             if d.state is State.AMBIGUOUS])

    return await _bulk(store, selection, expected=expected, upto_id=upto_id,
                       dry_run=dry_run, act=act)


async def stored_attachment(store: OperatorStore, delivery_id: int,
                            position: int) -> Attachment | None:
    """One part of a delivery as stored (and sent): for an operator's download."""
    parts = (await store.attachments_among([delivery_id])).get(delivery_id, ())
    return parts[position] if 0 <= position < len(parts) else None


__all__ = [
    "BulkResult",
    "ConfirmationRequired",
    "OperationRefused",
    "Resolution",
    "cancel",
    "cancel_matching",
    "resolve",
    "resolve_matching",
    "stored_attachment",
]
