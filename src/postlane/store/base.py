"""The one seam between Postlane and its database.

Every engine implements ``Store``; every engine passes the same conformance suite
(``tests/integration/test_store_conformance.py``). Operations are named for what they
guard, River-style: a worker can only move a delivery it holds, and only out of
``sending``; nothing moves a delivery out of a terminal state.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from postlane.core.message import Delivery, EnqueueResult, Message
from postlane.core.producers import LEGACY_API
from postlane.core.states import State
from postlane.core.validation import Limits
from postlane.errors import InvalidMessage, StoreError

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


STATUS_RANK: dict[str, int] = {
    "deferred": 0, "delivered": 1, "opened": 2, "clicked": 2, "bounced": 3, "complained": 4,
}
"""A delivery's provider status only moves up this ladder: a late ``delivered`` after a
``bounced`` is recorded in the timeline but does not change the status."""


@dataclass(frozen=True, slots=True)
class ProviderEvent:
    """A delivery event a provider reported (by webhook), normalised."""

    provider: str
    event_id: str
    kind: str
    """``delivered``, ``bounced`` (hard), ``deferred`` (soft bounce), ``complained``,
    ``opened``, ``clicked``."""
    provider_message_id: str | None
    recipient: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ProviderEventResult:
    duplicate: bool
    """The event id was seen before; nothing was done."""
    delivery_id: int | None
    status_changed: bool
    suppressed: str | None = None
    """The address this event put on the suppression list."""


@dataclass(frozen=True, slots=True)
class Suppression:
    address: str
    stream: str
    """The lane it applies to, or ``*`` for every lane."""
    reason: str
    delivery_id: int | None
    created_at: datetime


def suppression_for(event: ProviderEvent, lane: str) -> tuple[str, str] | None:
    """(stream, reason) an event suppresses its address for, if any: a hard bounce for
    every lane (the mailbox does not exist), a complaint for the lane it came through."""
    if event.kind == "bounced":
        return "*", "hard bounce"
    if event.kind == "complained":
        return lane, "complaint"
    return None


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
        skipping those of paused imports. A row that cannot be read back comes as an
        ``UnreadableDelivery`` (as from every read of deliveries), never as an error that
        fails the batch (see ``postlane.store.unreadable``)."""

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


    # -- provider events and the suppression list -------------------------------------------
    @abc.abstractmethod
    async def record_provider_event(self, event: ProviderEvent) -> ProviderEventResult:
        """Process a provider event once: attach it to its delivery (by provider message id)
        in the timeline, move the provider status only forward, and suppress the address on
        a hard bounce or a complaint."""

    @abc.abstractmethod
    async def suppress(self, address: str, stream: str, reason: str,
                       delivery_id: int | None = None) -> bool:
        """Add an address to the suppression list; False if it was already there."""

    @abc.abstractmethod
    async def unsuppress(self, address: str, stream: str | None = None) -> int:
        """Lift a suppression (every stream when ``stream`` is None); returns rows removed."""

    @abc.abstractmethod
    async def list_suppressions(self, address: str | None = None,
                                limit: int = 100) -> list[Suppression]: ...

    @abc.abstractmethod
    async def suppressed_among(self, deliveries: Sequence[Delivery]) -> dict[int, str]:
        """Which of these deliveries go to a suppressed address (id -> reason)."""

    @abc.abstractmethod
    async def requeue_suppressed(self, address: str) -> list[int]:
        """After a suppression was lifted: send the deliveries it stopped (same key)."""

    # -- templates (rendered once at enqueue; see postlane.templates) ---------------------
    @abc.abstractmethod
    async def add_template_version(
        self, name: str, subject: str, text: str | None, html: str | None
    ) -> TemplateVersion:
        """Store the next version of template ``name`` (version 1 creates it). Versions are
        immutable; a name deleted earlier continues its numbering, never reuses it."""

    @abc.abstractmethod
    async def get_template(self, name: str, version: int | None = None) -> TemplateVersion | None:
        """One version of ``name`` (default: the latest); None if unknown or deleted."""

    @abc.abstractmethod
    async def list_templates(self) -> list[TemplateVersion]:
        """The latest version of every template that is not deleted, by name."""

    @abc.abstractmethod
    async def set_template_deprecated(self, name: str, deprecated: bool = True) -> bool:
        """Stop (or allow again) new enqueues from ``name``; False if it does not exist."""

    @abc.abstractmethod
    async def count_template_references(self, name: str) -> int:
        """Deliveries of ``name`` that may still be sent (pending, sending, ambiguous) or
        replayed (dead or expired with an open dead letter)."""

    @abc.abstractmethod
    async def delete_template_if_unreferenced(self, name: str) -> TemplateDeletion:
        """Delete every version of ``name`` unless deliveries still reference it (counted as
        in ``count_template_references``, under a lock that keeps enqueues out meanwhile)."""

    @abc.abstractmethod
    async def enqueue_many_if_template_usable(
        self, template: str, messages: Sequence[Message],
        progress: ImportProgress | None = None, *, validated: bool = False,
        producer: str | None = None,
    ) -> list[EnqueueResult]:
        """``enqueue_many`` of messages rendered from ``template``, in one transaction that
        first checks (and locks against delete and deprecate) that the template exists and is
        not deprecated; raises ``UnknownTemplate`` or ``TemplateDeprecated`` otherwise.

        With ``progress``, the import's counters are written in the same transaction:
        read, enqueued and skipped as given; created grows by the rows this call created.
        ``validated``: the caller already ran ``validate`` on each message with this store's
        limits (the import does, to skip bad rows), so it is not run twice.
        ``producer``: who writes (None: the application; ``import:<id>`` for an import);
        a key held by another producer or for other content raises ``KeyConflict``.
        """

    # -- bulk-import runs --------------------------------------------------------------------
    @abc.abstractmethod
    async def start_import(
        self, import_id: str, template: str, template_version: int, file_name: str, lane: str
    ) -> ImportRecord | None:
        """Record a run of an import (a first run, a re-run or a resume): counters reset,
        ``runs`` + 1. None when ``import_id`` already belongs to another template."""

    @abc.abstractmethod
    async def finish_import(self, progress: ImportProgress) -> None:
        """Write the run's final counters (created as counted so far) and its end time."""

    @abc.abstractmethod
    async def get_import(self, import_id: str) -> ImportRecord | None: ...

    @abc.abstractmethod
    async def list_imports(self, limit: int = 100) -> list[ImportRecord]:
        """Imports, most recently started first."""

    @abc.abstractmethod
    async def import_counts(self, import_id: str) -> ImportCounts:
        """What became of an import's deliveries, for the operator's four questions."""

    # -- the HTTP API: keys, and requests made idempotent by their body -------------------
    @abc.abstractmethod
    async def enqueue_request(
        self, message: Message, request_hash: str, producer: str
    ) -> tuple[EnqueueResult, str | None]:
        """``enqueue`` for an HTTP request by ``producer`` (``apikey:<id>``): a new delivery
        keeps ``request_hash`` (the hash of the request's canonical body), written in the
        same transaction. Returns the result and the hash kept with the delivery: this one
        when created, the first request's when this producer wrote the key before. A key
        written by another producer raises ``KeyConflict``; content is not compared here
        (the caller compares the request hashes)."""

    @abc.abstractmethod
    async def create_api_key(
        self, name: str, prefix: str, token_hash: str, scopes: Sequence[str]
    ) -> ApiKey:
        """Store a new key; only the hash of its token is kept."""

    @abc.abstractmethod
    async def get_api_key(
        self, *, key_id: int | None = None, token_hash: str | None = None
    ) -> ApiKey | None:
        """A key by id or by the hash of its token, revoked or not."""

    @abc.abstractmethod
    async def list_api_keys(self) -> list[ApiKey]:
        """Every key, revoked ones included, oldest first."""

    @abc.abstractmethod
    async def revoke_api_key(self, key_id: int) -> bool:
        """Revoke an active key; False when no active key has that id."""

    @abc.abstractmethod
    async def end_api_key_sessions(self, key_id: int, before: float) -> bool:
        """End the dashboard sessions of a key issued before ``before`` (unix seconds):
        signing out. False when no key has that id."""


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


