"""The one seam between Postlane and its database.

Every engine implements ``Store``; every engine passes the same conformance suite
(``tests/integration/test_store_conformance.py``). Operations are named for what they
guard, River-style: a worker can only move a delivery it holds, and only out of
``sending``; nothing moves a delivery out of a terminal state.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from postlane.core.message import Delivery, EnqueueResult, Message
from postlane.core.states import State
from postlane.core.validation import Limits

MAX_RESPONSE_CHARS = 2000
"""Provider responses are kept verbatim up to this bound; some answer with whole HTML pages."""

DELIVERY_COLUMNS: tuple[str, ...] = (
    "id", "idempotency_key", "lane", "channel", "recipient", "sender", "subject", "text_body",
    "html_body", "headers", "metadata", "import_id", "template_id", "template_version",
    "state", "attempts", "claims", "run_at", "expires_at", "lease_owner", "lease_expires_at",
    "attempt_started_at", "provider_message_id", "dead_reason", "last_error", "created_at",
    "updated_at", "sent_at", "finished_at",
)


@dataclass(frozen=True, slots=True)
class Claim:
    """A worker's hold on one delivery: the id plus the claim number the lease guards on."""

    id: int
    claims: int


@dataclass(frozen=True, slots=True)
class Transition:
    """One outcome a worker reports for a delivery it holds.

    Applied only while the delivery is still ``sending`` under the same owner and claim
    number; otherwise it is dropped and the caller learns so from the returned ids.
    """

    id: int
    claims: int
    state: State
    event: str
    """Timeline event kind: ``sent``, ``retry_scheduled``, ``throttled``, ``dead_lettered``..."""
    delay_s: float | None = None
    """For ``pending``: the next attempt is at database-now plus this."""
    spend_attempt: bool = True
    """False for a throttle or a limiter denial: being early is not a failure."""
    error: str | None = None
    provider_message_id: str | None = None
    dead_reason: str | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)
    """Goes into the event; an ``outcome`` key marks it as part of the attempt history."""


@dataclass(frozen=True, slots=True)
class Control:
    name: str
    value: dict[str, Any]
    version: int
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class Event:
    id: int
    delivery_id: int
    at: datetime
    kind: str
    state: str | None
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class RescueResult:
    """What the rescuer did with expired leases, kept apart as the bulk-import text asks."""

    requeued: list[int]
    """Claimed, attempt never started: safe to send, back to ``pending``."""
    ambiguous: list[int]
    """The attempt had started: the provider may have it; never straight back to pending."""


@dataclass(frozen=True, slots=True)
class LaneStats:
    depth: int
    """Deliveries not yet done: pending plus sending."""
    oldest_age_s: float
    """Age since enqueue of the oldest of those; 0 when there are none."""


@dataclass(frozen=True, slots=True)
class Stats:
    """The four numbers (less dead-letter arrivals, which are a rate): see the queueing text."""

    lanes: dict[str, LaneStats]
    states: dict[str, int]
    attempts: dict[str, int]
    """Active (pending or sending) deliveries by the attempt they are on: "1" is a first try."""
    dead_letters: dict[str, int]
    """Open (not replayed, not discarded) dead letters by reason."""

    def as_json(self) -> dict[str, Any]:
        return {
            "lanes": {
                name: {"depth": lane.depth, "oldest_age_s": round(lane.oldest_age_s, 3)}
                for name, lane in sorted(self.lanes.items())
            },
            "states": dict(self.states),
            "attempts": dict(self.attempts),
            "dead_letters": dict(self.dead_letters),
        }


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One dead-lettered delivery with everything needed to act on it, kept verbatim."""

    delivery_id: int
    reason: str
    snapshot: dict[str, Any]
    """The delivery as it was meant to be sent: key, recipient, rendered content, versions."""
    last_response: str | None
    attempt_history: list[dict[str, Any]]
    dead_at: datetime
    replayed_at: datetime | None
    replayed_by: str | None
    discarded_at: datetime | None
    discard_reason: str | None
    replay_count: int = 0
    delivery_state: str | None = None
    """The delivery's state now: ``dead`` (or ``expired``) while the entry is open."""


