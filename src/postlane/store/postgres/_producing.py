"""Producing: enqueue one message or a batch, through the store's pool or inside whatever
transaction a caller's connection is in (the outbox)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from datetime import datetime
from operator import attrgetter
from typing import Any, NamedTuple

import psycopg
from psycopg.rows import tuple_row
from psycopg.types.json import Jsonb

from postlane.core.message import EnqueueResult, Message
from postlane.core.producers import Held, check_held, first_by_key, held_from_row
from postlane.core.validation import validate
from postlane.errors import StoreError
from postlane.store.attachments import INSERT_PG, rows_for
from postlane.store.base import enqueue_results, json_text
from postlane.store.migrations import not_migrated
from postlane.store.postgres._base import PostgresBase, Q

INSERT_ONE = Q["insert_one"].replace("__ID__", Q["next_delivery_id"])
"""Insert-or-find one message (the outbox's statement, on every driver)."""
# The synchronous bulk form's insert: INSERT_ONE with an id reserved in input order.
_INSERT_ONE_WITH_ID = Q["insert_one"].replace("__ID__", "%(id)s")


def message_params(message: Message, producer: str | None = None) -> dict[str, Any]:
    """Bind parameters of ``INSERT_ONE`` for a validated message."""
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
        "headers": Jsonb(dict(message.headers)),
        "metadata": Jsonb(dict(message.metadata)),
        "import_id": message.import_id,
        "template_id": message.template_id,
        "template_version": message.template_version,
        "delay_s": message.delay.total_seconds() if message.delay else 0.0,
        "expires_at": message.expires_at,
        "expires_in_s": message.expires_in.total_seconds() if message.expires_in else None,
    }


def _row(id_: int, m: Message, now: datetime, producer: str | None) -> tuple[Any, ...]:
    """A row of ``copy_staging``'s columns; ``now`` is the transaction's ``now()``."""
    return (
        id_, m.key, m.to, m.sender, m.subject, m.text, m.html, json_text(m.headers),
        json_text(m.metadata), m.template_id, m.template_version, producer,
        m.lane, m.channel, m.import_id, _run_at(m, now), _expires_at(m, now),
    )


def _run_at(m: Message, now: datetime) -> datetime:
    return now + m.delay if m.delay else now


def _expires_at(m: Message, now: datetime) -> datetime | None:
    return m.expires_at or (now + m.expires_in if m.expires_in else None)


# The columns of ``copy_messages`` a batch may leave out, and the field each is read from.
_OPTIONAL_TEXT = (("sender", attrgetter("sender")), ("text_body", attrgetter("text")),
                  ("html_body", attrgetter("html")), ("template_id", attrgetter("template_id")),
                  ("template_version", attrgetter("template_version")))


def _message_rows(ids: list[int], batch: Sequence[Message], producer: str | None
                  ) -> tuple[str, list[tuple[Any, ...]]]:
    """``copy_messages``' COLUMNS and rows for ``batch`` (in key order, ``ids`` beside it).

    Built a column at a time (comprehensions and ``list.count`` run in C, a function per
    row would not), then zipped into rows: a bulk import's messages mostly leave the same
    fields unset, and a column no message sets is not written at all."""
    n = len(batch)
    names = ["id", "idempotency_key", "recipient", "subject"]
    columns: list[Sequence[Any]] = [ids, [m.key for m in batch], [m.to for m in batch],
                                    [m.subject for m in batch]]
    for name, field in _OPTIONAL_TEXT:
        values = list(map(field, batch))
        if values.count(None) != n:
            names.append(name)
            columns.append(values)
    for name, mappings in (("headers", [m.headers for m in batch]),
                           ("metadata", [m.metadata for m in batch])):
        if any(mappings):
            names.append(name)
            columns.append([json_text(value) for value in mappings])
    if producer is not None:
        names.append("producer")
        columns.append([producer] * n)
    return ", ".join(names), list(zip(*columns, strict=True))


