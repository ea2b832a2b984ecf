"""An operator's hand on single deliveries: cancel one, settle an ambiguous one.

Shared by every operator surface (the CLI today; the API and the dashboard can call the
same functions), so the rules of what may be cancelled or resolved, and what each choice
writes in the timeline, live once, below the shells.
"""

from __future__ import annotations

from enum import StrEnum

from postlane.core.attachments import Attachment
from postlane.core.records import Transition
from postlane.core.states import DeadReason, State
from postlane.errors import PostlaneError
from postlane.store.roles import OperatorStore


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
    """Withdraw a pending (or ambiguous) delivery before it is sent."""
    if not await store.cancel(delivery_id, reason or f"cancelled by {by}"):
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
    detail = {"resolution": f"operator: {resolution}", "by": by, "note": note}
    state, event, reason = _RESOLVED[resolution]
    applied = await store.set_state_if_ambiguous_many([Transition(
        delivery.id, delivery.claims, state, event, delay_s=0.0, spend_attempt=False,
        provider_message_id=provider_message_id, dead_reason=reason, detail=detail,
    )])
    if not applied:
        raise OperationRefused(f"delivery {delivery_id} changed meanwhile; look again")


__all__ = ["OperationRefused", "Resolution", "cancel", "resolve"]


async def stored_attachment(store: OperatorStore, delivery_id: int,
                            position: int) -> Attachment | None:
    """One part of a delivery as stored (and sent): for an operator's download."""
    parts = (await store.attachments_among([delivery_id])).get(delivery_id, ())
    return parts[position] if 0 <= position < len(parts) else None