DEAD_LETTER_COLUMNS = (
    "dl.delivery_id, dl.reason, dl.snapshot, dl.last_response, dl.attempt_history, dl.dead_at, "
    "dl.replayed_at, dl.replayed_by, dl.discarded_at, dl.discard_reason, dl.replay_count, "
    "d.state"
)


@dataclass(frozen=True, slots=True)
class DeadLetterFilter:
    """A triage selection. By default: open entries (still dead, not discarded)."""

    reason: str | None = None
    lane: str | None = None
    template_id: str | None = None
    import_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    replayed: bool | None = None
    """None: either; False: never replayed (what a bulk replay takes); True: replayed."""
    include_closed: bool = False
    """Also entries discarded or whose delivery is no longer dead (replayed and sent)."""

    def where(self, ph: Callable[[str], str], when: Callable[[datetime], Any]
              ) -> tuple[str, dict[str, Any]]:
        """SQL conditions over ``dl`` (dead letters) and ``d`` (deliveries), and their params.

        ``ph`` renders a named placeholder for the engine; ``when`` converts a time.
        """
        conditions: list[str] = []
        params: dict[str, Any] = {}
        if not self.include_closed:
            conditions.append("dl.discarded_at IS NULL AND d.state IN ('dead', 'expired')")
        for name, column in (("reason", "dl.reason"), ("lane", "d.lane"),
                             ("template_id", "d.template_id"), ("import_id", "d.import_id")):
            value = getattr(self, name)
            if value is not None:
                conditions.append(f"{column} = {ph(name)}")
                params[name] = value
        if self.since is not None:
            conditions.append(f"dl.dead_at >= {ph('since')}")
            params["since"] = when(self.since)
        if self.until is not None:
            conditions.append(f"dl.dead_at < {ph('until')}")
            params["until"] = when(self.until)
        if self.replayed is not None:
            conditions.append("dl.replay_count > 0" if self.replayed else "dl.replay_count = 0")
        return (" AND ".join(conditions) or "1 = 1"), params