def _delivery_params(ids: list[int], batch: Sequence[Message], now: datetime
                     ) -> dict[str, Any]:
    """``insert_deliveries``' parameters: an array per column, or None where one value (a
    scalar then) or the default does for every row."""
    n = len(batch)
    params: dict[str, Any] = {"ids": ids}
    for scalar, array, values in (("lane", "lanes", [m.lane for m in batch]),
                                  ("channel", "channels", [m.channel for m in batch])):
        if values.count(values[0]) == n:
            params[scalar], params[array] = values[0], None
        else:
            params[scalar], params[array] = None, values
    import_ids = [m.import_id for m in batch]
    params["import_ids"] = None if import_ids.count(None) == n else import_ids
    delays = [m.delay for m in batch]
    params["run_at"] = (None if not any(delays)
                        else [_run_at(m, now) for m in batch])
    expiry = [m.expires_at or m.expires_in for m in batch]
    params["expires_at"] = (None if expiry.count(None) == n
                            else [_expires_at(m, now) for m in batch])
    return params


@contextlib.contextmanager
def migrated() -> Iterator[None]:
    """Turn ``UndefinedTable`` from an unmigrated database into ``MigrationRequired``."""
    try:
        yield
    except psycopg.errors.UndefinedTable as exc:
        raise not_migrated() from exc


@contextlib.asynccontextmanager
async def migrated_async() -> AsyncIterator[None]:
    """``migrated`` for a coroutine function."""
    with migrated():
        yield


class ProducingMixin(PostgresBase):
    # -- producing -------------------------------------------------------------------------
    async def enqueue(self, message: Message) -> EnqueueResult:
        validate(message, self.limits)
        async with self._pool.connection() as conn:
            result = await enqueue_on_connection(conn, message)
        self._wakeup.set()
        return result

    async def enqueue_many(self, messages: Sequence[Message]) -> list[EnqueueResult]:
        for message in messages:
            validate(message, self.limits)
        if not messages:
            return []
        async with self._pool.connection() as conn:
            results = await enqueue_many_on_connection(conn, messages)
        self._wakeup.set()
        return results


@migrated_async()
async def enqueue_on_connection(
    conn: psycopg.AsyncConnection[Any], message: Message, producer: str | None = None,
    *, compare_content: bool = True,
) -> EnqueueResult:
    """Insert-or-find inside whatever transaction ``conn`` is in (the outbox's core). A key
    held by another producer, or by ``producer`` for other content (unless
    ``compare_content`` is off), raises ``KeyConflict`` (see ``core.producers``)."""
    async with conn.cursor(row_factory=tuple_row) as cur:
        for _ in range(3):
            await cur.execute(INSERT_ONE, message_params(message, producer))
            row = await cur.fetchone()
            if row:
                result = EnqueueResult(row[0], message.key, created=True)
                if message.attachments:
                    await cur.executemany(INSERT_PG, rows_for([message], [result]))
                return result
            # The key exists; under READ COMMITTED a fresh statement sees the winner's row.
            await cur.execute(Q["held_by_keys"], ([message.key],))
            held = [held_from_row(r) for r in await cur.fetchall()]
            if held:
                check_held({message.key: message}, producer, held,
                           compare_content=compare_content)
                return EnqueueResult(held[0].id, message.key, created=False)
    raise StoreError(
        f"key {message.key!r} conflicts with a row this transaction cannot see "
        "(is it REPEATABLE READ or SERIALIZABLE?); retry the transaction"
    )


