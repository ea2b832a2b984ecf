"""An operator's hand on deliveries: cancel, or settle ambiguous ones, one at a time or a
filtered selection at once; discard and replay (staged) the dead letters of a selection; ask
an open breaker to probe now.

Shared by every operator surface (the CLI, the HTTP API, the dashboard), so the rules of
what may be cancelled, resolved or discarded, and what each choice writes in the timeline
(always with who did it), live once, below the shells.

A bulk action is previewed, then confirmed: the preview (``dry_run``) counts the selection
and names the highest id in it; the action takes that count back as ``expected`` and the id
as ``upto_id``. It acts only on deliveries up to that id (nothing that arrived after the
preview), and it is refused when the selection has grown past the count the operator saw
(deliveries that left it meanwhile, sent or claimed, are simply not acted on). It works in
pages of ``BULK_PAGE``, each write guarded by state as a single one is.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from enum import StrEnum

from postlane.core.attachments import Attachment
from postlane.core.breaker import CONTROL_PREFIX, BreakerRecord, probe_now
from postlane.core.message import Delivery
from postlane.core.records import DeadLetterFilter, DeliveryFilter, Transition
from postlane.core.states import DeadReason, State
from postlane.dead_letters import ReplayPlan, replay_one, replay_selection
from postlane.errors import PostlaneError
from postlane.store.roles import FleetStore, OperatorStore

log = logging.getLogger("postlane.operations")

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
    """Cancelled, resolved or discarded (0 on a dry run); less than ``matched`` when some left the
    selection meanwhile (sent, claimed, settled by a reconciler)."""
    dry_run: bool = False


BULK_PAGE = 500
"""Deliveries per transaction of a bulk action: short transactions beside the workers."""

BULK_STATES: dict[str, tuple[str, ...]] = {
    "cancel": ("queued", "pending", "retrying"),
    "resolve": ("ambiguous",),
    "discard": ("dead", "expired"),
    "replay": ("dead", "expired"),
}
"""Each bulk action: the selection states it applies to; the first is what it narrows a
selection without a state to."""


def selection_for(action: str, selection: DeliveryFilter) -> DeliveryFilter:
    """``selection`` narrowed to what ``action`` (a key of ``BULK_STATES``) acts on: what
    its preview counts, and what it then takes."""
    allowed = BULK_STATES[action]
    if selection.state is None:
        return replace(selection, state=allowed[0])
    if selection.state not in allowed:
        raise OperationRefused(
            f"{action} applies to deliveries in state {' or '.join(allowed)}, "
            f"not {selection.state}")
    return selection


async def preview_matching(store: OperatorStore, action: str,
                           selection: DeliveryFilter) -> BulkResult:
    """What a bulk ``action`` would take: its selection counted, and the bound to confirm
    with (what every bulk action's ``dry_run`` answers)."""
    selection = selection_for(action, selection)
    matched, top = await store.count_deliveries(selection)
    return BulkResult(selection, matched, top, dry_run=True)


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
    selection = selection_for("cancel", selection)
    why = reason or f"cancelled by {by}"

    async def act(page: list[Delivery]) -> set[int]:
        return await store.cancel_many([d.id for d in page], why, by)

    result = await _bulk(store, selection, expected=expected, upto_id=upto_id,
                         dry_run=dry_run, act=act)
    if not dry_run:
        log.info("%s cancelled %d of %d queued deliveries", by, result.acted, result.matched)
    return result


async def resolve_matching(
    store: OperatorStore, selection: DeliveryFilter, resolution: Resolution, *, by: str,
    note: str = "", expected: int | None = None, upto_id: int | None = None,
    dry_run: bool = False,
) -> BulkResult:
    """Settle the ambiguous deliveries of a selection alike, each guarded as in
    ``resolve`` (a delivery a reconciler settled meanwhile is left as it is)."""
    selection = selection_for("resolve", selection)

    async def act(page: list[Delivery]) -> set[int]:
        return await store.set_state_if_ambiguous_many(
            [_resolution(d, resolution, by, note) for d in page
             if d.state is State.AMBIGUOUS])

    result = await _bulk(store, selection, expected=expected, upto_id=upto_id,
                         dry_run=dry_run, act=act)
    if not dry_run:
        log.info("%s resolved %d of %d ambiguous deliveries as %s", by, result.acted,
                 result.matched, resolution)
    return result


async def discard_matching(
    store: OperatorStore, selection: DeliveryFilter, *, by: str, reason: str = "",
    expected: int | None = None, upto_id: int | None = None, dry_run: bool = False,
) -> BulkResult:
    """Discard the open dead letters of a selection (state ``dead``, the default, or
    ``expired``): they are kept for the record and never sent. Previewed and confirmed as
    ``cancel_matching``."""
    selection = selection_for("discard", selection)
    why = reason or f"discarded by {by}"

    async def act(page: list[Delivery]) -> set[int]:
        return await store.discard_dead_letters([d.id for d in page], why, by)

    result = await _bulk(store, selection, expected=expected, upto_id=upto_id,
                         dry_run=dry_run, act=act)
    if not dry_run:
        log.info("%s discarded %d of %d dead letters", by, result.acted, result.matched)
    return result


async def replay_matching(store: OperatorStore, selection: DeliveryFilter, *, by: str,
                          limit: int = 1000) -> ReplayPlan:
    """Staged replay of the dead letters of a selection, as ``postlane dlq replay``: the
    first call replays one entry (the canary); once it has been sent, the next replays the
    rest (``dead_letters.replay_selection``, at most ``limit``). A selection by key is one
    entry, replayed at once. The canary is its own confirmation: nothing more is replayed
    until one message of the selection went out."""
    selection_for("replay", selection)
    if selection.key is not None:
        delivery = await store.get(selection.key)
        if delivery is None:
            raise OperationRefused(f"no delivery with key {selection.key!r}")
        await replay_one(store, delivery.id, by=by)
        return ReplayPlan([delivery.id], canary=delivery.id)
    if selection.recipient is not None:
        raise OperationRefused("a staged replay takes a selection by lane, import or "
                               "template; for one recipient, replay each message from its page")
    entries = DeadLetterFilter(lane=selection.lane, template_id=selection.template_id,
                               import_id=selection.import_id)
    tried = await store.list_dead_letters(replace(entries, replayed=True, include_closed=True),
                                          limit=1)
    if not tried:
        first = await store.list_dead_letters(entries, limit=1)
        if not first:
            raise OperationRefused("no open dead letters in this selection")
        canary = await replay_one(store, first[0].delivery_id, by=by)
        return ReplayPlan([canary.delivery_id], canary=canary.delivery_id)
    return await replay_selection(store, entries, by=by, limit=limit)


# -- the fleet -----------------------------------------------------------------------------
async def probe_breaker(store: FleetStore, account: str, *, by: str,
                        now: float | None = None) -> BreakerRecord:
    """Make an open breaker due for its probe at once (the operator fixed the cause); the
    next worker to look sends the probe, as after any cool-down (``core.breaker.probe_now``)."""
    name = CONTROL_PREFIX + account
    control = (await store.get_controls()).get(name)
    if control is None:
        raise OperationRefused(f"the breaker of {account} is closed; nothing to probe")
    record = BreakerRecord.from_json(control.value)
    if record.state != "open":
        raise OperationRefused(f"the breaker of {account} is probing already")
    due = probe_now(record, time.time() if now is None else now)
    if not await store.compare_and_set_control(name, control.version, due.as_json()):
        raise OperationRefused(f"the breaker of {account} changed meanwhile; look again")
    log.warning("breaker %s: %s asked for a probe now", name, by)
    return due


__all__ = [
    "BULK_STATES",
    "BulkResult",
    "ConfirmationRequired",
    "OperationRefused",
    "Resolution",
    "cancel",
    "cancel_matching",
    "discard_matching",
    "preview_matching",
    "probe_breaker",
    "replay_matching",
    "resolve",
    "resolve_matching",
    "selection_for",
    "stored_attachment",
]


async def stored_attachment(store: OperatorStore, delivery_id: int,
                            position: int) -> Attachment | None:
    """One part of a delivery as stored (and sent): for an operator's download."""
    parts = (await store.attachments_among([delivery_id])).get(delivery_id, ())
    return parts[position] if 0 <= position < len(parts) else None
