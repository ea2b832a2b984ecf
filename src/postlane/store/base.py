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
import contextlib
import json
import json.encoder
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from postlane.core.causes import cause_of
from postlane.core.message import EnqueueResult, Message
from postlane.core.producers import LEGACY_API
from postlane.core.records import (
    MAX_RESPONSE_CHARS,
    STATUS_RANK,
    ApiKey,
    ChannelStats,
    Claim,
    Control,
    DeadLetter,
    DeadLetterFilter,
    DeliveryFilter,
    Event,
    ImportCounts,
    ImportProgress,
    ImportRecord,
    LaneStats,
    OutcomeMinute,
    ProviderEvent,
    ProviderEventResult,
    RescueResult,
    Stats,
    Suppression,
    TemplateDeletion,
    TemplateVersion,
    Transition,
    WorkerHeartbeat,
    WorkerSeen,
    bound_response,
    check_template_id,
    import_counts_from_rows,
)
from postlane.core.validation import Limits
from postlane.errors import StoreError
from postlane.store.roles import (
    ApiKeyStore,
    CallbackStore,
    FleetStore,
    ImportStore,
    OperatorStore,
    ProducerStore,
    ProviderEventStore,
    StoreLifecycle,
    TemplateStore,
    WorkerStore,
)

__all__ = [  # the records and roles are re-exported: older code imports them from here
    "DEAD_LETTER_COLUMNS",
    "DELIVERY_COLUMNS",
    "DELIVERY_ROWS",
    "HELD_COLUMNS",
    "HELD_FROM",
    "HINTS_AT",
    "IMPORT_COLUMNS",
    "MAX_RESPONSE_CHARS",
    "MESSAGE_COLUMNS",
    "STATUS_RANK",
    "TEMPLATE_REFERENCE_CONDITION",
    "ApiKey",
    "ApiKeyStore",
    "CallbackStore",
    "Claim",
    "Control",
    "DeadLetter",
    "DeadLetterFilter",
    "Event",
    "FleetStore",
    "ImportCounts",
    "ImportProgress",
    "ImportRecord",
    "ImportStore",
    "LaneStats",
    "OperatorStore",
    "OutcomeMinute",
    "ProducerStore",
    "ProviderEvent",
    "ProviderEventResult",
    "ProviderEventStore",
    "RescueResult",
    "Stats",
    "Store",
    "StoreLifecycle",
    "Suppression",
    "TemplateDeletion",
    "TemplateStore",
    "TemplateVersion",
    "Transition",
    "WorkerHeartbeat",
    "WorkerSeen",
    "WorkerStore",
    "bound_response",
    "check_template_id",
    "dead_letter_conditions",
    "dead_letter_counts",
    "delivery_conditions",
    "delivery_source",
    "enqueue_results",
    "find_conditions",
    "import_counts_from_rows",
    "json_text",
    "qualified_columns",
]

DELIVERY_COLUMNS: tuple[str, ...] = (
    "id", "idempotency_key", "lane", "channel", "recipient", "sender", "subject", "text_body",
    "html_body", "headers", "metadata", "import_id", "template_id", "template_version",
    "state", "attempts", "claims", "run_at", "expires_at", "lease_owner", "lease_expires_at",
    "attempt_started_at", "provider_message_id", "dead_reason", "last_error", "created_at",
    "updated_at", "sent_at", "finished_at",
)

HINTS_AT = len(DELIVERY_COLUMNS)
"""Where a claim's row continues past ``DELIVERY_COLUMNS`` with its two hints,
``may_be_suppressed`` and ``has_attachments`` (both engines' ``claimed_rows``)."""


MESSAGE_COLUMNS: frozenset[str] = frozenset({
    "idempotency_key", "recipient", "sender", "subject", "text_body", "html_body", "headers",
    "metadata", "template_id", "template_version", "producer", "request_hash",
})
"""The columns of ``postlane_messages`` (migration 0007): the message as enqueued, written
once. Every other column of ``DELIVERY_COLUMNS`` is on ``postlane_deliveries``, the narrow
table the worker's transitions rewrite."""

DELIVERY_ROWS = "postlane_delivery_rows"
"""The view joining the two, with every column a delivery had before 0007: what reads that
want the whole delivery select from."""


def qualified_columns(delivery: str, message: str) -> str:
    """``DELIVERY_COLUMNS`` as a select list over a join of ``postlane_deliveries`` (alias
    ``delivery``) and ``postlane_messages`` (alias ``message``)."""
    return ", ".join(f"{message if c in MESSAGE_COLUMNS else delivery}.{c}"
                     for c in DELIVERY_COLUMNS)