@migrated_async()
async def enqueue_many_on_connection(
    conn: psycopg.AsyncConnection[Any], messages: Sequence[Message],
    producer: str | None = None,
) -> list[EnqueueResult]:
    """Insert-or-find a batch inside whatever transaction ``conn`` is in.

    The fast way COPYs the new messages straight into their table, with ids reserved from
    the deliveries' sequence (in input order, so "oldest first" is the caller's order), then
    writes their deliveries in one statement (``insert_deliveries``).
    A key that exists already (or that a concurrent transaction commits meanwhile) makes
    that COPY fail on the unique key, and the batch goes the slower insert-or-find way
    (:func:`_insert_or_find`): on an autocommit connection (the store's own) in a
    ``transaction()`` of its own after the fast one rolled back (both are savepoints when
    the caller holds a ``transaction()`` open, as a template's enqueue does), inside a
    caller's transaction after rolling back to a savepoint (which costs two round trips a
    batch, so only a transaction that must survive the conflict takes one). A batch that
    conflicts on its first row (a re-run import) fails at once, so the wasted work is a
    round trip or two.

    Both ways write the rows in key order (code points, ``COLLATE "C"``): two batches that
    share keys then wait for each other's uncommitted keys in one order, never in a cycle.
    In input order they deadlocked (the enqueue stress test found it).

    Keys that existed are checked as in :func:`enqueue_on_connection`: ``KeyConflict``
    names every one ``producer`` may not have.
    """
    first = first_by_key(messages)
    if conn.autocommit:  # the store's own connection
        with contextlib.suppress(psycopg.errors.UniqueViolation):
            async with conn.transaction(), conn.cursor() as cur:
                return await _write_new(conn, cur, messages, first, producer,
                                        await _reserve(cur, first))
        async with conn.transaction(), conn.cursor() as cur:
            return await _write_found(cur, messages, first, producer,
                                      await _reserve(cur, first))
    async with conn.cursor() as cur:
        # The first statement begins the caller's transaction if it has not begun yet (a
        # psycopg ``transaction()`` would BEGIN and COMMIT it, committing the caller's
        # business write early), so the savepoint below nests in it.
        reserved = await _reserve(cur, first)
        try:
            async with conn.transaction():  # a savepoint: a conflict rolls back to here
                return await _write_new(conn, cur, messages, first, producer, reserved)
        except psycopg.errors.UniqueViolation:
            return await _write_found(cur, messages, first, producer, reserved)


class _Reserved(NamedTuple):
    """A batch's ids, taken in input order, and its rows in key order."""

    now: datetime
    ids: dict[str, int]
    batch: list[Message]
    """Each key's first message, in key order."""
    key_ids: list[int]
    """Their ids, beside them."""


async def _reserve(cur: psycopg.AsyncCursor[Any], first: dict[str, Message]) -> _Reserved:
    await cur.execute(Q["reserve_ids"], (len(first),))
    row = await cur.fetchone()
    assert row is not None
    now, reserved = row
    ids = dict(zip(first, sorted(reserved), strict=True))
    keys = sorted(first)
    return _Reserved(now, ids, [first[key] for key in keys], [ids[key] for key in keys])


async def _write_new(conn: psycopg.AsyncConnection[Any], cur: psycopg.AsyncCursor[Any],
                     messages: Sequence[Message], first: dict[str, Message],
                     producer: str | None, r: _Reserved) -> list[EnqueueResult]:
    """The fast way: every key new, or ``UniqueViolation``."""
    columns, rows = _message_rows(r.key_ids, r.batch, producer)
    await _copy(cur, Q["copy_messages"].replace("__COLUMNS__", columns), rows)
    params = _delivery_params(r.key_ids, r.batch, r.now)
    # Pipelined where libpq can: the statement is sent at once, and the server writes the
    # deliveries while this process lays out the results, on the other core.
    async with (conn.pipeline() if psycopg.AsyncPipeline.is_supported()
                else contextlib.nullcontext()):
        await cur.execute(Q["insert_deliveries"], params)
        results = enqueue_results(messages, r.ids, {})
    await _write_attachments(cur, messages, results)
    return results


async def _write_found(cur: psycopg.AsyncCursor[Any], messages: Sequence[Message],
                       first: dict[str, Message], producer: str | None, r: _Reserved
                       ) -> list[EnqueueResult]:
    """The insert-or-find way, for a batch some of whose keys exist."""
    rows = [_row(id_, m, r.now, producer) for id_, m in zip(r.key_ids, r.batch, strict=True)]
    created, held = await _insert_or_find(cur, rows)
    check_held(first, producer, held)
    results = enqueue_results(messages, created, {row.key: row.id for row in held})
    await _write_attachments(cur, messages, results)
    return results