# -- templates and bulk imports ------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TemplateVersion:
    """One immutable version of a template, and the state of its name."""

    name: str
    version: int
    subject: str
    text: str | None
    html: str | None
    created_at: datetime
    latest_version: int
    deprecated: bool


@dataclass(frozen=True, slots=True)
class TemplateDeletion:
    found: bool
    deleted: bool
    references: int
    """Deliveries that kept it from being deleted (0 when it was deleted)."""


TEMPLATE_REFERENCE_CONDITION = (
    "(d.state IN ('pending', 'sending', 'ambiguous') OR (d.state IN ('dead', 'expired') "
    "AND EXISTS (SELECT 1 FROM postlane_dead_letters dl WHERE dl.delivery_id = d.id "
    "AND dl.discarded_at IS NULL)))"
)
"""Deliveries (``d``) that keep their template from being deleted: they may still be sent
or replayed. Sent, cancelled, suppressed and discarded ones do not."""


@dataclass(frozen=True, slots=True)
class ImportProgress:
    """An import run's counters, written in each batch's transaction."""

    import_id: str
    rows_read: int
    rows_enqueued: int
    """Rows handed to the store: created now, or already there from an earlier run."""
    rows_skipped: int


@dataclass(frozen=True, slots=True)
class ImportRecord:
    import_id: str
    template: str
    template_version: int
    file_name: str
    lane: str
    runs: int
    started_at: datetime
    last_started_at: datetime
    finished_at: datetime | None
    rows_read: int
    rows_enqueued: int
    rows_created: int
    """Deliveries the latest run created (a re-run creates none: the keys exist)."""
    rows_skipped: int


