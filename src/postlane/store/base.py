"""The one seam between Postlane and its database.

Every engine implements ``Store``; every engine passes the same conformance suite
(``tests/integration/test_store_conformance.py``). Operations are named for what they
guard, River-style: a worker can only move a delivery it holds, and only out of
``sending``; nothing moves a delivery out of a terminal state.

The records the operations take and return live in ``postlane.core.records`` (re-exported
here for older imports); this module keeps the SQL fragments both engines share.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from postlane.core.message import Delivery, EnqueueResult, Message
from postlane.core.records import (  # re-exported: records used to live here
    MAX_RESPONSE_CHARS as MAX_RESPONSE_CHARS,
)
from postlane.core.records import (
    STATUS_RANK as STATUS_RANK,
)
from postlane.core.records import (
    ApiKey as ApiKey,
)
from postlane.core.records import (
    Claim as Claim,
)
from postlane.core.records import (
    Control as Control,
)
from postlane.core.records import (
    DeadLetter as DeadLetter,
)
from postlane.core.records import (
    DeadLetterFilter as DeadLetterFilter,
)
from postlane.core.records import (
    Event as Event,
)
from postlane.core.records import (
    ImportCounts as ImportCounts,
)
from postlane.core.records import (
    ImportProgress as ImportProgress,
)
from postlane.core.records import (
    ImportRecord as ImportRecord,
)
from postlane.core.records import (
    LaneStats as LaneStats,
)
from postlane.core.records import (
    ProviderEvent as ProviderEvent,
)
from postlane.core.records import (
    ProviderEventResult as ProviderEventResult,
)
from postlane.core.records import (
    RescueResult as RescueResult,
)
from postlane.core.records import (
    Stats as Stats,
)
from postlane.core.records import (
    Suppression as Suppression,
)
from postlane.core.records import (
    TemplateDeletion as TemplateDeletion,
)
from postlane.core.records import (
    TemplateVersion as TemplateVersion,
)
from postlane.core.records import (
    Transition as Transition,
)
from postlane.core.records import (
    bound_response as bound_response,
)
from postlane.core.records import (
    check_template_id as check_template_id,
)
from postlane.core.records import (
    import_counts_from_rows as import_counts_from_rows,
)
from postlane.core.records import (
    suppression_for as suppression_for,
)
from postlane.core.validation import Limits
from postlane.errors import StoreError

DELIVERY_COLUMNS: tuple[str, ...] = (
    "id", "idempotency_key", "lane", "channel", "recipient", "sender", "subject", "text_body",
    "html_body", "headers", "metadata", "import_id", "template_id", "template_version",
    "state", "attempts", "claims", "run_at", "expires_at", "lease_owner", "lease_expires_at",
    "attempt_started_at", "provider_message_id", "dead_reason", "last_error", "created_at",
    "updated_at", "sent_at", "finished_at",
)


DEAD_LETTER_COLUMNS = (
    "dl.delivery_id, dl.reason, dl.snapshot, dl.last_response, dl.attempt_history, dl.dead_at, "
    "dl.replayed_at, dl.replayed_by, dl.discarded_at, dl.discard_reason, dl.replay_count, "
    "d.state"
)


def dead_letter_conditions(selection: DeadLetterFilter, ph: Callable[[str], str],
                           when: Callable[[datetime], Any]) -> tuple[str, dict[str, Any]]:
    """SQL conditions over ``dl`` (dead letters) and ``d`` (deliveries) for a triage
    selection, and their params. ``ph`` renders a named placeholder for the engine;
    ``when`` converts a time."""
    conditions: list[str] = []
    params: dict[str, Any] = {}
    if not selection.include_closed:
        conditions.append("dl.discarded_at IS NULL AND d.state IN ('dead', 'expired')")
    for name, column in (("reason", "dl.reason"), ("lane", "d.lane"),
                         ("template_id", "d.template_id"), ("import_id", "d.import_id")):
        value = getattr(selection, name)
        if value is not None:
            conditions.append(f"{column} = {ph(name)}")
            params[name] = value
    if selection.since is not None:
        conditions.append(f"dl.dead_at >= {ph('since')}")
        params["since"] = when(selection.since)
    if selection.until is not None:
        conditions.append(f"dl.dead_at < {ph('until')}")
        params["until"] = when(selection.until)
    if selection.replayed is not None:
        conditions.append("dl.replay_count > 0" if selection.replayed else "dl.replay_count = 0")
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
    ) -> list[EnqueueResult]:
        """``enqueue_many`` of messages rendered from ``template``, in one transaction that
        first checks (and locks against delete and deprecate) that the template exists and is
        not deprecated; raises ``UnknownTemplate`` or ``TemplateDeprecated`` otherwise.

        With ``progress``, the import's counters are written in the same transaction:
        read, enqueued and skipped as given; created grows by the rows this call created.
        ``validated``: the caller already ran ``validate`` on each message with this store's
        limits (the import does, to skip bad rows), so it is not run twice.
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
        self, message: Message, request_hash: str
    ) -> tuple[EnqueueResult, str | None]:
        """``enqueue`` for an HTTP request: a new delivery keeps ``request_hash`` (the hash of
        the request's canonical body), written in the same transaction. Returns the result
        and the hash kept with the delivery: this one when created, the first request's when
        the key existed, None when the key was enqueued another way (outbox, CLI)."""

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


TEMPLATE_REFERENCE_CONDITION = (
    "(d.state IN ('pending', 'sending', 'ambiguous') OR (d.state IN ('dead', 'expired') "
    "AND EXISTS (SELECT 1 FROM postlane_dead_letters dl WHERE dl.delivery_id = d.id "
    "AND dl.discarded_at IS NULL)))"
)
"""Deliveries (``d``) that keep their template from being deleted: they may still be sent
or replayed. Sent, cancelled, suppressed and discarded ones do not."""


IMPORT_COLUMNS = (
    "import_id, template, template_version, file_name, lane, runs, started_at, "
    "last_started_at, finished_at, rows_read, rows_enqueued, rows_created, rows_skipped"
)


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