class Store(abc.ABC):
    """Async operations on the delivery table. Engines: ``postgres``, ``sqlite``."""

    engine: str

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()

    # -- lifecycle -------------------------------------------------------------------------
    @abc.abstractmethod
    async def open(self) -> None: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    async def __aenter__(self) -> Store:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @abc.abstractmethod
    async def migrate(self) -> list[str]:
        """Apply pending migrations; returns the names applied (empty when up to date)."""

    @abc.abstractmethod
    async def pending_migrations(self) -> list[str]: ...

    # -- producing -------------------------------------------------------------------------
    @abc.abstractmethod
    async def enqueue(self, message: Message) -> EnqueueResult:
        """Write one delivery in its own transaction (the outbox form is ``postlane.enqueue``)."""

    @abc.abstractmethod
    async def enqueue_many(self, messages: Sequence[Message]) -> list[EnqueueResult]:
        """Write many deliveries in one transaction; existing keys are returned, not re-created."""

    # -- the worker's path -----------------------------------------------------------------
    @abc.abstractmethod
    async def claim_batch(
        self, lane: str, limit: int, owner: str, lease: timedelta,
        exclude_imports: Sequence[str] = (),
    ) -> list[Delivery]:
        """Lease up to ``limit`` ready deliveries of ``lane`` to ``owner``, oldest first,
        skipping those of paused imports."""

    @abc.abstractmethod
    async def start_attempts(self, owner: str, claims: Sequence[Claim]) -> set[int]:
        """Record, durably and before the request leaves, that these attempts started.

        Returns the ids whose lease is still live and held by ``owner``; only those may be
        sent. This mark is what lets the rescuer tell "never attempted" from "maybe sent".
        """

    @abc.abstractmethod
    async def renew_leases(
        self, owner: str, claims: Sequence[Claim], lease: timedelta
    ) -> set[int]:
        """Extend live leases held by ``owner``; returns the ids still held."""

    @abc.abstractmethod
    async def set_state_if_sending_many(
        self, owner: str, transitions: Sequence[Transition]
    ) -> set[int]:
        """Apply outcomes in one transaction, each guarded by state, owner and claim number.

        Returns the ids applied. A transition to ``dead`` or ``expired`` also writes the
        dead-letter entry (reason ``expired`` is routed apart: there is nothing to fix).
        """

    @abc.abstractmethod
    async def set_state_if_ambiguous_many(self, transitions: Sequence[Transition]) -> set[int]:
        """Resolve ambiguous deliveries (reconciled as sent, requeued, or dead), guarded by
        state and claim number so two reconcilers cannot both act on one."""

    @abc.abstractmethod
    async def list_ambiguous(
        self, limit: int = 100, lanes: Sequence[str] | None = None
    ) -> list[Delivery]:
        """Ambiguous deliveries (of ``lanes``, default all), oldest first, for reconciliation."""

    @abc.abstractmethod
    async def rescue_expired_leases(self, limit: int = 1000) -> RescueResult: ...

    @abc.abstractmethod
    async def wait_for_work(self, timeout: float) -> None:
        """Return when new work may have arrived (NOTIFY on PostgreSQL) or after ``timeout``."""

    # -- controls shared by the fleet ------------------------------------------------------
    @abc.abstractmethod
    async def get_controls(self) -> dict[str, Control]:
        """Every control row (lane and import pauses, breaker states), by name."""

    @abc.abstractmethod
    async def set_control(self, name: str, value: Mapping[str, Any] | None) -> None:
        """Write (or, with ``None``, delete) a control unconditionally."""

    @abc.abstractmethod
    async def compare_and_set_control(
        self, name: str, expected_version: int | None, value: Mapping[str, Any]
    ) -> bool:
        """Write ``value`` only if the row is still at ``expected_version`` (``None``: absent)."""

    # -- reading and operating -------------------------------------------------------------
    @abc.abstractmethod
    async def get(self, id_or_key: int | str) -> Delivery | None: ...

    @abc.abstractmethod
    async def timeline(self, delivery_id: int) -> list[Event]: ...

    @abc.abstractmethod
    async def dead_letter(self, delivery_id: int) -> DeadLetter | None: ...

    @abc.abstractmethod
    async def list_dead_letters(
        self, selection: DeadLetterFilter = DeadLetterFilter(), limit: int = 100
    ) -> list[DeadLetter]:
        """Dead letters matching ``selection``, oldest first."""

    @abc.abstractmethod
    async def replay_dead_letters(self, ids: Sequence[int], by: str) -> set[int]:
        """Send these dead deliveries again: same row, same key, same rendered content, a fresh
        attempt budget. Guarded: only entries whose delivery is still dead or expired and that
        are not discarded. Marks each entry replayed (when, by whom, how often)."""

    @abc.abstractmethod
    async def discard_dead_letter(self, delivery_id: int, reason: str, by: str) -> bool:
        """Close an open entry without sending; it stays for the record until retention."""

    @abc.abstractmethod
    async def find_deliveries(
        self, *, key: str | None = None, recipient: str | None = None,
        import_id: str | None = None, limit: int = 100,
    ) -> list[Delivery]:
        """Deliveries by idempotency key, recipient or import, newest first."""

    @abc.abstractmethod
    async def stats(self) -> Stats: ...

    @abc.abstractmethod
    async def cancel(self, delivery_id: int, reason: str = "") -> bool:
        """Withdraw a pending (or ambiguous) delivery; False when it is past that."""

    @abc.abstractmethod
    async def prune(self, finished_before: timedelta, dead_before: timedelta) -> int:
        """Delete finished deliveries (and their timeline) older than the given ages."""


def bound_response(text: str | None) -> str | None:
    """Keep a provider's response verbatim, but bounded."""
    if text is None or len(text) <= MAX_RESPONSE_CHARS:
        return text
    return text[:MAX_RESPONSE_CHARS] + f"... [{len(text) - MAX_RESPONSE_CHARS} more chars]"


def find_conditions(key: str | None, recipient: str | None, import_id: str | None,
                    placeholder: str) -> tuple[str, dict[str, Any]]:
    """WHERE conditions for ``find_deliveries``; ``placeholder`` is e.g. ``%({})s``."""
    conditions, params = [], {}
    for name, column, value in (("key", "idempotency_key", key),
                                ("recipient", "recipient", recipient),
                                ("import_id", "import_id", import_id)):
        if value is not None:
            conditions.append(f"{column} = {placeholder.format(name)}")
            params[name] = value
    if not conditions:
        raise ValueError("find_deliveries needs a key, a recipient or an import id")
    return " AND ".join(conditions), params