IMPORT_COLUMNS = (
    "import_id, template, template_version, file_name, lane, runs, started_at, "
    "last_started_at, finished_at, rows_read, rows_enqueued, rows_created, rows_skipped"
)


@dataclass(frozen=True, slots=True)
class ImportCounts:
    """An import's deliveries by what happened to them."""

    states: dict[str, int]
    """Deliveries by state (every state present, zeros included)."""
    waiting_retry: int
    """Pending after at least one attempt: waiting for another."""
    oldest_waiting_age_s: float
    """Age since enqueue of the oldest delivery still pending (first try or retry)."""

    @property
    def created(self) -> int:
        return sum(self.states.values())

    def as_json(self) -> dict[str, Any]:
        return {
            "created": self.created,
            "claimed": self.states.get("sending", 0),
            "accepted": self.states.get("sent", 0),
            "queued": self.states.get("pending", 0) - self.waiting_retry,
            "waiting_retry": self.waiting_retry,
            "dead": self.states.get("dead", 0),
            "oldest_waiting_age_s": round(self.oldest_waiting_age_s, 3),
            "states": dict(self.states),
        }


def import_counts_from_rows(rows: Sequence[Sequence[Any]]) -> ImportCounts:
    """Build ``ImportCounts`` from rows of (state, retried, count, oldest age in seconds)."""
    states = {str(s): 0 for s in State}
    waiting_retry = 0
    oldest = 0.0
    for state, retried, count, age in rows:
        states[state] = states.get(state, 0) + int(count)
        if state == "pending":
            if retried:
                waiting_retry += int(count)
            oldest = max(oldest, float(age or 0.0))
    return ImportCounts(states, waiting_retry, max(0.0, oldest))


HELD_COLUMNS = (
    "id, idempotency_key, CASE WHEN producer IS NULL AND request_hash IS NOT NULL "
    f"THEN '{LEGACY_API}' ELSE producer END, channel, recipient, sender, subject, text_body, "
    "html_body, headers, template_id, template_version, import_id"
)
"""The fields of ``core.producers.Held``, in order, from ``postlane_deliveries`` (headers as
the engine returns them: a dict on PostgreSQL, JSON text on SQLite). A row the HTTP API
wrote before producers were recorded (migration 0006) reads as held by ``LEGACY_API``."""


def json_text(value: Mapping[str, Any]) -> str:
    """Headers or metadata as the JSON text both engines store; most are empty, and
    ``"{}"`` costs nothing to write on the bulk path."""
    return json.dumps(dict(value)) if value else "{}"


def enqueue_results(
    messages: Sequence[Message], created: Mapping[str, int], existing: Mapping[str, int]
) -> list[EnqueueResult]:
    """One result per message, in order, from the keys a batch created and those that
    existed; a key repeated in the batch is created once (the first time)."""
    results = []
    seen: set[str] = set()
    for message in messages:
        key = message.key
        if key in created and key not in seen:
            results.append(EnqueueResult(created[key], key, created=True))
        elif key in created or key in existing:
            results.append(EnqueueResult(created.get(key) or existing[key], key, created=False))
        else:
            raise StoreError(f"key {key!r} was neither inserted nor found; retry")
        seen.add(key)
    return results


def check_template_id(message: Message, template: str) -> None:
    """A message enqueued as rendered from ``template`` must say so, version included."""
    if message.template_id != template or message.template_version is None:
        raise InvalidMessage(
            f"message {message.key!r} was not rendered from template {template!r} "
            f"(template_id={message.template_id!r}, version={message.template_version!r})",
            field="template_id",
        )


@dataclass(frozen=True, slots=True)
class ApiKey:
    """An HTTP API key as stored: the SHA-256 of its token, never the token itself."""

    id: int
    name: str
    prefix: str
    """The token's first characters (``pl_AbCd1234``), to tell keys apart in a list."""
    scopes: tuple[str, ...]
    created_at: datetime
    revoked_at: datetime | None
    sessions_after: float | None = None
    """Dashboard sessions issued before this (unix seconds) are over: signed out."""

    @property
    def active(self) -> bool:
        return self.revoked_at is None