DEAD_LETTER_COLUMNS = (
    "dl.delivery_id, dl.reason, dl.snapshot, dl.last_response, dl.attempt_history, dl.dead_at, "
    "dl.replayed_at, dl.replayed_by, dl.discarded_at, dl.discard_reason, dl.replay_count, "
    "d.state, dl.cause"
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
    for name, column in (("reason", "dl.reason"), ("cause", "dl.cause"), ("lane", "d.lane"),
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


def dead_letter_counts(
    rows: Iterable[Sequence[Any]],
) -> tuple[dict[str, int], dict[str, int]]:
    """Open dead letters by reason and by cause, from rows of (reason, cause, count); an
    entry whose cause could not be named counts under its reason's (``core.causes``)."""
    by_reason: dict[str, int] = {}
    by_cause: dict[str, int] = {}
    for reason, cause, count in rows:
        by_reason[reason] = by_reason.get(reason, 0) + int(count)
        named = cause or str(cause_of(reason))
        by_cause[named] = by_cause.get(named, 0) + int(count)
    return by_reason, by_cause


CHANNEL_STATS = """
SELECT state, channel, count(*) FROM postlane_deliveries
WHERE state IN ('pending', 'sending') GROUP BY state, channel
UNION ALL
SELECT 'fallback', CASE WHEN sms_id IS NULL THEN 'no_sms' ELSE reason END, count(*)
FROM postlane_sms_fallbacks GROUP BY 2
"""
"""Both engines' ``channel_stats`` query (the same SQL on each)."""


def channel_stats(rows: Sequence[Sequence[Any]]) -> ChannelStats:
    pending = {str(r[1]): int(r[2]) for r in rows if r[0] == "pending"}
    sending = {str(r[1]): int(r[2]) for r in rows if r[0] == "sending"}
    fallbacks = {str(r[1]): int(r[2]) for r in rows if r[0] == "fallback"}
    return ChannelStats(pending, fallbacks, sending)


class Store(
    StoreLifecycle,
    ProducerStore,
    WorkerStore,
    OperatorStore,
    TemplateStore,
    ImportStore,
    ApiKeyStore,
    ProviderEventStore,
    CallbackStore,
    abc.ABC,
):
    """Every role of the store (``store.roles``) in one: what an engine implements and
    passes the conformance suite with. Engines: ``postgres``, ``sqlite``. Consumers name
    the roles they use instead."""

    engine: str

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()

    async def __aenter__(self) -> Store:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


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


def delivery_conditions(
    selection: DeliveryFilter, ph: Callable[[str], str], *, before: int | None = None,
    upto_id: int | None = None,
) -> tuple[str, dict[str, Any]]:
    """SQL conditions over ``postlane_deliveries`` for a selection (``DeliveryFilter``),
    and their params; ``ph`` renders a named placeholder for the engine. ``before``: ids
    below it (the next page, newest first); ``upto_id``: ids up to it (a bulk action acts
    on what its preview counted, never on what arrived since)."""
    conditions: list[str] = []
    params: dict[str, Any] = {}
    if selection.state == "queued":
        conditions.append("state = 'pending'")
    elif selection.state == "pending":
        conditions.append("state = 'pending' AND attempts = 0")
    elif selection.state == "retrying":
        conditions.append("state = 'pending' AND attempts > 0")
    elif selection.state is not None:
        conditions.append(f"state = {ph('state')}")
        params["state"] = selection.state
    for name, column in (("lane", "lane"), ("key", "idempotency_key"),
                         ("recipient", "recipient"), ("import_id", "import_id"),
                         ("template_id", "template_id")):
        value = getattr(selection, name)
        if value is not None:
            conditions.append(f"{column} = {ph(name)}")
            params[name] = value
    for name, op, bound in (("before", "<", before), ("upto_id", "<=", upto_id)):
        if bound is not None:
            conditions.append(f"id {op} {ph(name)}")
            params[name] = bound
    return (" AND ".join(conditions) or "1 = 1"), params


def delivery_source(selection: DeliveryFilter) -> str:
    """What ``delivery_conditions`` for ``selection`` read from: the narrow table alone
    while they name only its columns (counts by state or lane touch no message), else the
    view joining the message (key, recipient and template moved there in 0007)."""
    if any(getattr(selection, name) is not None for name in ("key", "recipient", "template_id")):
        return DELIVERY_ROWS
    return "postlane_deliveries"


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


HELD_COLUMNS = (
    "d.id, m.idempotency_key, CASE WHEN m.producer IS NULL AND m.request_hash IS NOT NULL "
    f"THEN '{LEGACY_API}' ELSE m.producer END, d.channel, m.recipient, m.sender, m.subject, "
    "m.text_body, m.html_body, m.headers, m.template_id, m.template_version, d.import_id"
)
HELD_FROM = "postlane_messages m JOIN postlane_deliveries d ON d.id = m.id"
"""What ``HELD_COLUMNS`` select from (looked up by ``m.idempotency_key``)."""
"""The fields of ``core.producers.Held``, in order, from ``HELD_FROM`` (headers as
the engine returns them: a dict on PostgreSQL, JSON text on SQLite). A row the HTTP API
wrote before producers were recorded (migration 0006) reads as held by ``LEGACY_API``."""

def json_text(value: Mapping[str, Any]) -> str:
    """Headers or metadata as the JSON text both engines store; most are empty, and
    ``"{}"`` costs nothing to write on the bulk path."""
    if not value:
        return "{}"
    if _ENCODE is not None and type(value) is dict:
        with contextlib.suppress(Exception):  # json.dumps raises it again, as it always did
            return "".join(_ENCODE(value, 0))
    return json.dumps(dict(value))


def _c_encoder() -> Callable[[Any, int], Any] | None:
    """``json.dumps`` with its defaults builds this C encoder anew on every call, a third of
    its time for a small object. Built once here, without the cycle check (a message's
    metadata passed validation's depth limit, and a cycle would still end in an error, then
    dumps'). None where CPython has no C encoder, or builds it differently: dumps then."""
    try:
        return json.encoder.c_make_encoder(  # type: ignore[attr-defined,no-any-return]
            None, json.JSONEncoder().default, json.encoder.encode_basestring_ascii, None,
            ": ", ", ", False, False, True)
    except TypeError:  # None (no _json module) or another signature
        return None


_ENCODE = _c_encoder()


def enqueue_results(
    messages: Sequence[Message], created: Mapping[str, int], existing: Mapping[str, int]
) -> list[EnqueueResult]:
    """One result per message, in order, from the keys a batch created and those that
    existed; a key repeated in the batch is created once (the first time)."""
    if not existing and len(created) == len(messages):
        # Every key new and none repeated (``created`` holds only the batch's keys): a bulk
        # batch's usual case, without the bookkeeping below.
        return [EnqueueResult(created[m.key], m.key, created=True) for m in messages]
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
