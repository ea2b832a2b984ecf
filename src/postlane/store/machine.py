"""The state machine's decisions that are not SQL, held once for every engine.

An engine's queries say *how* a transition is written in its dialect; what the transition
is lives here: which states are terminal (from ``core.states``), where a rescued lease goes
and what the timeline says about it, how a dead letter's attempt history is shaped. Both
engines read these, so a rule changes in one place and the conformance suite holds both
to it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, NamedTuple

from postlane.core.records import STATUS_RANK, Event
from postlane.core.states import TERMINAL_STATES, State
from postlane.store import base, migrations

TERMINAL_SQL = "(" + ", ".join(f"'{s.value}'" for s in sorted(TERMINAL_STATES)) + ")"
"""The terminal states as an SQL list, for ``state IN {{terminal}}``."""

SQLITE_NOW = "((julianday('now') - 2440587.5) * 86400.0)"
"""SQLite's clock as REAL unix seconds, for ``{{now}}``: PostgreSQL has ``now()``; SQLite
computes it from ``julianday('now')``, which is fixed within a statement."""

# -- rescue: a lease that expired ------------------------------------------------------------
RESCUE_STARTED_ERROR = ("lease expired after the attempt started; the provider may have "
                        "accepted it")
"""``last_error`` of a delivery rescued after its attempt started (it goes to ambiguous)."""
RESCUE_STARTED_RESPONSE = "lease expired after the attempt started"
"""The attempt history's response for that attempt (it never reported)."""
RESCUE_EVENT = "lease_expired"


def rescue_target(started: bool) -> State:
    """Where a delivery whose lease expired goes: an attempt that started may have reached
    the provider, so it is never retried blindly; one that never started goes back."""
    return State.AMBIGUOUS if started else State.PENDING


def rescue_detail(owner: str | None, started: bool, attempts: int) -> dict[str, Any]:
    """The timeline entry of a rescue; a started attempt that never reported joins the
    attempt history as ambiguous."""
    detail: dict[str, Any] = {"owner": owner, "attempt_started": started}
    if started:
        detail.update(outcome="ambiguous", attempt=attempts,
                      response=RESCUE_STARTED_RESPONSE)
    return detail


# -- the timeline: an enqueue is told by the delivery, a claim by the row that ends it -------
ENQUEUED_EVENT = "enqueued"
CLAIMED_EVENT = "claimed"

ClaimColumns = tuple[datetime | None, str | None, int | None]
"""An event row's ``claimed_at, claimed_by, claim``: set on the row that ends a claim (an
outcome, a release, a rescue), NULL on every other row."""


class DeliveryColumns(NamedTuple):
    """What the engine's ``timeline`` query reads from the delivery itself: when it was
    enqueued, its state, and the claim it holds while ``sending``."""

    created_at: datetime
    state: str
    claimed_at: datetime | None
    owner: str | None
    claim: int | None


def claimed_event(like: Event, at: datetime, owner: str | None, claim: int | None) -> Event:
    return Event(like.id, like.delivery_id, at, CLAIMED_EVENT, State.SENDING.value,
                 {"owner": owner, "claim": claim})


def timeline(delivery_id: int, rows: Iterable[tuple[Event, ClaimColumns]],
             delivery: DeliveryColumns | None) -> list[Event]:
    """A delivery's timeline as readers know it, from the engine's ``timeline`` query.

    Neither an enqueue nor a claim writes a row of its own: the ``enqueued`` entry is the
    delivery's ``created_at``, and a ``claimed`` entry goes before each row that ended a
    claim (0015: that row carries when, by whom and which claim), with one last for the
    claim still held (the delivery's ``claimed_at``, owner and claim number while it is
    ``sending``). So an enqueue writes no event row and a no-op send writes one. Deliveries
    enqueued by an earlier Postlane have their own ``enqueued`` row (and, before 0015,
    ``claimed`` rows with NULL claim columns), and read as they were written: no schema
    changed, so old and new workers can share a database while they are upgraded."""
    events: list[Event] = []
    for event, (claimed_at, owner, claim) in rows:
        if claimed_at is not None:
            events.append(claimed_event(event, claimed_at, owner, claim))
        events.append(event)
    if delivery is None:  # no such delivery (a prune deletes its events with it)
        return events
    if not events or events[0].kind != ENQUEUED_EVENT:
        events.insert(0, Event(0, delivery_id, delivery.created_at, ENQUEUED_EVENT,
                               State.PENDING.value, {}))
    if delivery.state == State.SENDING.value and delivery.claimed_at is not None:
        events.append(claimed_event(events[-1], delivery.claimed_at, delivery.owner,
                                    delivery.claim))
    return events


# -- dead letters ----------------------------------------------------------------------------
def attempt_history(events: Iterable[Mapping[str, Any]],
                    last: Mapping[str, Any] | None = None, last_at: str | None = None,
                    ) -> list[dict[str, Any]]:
    """A dead letter's attempt history: every timeline entry that records an outcome, oldest
    first, each with its time, then the transition that killed it (when it records one).
    ``events`` are ``{"data": ..., "at": ...}`` in timeline order."""
    history = [{**event["data"], "at": event["at"]} for event in events
               if "outcome" in (event["data"] or {})]
    if last is not None and "outcome" in last:
        history.append({**last, "at": last_at})
    return history


def sql_fragments(engine: str) -> dict[str, str]:
    """What a ``{{name}}`` in ``sql/<engine>/queries.sql`` stands for (``store.queries``)."""
    clock = {"now": SQLITE_NOW} if engine == "sqlite" else {}
    return {
        **clock,
        "terminal": TERMINAL_SQL,
        "rescue_started_error": _literal(RESCUE_STARTED_ERROR),
        "rescue_started_response": _literal(RESCUE_STARTED_RESPONSE),
        "rescue_event": _literal(RESCUE_EVENT),
        **_shapes(),
    }


def _shapes() -> dict[str, str]:
    """Select lists and conditions the records (``store.base``, ``core``) dictate, spelled
    once for every query that reads them."""
    return {
        "delivery_columns": ", ".join(base.DELIVERY_COLUMNS),
        "delivery_rows": base.DELIVERY_ROWS,
        # DELIVERY_COLUMNS over a narrow row (alias c or d) joined to its message (m).
        "claimed_columns": base.qualified_columns("c", "m"),
        "delivery_message_columns": base.qualified_columns("d", "m"),
        "dead_letter_columns": base.DEAD_LETTER_COLUMNS,
        "held_columns": base.HELD_COLUMNS,
        "held_from": base.HELD_FROM,
        "import_columns": base.IMPORT_COLUMNS,
        "template_reference": base.TEMPLATE_REFERENCE_CONDITION,
        "migrations_table": migrations.MIGRATIONS_TABLE,
        "provider_status_ranks": " ".join(f"WHEN '{k}' THEN {v}"
                                          for k, v in STATUS_RANK.items()),
    }


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