async def _write_attachments(cur: psycopg.AsyncCursor[Any], messages: Sequence[Message],
                             results: list[EnqueueResult]) -> None:
    attachment_rows = rows_for(messages, results)
    if attachment_rows:
        await cur.executemany(INSERT_PG, attachment_rows)


async def _copy(cur: psycopg.AsyncCursor[Any], statement: str,
                rows: Iterable[tuple[Any, ...]]) -> None:
    async with cur.copy(statement) as copy:
        for row in rows:
            await copy.write_row(row)


async def _insert_or_find(
    cur: psycopg.AsyncCursor[Any], rows: Sequence[tuple[Any, ...]]
) -> tuple[dict[str, int], list[Held]]:
    """COPY into a staging table, then one INSERT ... ON CONFLICT DO NOTHING: safe against
    concurrent enqueuers of the same keys, at about half the speed of the direct COPY.
    Returns the keys it created, with their ids, and the deliveries of those that existed."""
    await cur.execute(Q["create_staging"])
    await _copy(cur, Q["copy_staging"], rows)
    await cur.execute(Q["insert_staged"])
    created = {key: id_ for id_, key in await cur.fetchall()}
    await cur.execute(Q["drop_staging"])
    missing = [row[1] for row in rows if row[1] not in created]
    held: list[Held] = []
    if missing:
        await cur.execute(Q["held_by_keys"], (missing,))
        held = [held_from_row(r) for r in await cur.fetchall()]
    return created, held


# -- the same for a synchronous psycopg connection (the outbox's ``enqueue``) ------------------
@migrated()
def enqueue_on_sync_connection(conn: psycopg.Connection[Any], message: Message,
                               producer: str | None = None) -> EnqueueResult:
    """``enqueue_on_connection`` for a synchronous psycopg connection."""
    with conn.cursor() as cur:
        for _ in range(3):
            cur.execute(INSERT_ONE, message_params(message, producer))
            row = cur.fetchone()
            if row:
                result = EnqueueResult(row[0], message.key, created=True)
                if message.attachments:
                    cur.executemany(INSERT_PG, rows_for([message], [result]))
                return result
            cur.execute(Q["held_by_keys"], ([message.key],))
            held = [held_from_row(r) for r in cur.fetchall()]
            if held:
                check_held({message.key: message}, producer, held)
                return EnqueueResult(held[0].id, message.key, created=False)
    raise StoreError(
        f"key {message.key!r} conflicts with a row this transaction cannot see "
        "(is it REPEATABLE READ or SERIALIZABLE?); retry the transaction"
    )


@migrated()
def enqueue_many_on_sync_connection(
    conn: psycopg.Connection[Any], messages: Sequence[Message], producer: str | None = None
) -> list[EnqueueResult]:
    """The bulk form for a synchronous psycopg connection: pipelined insert-or-find (one
    round trip for the batch), with ids reserved in input order and the keys taken in key
    order, as :func:`enqueue_many_on_connection` does and for the same reason (two batches
    sharing keys never wait for each other in a cycle)."""
    first = first_by_key(messages)
    keys = sorted(first)
    with conn.cursor() as cur:
        cur.execute(Q["reserve_ids"], (len(first),))
        row = cur.fetchone()
        assert row is not None
        ids = dict(zip(first, sorted(row[1]), strict=True))
        cur.executemany(_INSERT_ONE_WITH_ID,
                        [{**message_params(first[key], producer), "id": ids[key]}
                         for key in keys],
                        returning=True)
        created: dict[str, int] = {}
        for key in keys:
            inserted = cur.fetchone()
            if inserted:
                created[key] = inserted[0]
            cur.nextset()
        missing = [key for key in keys if key not in created]
        existing: dict[str, int] = {}
        if missing:
            cur.execute(Q["held_by_keys"], (missing,))
            held = [held_from_row(r) for r in cur.fetchall()]
            check_held(first, producer, held)
            existing = {row.key: row.id for row in held}
        results = enqueue_results(messages, created, existing)
        attachment_rows = rows_for(messages, results)
        if attachment_rows:
            cur.executemany(INSERT_PG, attachment_rows)
    return results
