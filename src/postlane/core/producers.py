"""Who wrote a key: a key belongs to its producer (design contract 14).

An idempotency key names one business event of one producer. Before this rule, the first
writer of a key won: a send-only API client that wrote ``reset:4242`` first made the
application's later ``postlane.enqueue`` of that key return ``created=False``, and the
client's recipient and content went out instead of the real reset. Now every delivery
records its producer, and an enqueue that finds its key already written

- by another producer, or
- by the same producer with other content (recipient, sender, subject, bodies, headers,
  channel, template),

raises ``KeyConflict`` instead of answering with the delivery it did not write. Only the
same producer enqueueing the same content again gets ``created=False`` (a retry).

Producers (the ``producer`` column):

- ``None``: the application, through the library (``postlane.enqueue`` and its forms,
  ``Store.enqueue``, ``enqueue_template``) or ``postlane enqueue``: whoever holds the
  database;
- ``apikey:<id>``: a client of the HTTP API, by its API key's id;
- ``import:<import id>``: a bulk import run (CLI or upload); a re-run or resume of the
  same import is the same producer;
- ``sms-fallback``: the worker's housekeeping, writing an email's SMS fallback
  (``sms-fallback:<email key>``, see ``core.fallback``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from postlane.core.message import Message
from postlane.errors import KeyConflict

APPLICATION: str | None = None
FALLBACK_PRODUCER = "sms-fallback"
LEGACY_API = "apikey:?"
"""A delivery the HTTP API wrote before producers were recorded (migration 0006): its key
is known only by its request hash."""


def api_producer(key_id: int) -> str:
    return f"apikey:{key_id}"


def import_producer(import_id: str) -> str:
    return f"import:{import_id}"


def describe(producer: str | None) -> str:
    """A producer as an error message names it."""
    if producer is None:
        return "the application (outbox or CLI)"
    if producer == LEGACY_API:
        return "an HTTP API client"
    if producer.startswith("apikey:"):
        return f"HTTP API key #{producer.removeprefix('apikey:')}"
    if producer == FALLBACK_PRODUCER:
        return "the SMS fallback of an email"
    if producer.startswith("import:"):
        return f"import {producer.removeprefix('import:')!r}"
    return producer


@dataclass(frozen=True, slots=True)
class Held:
    """What an existing delivery's key is held by, and the content it will send."""

    id: int
    key: str
    producer: str | None
    channel: str
    recipient: str
    sender: str | None
    subject: str
    text: str | None
    html: str | None
    headers: Mapping[str, Any]
    template_id: str | None
    template_version: int | None
    import_id: str | None = None



def held_from_row(row: Sequence[Any]) -> Held:
    """A ``Held`` from a row of ``store.base.HELD_COLUMNS``. Headers come as a dict or as
    JSON text, by engine and driver (SQLite, asyncpg, and psycopg under Django, which
    loads jsonb as text itself)."""
    values = list(row)
    if isinstance(values[9], str | bytes):
        values[9] = json.loads(values[9]) if values[9] else {}
    return Held(*values)


def same_content(message: Message, held: Held) -> bool:
    """Would ``message`` send what ``held`` will? Two renderings of one template at
    different versions are the same message (a template changed between a first run and a
    re-run or retry); then only the envelope (recipient, sender, channel) is compared."""
    envelope = (message.channel, message.to, message.sender, message.template_id) == (
        held.channel, held.recipient, held.sender, held.template_id)
    if not envelope:
        return False
    if message.template_id is not None and message.template_version != held.template_version:
        return True
    return ((message.subject, message.text, message.html, dict(message.headers))
            == (held.subject, held.text, held.html, dict(held.headers)))


def conflict_reason(message: Message, producer: str | None, held: Held,
                    *, compare_content: bool = True) -> str | None:
    """Why ``producer`` may not have ``held``'s key for ``message``; None when it may.

    ``compare_content=False``: the caller checks content its own way (the HTTP API compares
    the hash of the whole request body, and answers a mismatch with its own problem)."""
    if held.producer != producer and not _written_before_producers(held, producer):
        return (f"key {held.key!r} belongs to delivery {held.id}, written by "
                f"{describe(held.producer)}; {describe(producer)} cannot use it: derive "
                "keys from your own business events, with a prefix of your own")
    if compare_content and not same_content(message, held):
        return (f"key {held.key!r} was already used for delivery {held.id} with other "
                "content (recipient, sender, subject, body, headers or template); a key "
                "names one message: derive a new key from the new business event")
    return None


def _written_before_producers(held: Held, producer: str | None) -> bool:
    """An import run before migration 0006 left its rows without a producer (as the
    application's): a re-run or resume of that import (``import:<its id>``) may have them."""
    return (held.producer is None and producer is not None and held.import_id is not None
            and producer == import_producer(held.import_id))


def check_held(messages: Mapping[str, Message], producer: str | None,
               held: Sequence[Held], *, compare_content: bool = True) -> None:
    """Raise ``KeyConflict`` naming every key of ``held`` that ``producer`` may not have
    for its message in ``messages`` (by key)."""
    conflicts = []
    for row in held:
        reason = conflict_reason(messages[row.key], producer, row,
                                 compare_content=compare_content)
        if reason is not None:
            conflicts.append((row.key, row.id, reason))
    if conflicts:
        raise KeyConflict.of(conflicts)


def first_by_key(messages: Sequence[Message]) -> dict[str, Message]:
    """Each key's first message, in input order. A repeat of a key within one batch is
    reported with the first one's result, never written; a repeat with other content is a
    ``KeyConflict`` (delivery id 0: nothing was written yet)."""
    first: dict[str, Message] = {}
    conflicts = []
    for message in messages:
        seen = first.setdefault(message.key, message)
        if seen is not message and not _same_message_content(seen, message):
            conflicts.append((message.key, 0, f"key {message.key!r} appears twice in the "
                                              "batch with different content"))
    if conflicts:
        raise KeyConflict.of(conflicts)
    return first


def _same_message_content(a: Message, b: Message) -> bool:
    return same_content(b, Held(
        0, a.key, None, a.channel, a.to, a.sender, a.subject, a.text, a.html, a.headers,
        a.template_id, a.template_version))
