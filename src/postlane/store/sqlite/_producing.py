"""Producing on SQLite: enqueueing one message or a batch, alone or in a caller's transaction."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from postlane.core.message import EnqueueResult, Message
from postlane.core.producers import Held, check_held, first_by_key, held_from_row
from postlane.core.validation import validate
from postlane.errors import StoreError
from postlane.store.attachments import INSERT_SQLITE, rows_for
from postlane.store.base import enqueue_results, json_text
from postlane.store.migrations import not_migrated
from postlane.store.sqlite._base import Q, SQLiteEngine


def message_params(message: Message, producer: str | None = None) -> dict[str, Any]:
    return {
        "producer": producer,
        "key": message.key,
        "lane": message.lane,
        "channel": message.channel,
        "recipient": message.to,
        "sender": message.sender,
        "subject": message.subject,
        "text": message.text,
        "html": message.html,
        "headers": json_text(message.headers),
        "metadata": json_text(message.metadata),
        "import_id": message.import_id,
        "template_id": message.template_id,
        "template_version": message.template_version,
        "delay_s": message.delay.total_seconds() if message.delay else 0.0,
        "expires_at": message.expires_at.timestamp() if message.expires_at else None,
        "expires_in_s": message.expires_in.total_seconds() if message.expires_in else None,
    }


@contextmanager
def migrated() -> Iterator[None]:
    """Turn "no such table" from an unmigrated database into ``MigrationRequired``."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        if "no such table: postlane_" in str(exc):
            raise not_migrated() from exc
        raise


@migrated()
def insert_one(conn: sqlite3.Connection, message: Message, producer: str | None = None,
               *, compare_content: bool = True) -> EnqueueResult:
    """Insert-or-find in whatever transaction ``conn`` is in (shared with the outbox).
    A key held by another producer, or by ``producer`` for other content, raises
    ``KeyConflict`` (see ``core.producers``)."""
    params = message_params(message, producer)
    row = conn.execute(Q["insert_message"], params).fetchone()
    if row is not None:
        conn.execute(Q["insert_delivery"], {**params, "id": row[0]})
        result = EnqueueResult(row[0], message.key, created=True)
        if message.attachments:
            write_attachments(conn, [message], [result])
        return result
    held = held_by_keys(conn, [message.key])
    if not held:  # pragma: no cover - SQLite serialises writers, so the winner is visible
        raise StoreError(f"key {message.key!r} conflicts but no row is visible")
    check_held({message.key: message}, producer, held, compare_content=compare_content)
    return EnqueueResult(held[0].id, message.key, created=False)


def held_by_keys(conn: sqlite3.Connection, keys: Sequence[str]) -> list[Held]:
    """The existing deliveries of ``keys``: who holds each and what it will send."""
    rows = conn.execute(Q["held_by_keys"], (json.dumps(list(keys)),)).fetchall()
    return [held_from_row(row) for row in rows]


def _delivery_row(id_: int, m: Message) -> tuple[Any, ...]:
    return (id_, m.lane, m.channel, m.import_id, m.delay.total_seconds() if m.delay else 0.0,
            m.expires_at.timestamp() if m.expires_at else None,
            m.expires_in.total_seconds() if m.expires_in else None)


def _batch_row(m: Message) -> tuple[Any, ...]:
    return (m.key, m.to, m.sender, m.subject, m.text, m.html, json_text(m.headers),
            json_text(m.metadata), m.template_id, m.template_version)


@migrated()
def insert_many(conn: sqlite3.Connection, messages: Sequence[Message],
                producer: str | None = None) -> list[EnqueueResult]:
    """Insert-or-find a batch in whatever transaction ``conn`` is in: one INSERT for the
    messages, one for their deliveries (no event rows: the timeline's "enqueued" entry is
    the delivery's ``created_at``), one look-up for the keys that existed already (each
    checked as ``insert_one`` does: ``KeyConflict`` names every key ``producer`` may not
    have)."""
    if not messages:
        return []
    first = first_by_key(messages)
    created = dict((key, id_) for id_, key in conn.execute(
        Q["insert_messages"], {"batch": json.dumps([_batch_row(m) for m in messages]),
                       "producer": producer}))
    if created:
        conn.execute(Q["insert_deliveries"], {"rows": json.dumps(
            [_delivery_row(id_, first[key]) for key, id_ in created.items()])})
    existing: dict[str, int] = {}
    missing = [key for key in first if key not in created]
    if missing:
        held = held_by_keys(conn, missing)
        check_held(first, producer, held)
        existing = {row.key: row.id for row in held}
    results = enqueue_results(messages, created, existing)
    write_attachments(conn, messages, results)
    return results


def write_attachments(conn: sqlite3.Connection, messages: Sequence[Message],
                      results: Sequence[EnqueueResult]) -> None:
    """The parts of the deliveries just created, in the same transaction."""
    rows = rows_for(messages, results)
    if rows:
        conn.cursor().executemany(INSERT_SQLITE, rows)


class ProducingMixin(SQLiteEngine):
    # -- producing -------------------------------------------------------------------------
    def enqueue(self, message: Message) -> EnqueueResult:
        validate(message, self.limits)
        with self._write() as conn:
            result = insert_one(conn, message)
        self.wake()
        return result

    def enqueue_many(self, messages: Sequence[Message]) -> list[EnqueueResult]:
        for message in messages:
            validate(message, self.limits)
        with self._write() as conn:
            results = insert_many(conn, messages)
        self.wake()
        return results
