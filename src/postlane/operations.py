"""An operator's hand on deliveries: cancel one or a selection, settle ambiguous ones,
discard and replay dead letters of a selection, ask a breaker to probe now.

Shared by every operator surface (the CLI, the API and the dashboard call these functions),
so the rules of what may be cancelled or resolved, and what each choice writes in the
timeline (always with who did it), live once, below the shells.

Bulk operations take a ``MessageFilter`` (the messages browser's selection) and act on at
most ``limit`` deliveries, in pages, each write guarded by state as a single one is: a
delivery that changed meanwhile is left alone and counted as such.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from enum import StrEnum

from postlane.core.breaker import CONTROL_PREFIX, BreakerRecord, probe_now
from postlane.core.records import (
    QUEUED,
    DeadLetterFilter,
    DeliverySummary,
    MessageFilter,
    Transition,
)
from postlane.core.states import DeadReason, State
from postlane.dead_letters import replay_one, replay_selection
from postlane.errors import PostlaneError
from postlane.store.roles import FleetStore, OperatorStore

log = logging.getLogger("postlane.operations")

BULK_LIMIT = 10_000
"""The most deliveries one bulk operation touches; the operator repeats it for more."""
PAGE = 500
"""Deliveries read and written per statement by a bulk operation."""


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


@dataclass(frozen=True, slots=True)
class BulkResult:
    """What a bulk operation did to a selection."""

    applied: list[int] = field(default_factory=list)
    """The deliveries it changed."""
    skipped: int = 0
    """Deliveries of the selection that changed meanwhile (another operator, a worker)."""
    more: bool = False
    """The selection held more than the limit: run it again for the rest."""
    canary: int | None = None
    """A staged replay: the canary replayed now (first step) or found sent (second)."""
    expired: list[int] = field(default_factory=list)
    """A staged replay: entries no longer useful (discard them)."""


# -- one delivery --------------------------------------------------------------------------
async def cancel(store: OperatorStore, delivery_id: int, *, by: str, reason: str = "") -> None:
    """Withdraw a pending (or ambiguous) delivery before it is sent."""
    if not await store.cancel(delivery_id, reason or f"cancelled by {by}"):
        raise OperationRefused(
            f"delivery {delivery_id} is not pending or ambiguous; nothing cancelled")


def _resolution(delivery_id: int, claims: int, resolution: Resolution, *, by: str,
                note: str, provider_message_id: str | None = None) -> Transition:
    detail = {"resolution": f"operator: {resolution}", "by": by, "note": note}
    state, event, reason = _RESOLVED[resolution]
    return Transition(delivery_id, claims, state, event, delay_s=0.0, spend_attempt=False,
                      provider_message_id=provider_message_id, dead_reason=reason,
                      detail=detail)


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
    applied = await store.set_state_if_ambiguous_many([_resolution(
        delivery.id, delivery.claims, resolution, by=by, note=note,
        provider_message_id=provider_message_id)])
    if not applied:
        raise OperationRefused(f"delivery {delivery_id} changed meanwhile; look again")


# -- a selection ---------------------------------------------------------------------------
async def matching(store: OperatorStore, selection: MessageFilter,
                   limit: int) -> tuple[list[list[DeliverySummary]], bool]:
    """The deliveries of ``selection`` in pages of ``PAGE``, newest first, at most ``limit``;
    and whether the selection holds more."""
    pages: list[list[DeliverySummary]] = []
    taken, before = 0, None
    while taken < limit:
        page = await store.list_deliveries(selection, before_id=before,
                                           limit=min(PAGE, limit - taken))
        if not page:
            return pages, False
        pages.append(page)
        taken += len(page)
        before = page[-1].id
    more = bool(await store.list_deliveries(selection, before_id=before, limit=1))
    return pages, more


BULK_STATES: dict[str, tuple[tuple[str, ...], str]] = {
    "cancel": (("pending", "retrying", QUEUED), QUEUED),
    "discard": (("dead", "expired"), "dead"),
    "replay": (("dead", "expired"), "dead"),
    "resolve": (("ambiguous",), "ambiguous"),
}
"""Each bulk operation: the selection states it applies to, and the one it narrows an
unfiltered selection to."""


def selection_for(action: str, selection: MessageFilter) -> MessageFilter:
    """``selection`` narrowed to what ``action`` (a key of ``BULK_STATES``) acts on: what
    a confirmation counts, and what the operation then takes."""
    allowed, default = BULK_STATES[action]
    if selection.state is None:
        return selection.with_state(default)
    if selection.state not in allowed:
        raise OperationRefused(f"{action} applies to {' or '.join(allowed)} deliveries; this "
                               f"selection is {selection.state}")
    return selection


async def cancel_matching(store: OperatorStore, selection: MessageFilter, *, by: str,
                          reason: str = "", limit: int = BULK_LIMIT) -> BulkResult:
    """Cancel the queued deliveries (pending or retrying) of ``selection``."""
    selection = selection_for("cancel", selection)
    pages, more = await matching(store, selection, limit)
    applied: list[int] = []
    skipped = 0
    for page in pages:
        done = await store.cancel_if_pending_many(
            [d.id for d in page], reason or f"cancelled by {by}", by)
        applied += sorted(done, reverse=True)
        skipped += len(page) - len(done)
    log.info("%s cancelled %d deliveries (%d changed meanwhile)", by, len(applied), skipped)
    return BulkResult(applied, skipped, more)


async def discard_matching(store: OperatorStore, selection: MessageFilter, *, by: str,
                           reason: str = "", limit: int = BULK_LIMIT) -> BulkResult:
    """Discard the open dead letters of ``selection`` (dead, or expired if asked)."""
    selection = selection_for("discard", selection)
    pages, more = await matching(store, selection, limit)
    applied: list[int] = []
    skipped = 0
    for page in pages:
        done = await store.discard_dead_letters(
            [d.id for d in page], reason or f"discarded by {by}", by)
        applied += sorted(done, reverse=True)
        skipped += len(page) - len(done)
    log.info("%s discarded %d dead letters (%d not open)", by, len(applied), skipped)
    return BulkResult(applied, skipped, more)


async def resolve_matching(store: OperatorStore, selection: MessageFilter,
                           resolution: Resolution, *, by: str, note: str = "",
                           limit: int = BULK_LIMIT) -> BulkResult:
    """Settle the ambiguous deliveries of ``selection`` one way, as ``resolve`` does one."""
    selection = selection_for("resolve", selection)
    pages, more = await matching(store, selection, limit)
    applied: list[int] = []
    skipped = 0
    for page in pages:
        done = await store.set_state_if_ambiguous_many([
            _resolution(d.id, d.claims, resolution, by=by, note=note) for d in page])
        applied += sorted(done, reverse=True)
        skipped += len(page) - len(done)
    log.info("%s resolved %d ambiguous deliveries as %s (%d changed meanwhile)", by,
             len(applied), resolution, skipped)
    return BulkResult(applied, skipped, more)


async def replay_matching(store: OperatorStore, selection: MessageFilter, *, by: str,
                          limit: int = 1000) -> BulkResult:
    """Staged replay of the dead letters of ``selection``, as ``postlane dlq replay``: the
    first call replays one entry (the canary); once it has been sent, the next replays the
    rest. A selection by key is one entry, replayed at once."""
    selection_for("replay", selection)
    if selection.key is not None:
        delivery = await store.get(selection.key)
        if delivery is None:
            raise OperationRefused(f"no delivery with key {selection.key!r}")
        await replay_one(store, delivery.id, by=by)
        return BulkResult([delivery.id], canary=delivery.id)
    if selection.recipient is not None:
        raise OperationRefused("a staged replay takes a selection by lane, import or "
                               "template; for one recipient, replay each message from its page")
    entries = DeadLetterFilter(lane=selection.lane, template_id=selection.template_id,
                               import_id=selection.import_id)
    tried = await store.list_dead_letters(
        DeadLetterFilter(lane=selection.lane, template_id=selection.template_id,
                         import_id=selection.import_id, replayed=True, include_closed=True),
        limit=1)
    if not tried:
        first = await store.list_dead_letters(entries, limit=1)
        if not first:
            raise OperationRefused("no open dead letters in this selection")
        canary = await replay_one(store, first[0].delivery_id, by=by)
        return BulkResult([canary.delivery_id], canary=canary.delivery_id)
    plan = await replay_selection(store, entries, by=by, limit=limit)
    return BulkResult(plan.replay, canary=plan.canary, expired=plan.skipped_expired)


# -- the fleet -----------------------------------------------------------------------------
async def probe_breaker(store: FleetStore, account: str, *, by: str,
                        now: float | None = None) -> BreakerRecord:
    """Make an open breaker due for its probe at once (the operator fixed the cause); the
    next worker to look sends the probe, as after any cool-down."""
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
    "BULK_LIMIT",
    "BULK_STATES",
    "BulkResult",
    "OperationRefused",
    "Resolution",
    "cancel",
    "cancel_matching",
    "discard_matching",
    "matching",
    "probe_breaker",
    "replay_matching",
    "resolve",
    "resolve_matching",
    "selection_for",
]
