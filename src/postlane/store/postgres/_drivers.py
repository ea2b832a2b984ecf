"""The outbox on the PostgreSQL drivers other than psycopg 3: psycopg2 (sync) and asyncpg
(async). They run the psycopg 3 path's statements (``INSERT_ONE``, the key look-ups, the
template read), so the guarantees are the same: inside the caller's transaction, never a
commit, an existing key returns the existing delivery to its producer (the application:
these forms write no other) with the same content and is a ``KeyConflict`` otherwise (see
``core.producers``). Only the binding differs: psycopg2
takes the same ``%(name)s`` parameters, asyncpg numbered ``$n`` ones (``numbered``).

A batch is one ``INSERT ... SELECT FROM unnest(...)`` (neither driver has psycopg 3's COPY
of Python rows), with ids reserved in input order and the rows written in key order, as the
psycopg 3 bulk forms do and for the same reason: two batches sharing keys never wait for
each other in a cycle. Neither driver is a dependency: they are imported by the caller.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cache
from typing import Any

from postlane.core.message import EnqueueResult, Message
from postlane.core.producers import APPLICATION, Held, check_held, first_by_key, held_from_row
from postlane.core.records import TemplateVersion
from postlane.errors import StoreError
from postlane.store.attachments import INSERT_ASYNCPG, INSERT_PG, rows_for
from postlane.store.base import enqueue_results, json_text
from postlane.store.postgres._base import Q
from postlane.store.postgres._producing import INSERT_ONE

# The batch as parallel arrays, one per column, in ``insert_unnest``'s order (a test holds
# them to it).
_UNNEST_COLUMNS = (
    "id", "key", "lane", "channel", "recipient", "sender", "subject", "text", "html",
    "headers", "metadata", "import_id", "template_id", "template_version", "delay_s",
    "expires_at", "expires_in_s",
)
_NOT_VISIBLE = ("key {key!r} conflicts with a row this transaction cannot see (is it "
                "REPEATABLE READ or SERIALIZABLE?); retry the transaction")
_PARAMETER = re.compile(r"%\((\w+)\)s|%s")


@cache
def numbered(sql: str) -> tuple[str, tuple[str, ...]]:
    """``sql`` with its ``%(name)s`` (or ``%s``) parameters as asyncpg's ``$1, $2...``,
    and the names in that order (a name used twice is bound once)."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match[1] or str(len(names))
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"
    return _PARAMETER.sub(number, sql), tuple(names)


def _params(message: Message) -> dict[str, Any]:
    """``INSERT_ONE``'s parameters with the JSON columns as text (both drivers send text
    into a jsonb parameter; psycopg 3's are ``Jsonb`` wrappers)."""
    m = message
    return {
        "producer": APPLICATION,
        "key": m.key, "lane": m.lane, "channel": m.channel, "recipient": m.to,
        "sender": m.sender, "subject": m.subject, "text": m.text, "html": m.html,
        "headers": json_text(m.headers), "metadata": json_text(m.metadata),
        "import_id": m.import_id, "template_id": m.template_id,
        "template_version": m.template_version,
        "delay_s": m.delay.total_seconds() if m.delay else 0.0,
        "expires_at": m.expires_at,
        "expires_in_s": m.expires_in.total_seconds() if m.expires_in else None,
    }


def _batch(ids: dict[str, int], first: dict[str, Message]) -> dict[str, list[Any]]:
    """``insert_unnest``'s arrays, in key order."""
    rows = [{**_params(first[key]), "id": ids[key]} for key in sorted(first)]
    return {name: [row[name] for row in rows] for name in _UNNEST_COLUMNS}


def _held(rows: Sequence[Sequence[Any]]) -> list[Held]:
    return [held_from_row(row) for row in rows]


def _existing(messages: dict[str, Message], held: list[Held]) -> dict[str, int]:
    """The ids of keys found held, once the application may have each (``KeyConflict``)."""
    check_held(messages, APPLICATION, held)
    return {row.key: row.id for row in held}


# -- psycopg2 ------------------------------------------------------------------------------
def psycopg2_insert_one(conn: Any, message: Message) -> EnqueueResult:
    """Insert-or-find through a psycopg2 connection, in its transaction."""
    with conn.cursor() as cur:
        for _ in range(3):
            cur.execute(INSERT_ONE, _params(message))
            row = cur.fetchone()
            if row:
                result = EnqueueResult(row[0], message.key, created=True)
                if message.attachments:
                    cur.executemany(INSERT_PG, rows_for([message], [result]))
                return result
            cur.execute(Q["held_by_keys"], ([message.key],))
            held = _held(cur.fetchall())
            if held:
                _existing({message.key: message}, held)
                return EnqueueResult(held[0].id, message.key, created=False)
    raise StoreError(_NOT_VISIBLE.format(key=message.key))


def psycopg2_insert_many(conn: Any, messages: Sequence[Message]) -> list[EnqueueResult]:
    """The bulk form through psycopg2: three statements for the batch."""
    if not messages:
        return []
    first = first_by_key(messages)
    with conn.cursor() as cur:
        cur.execute(Q["reserve_ids"], (len(first),))
        ids = dict(zip(first, sorted(cur.fetchone()[1]), strict=True))
        cur.execute(Q["insert_unnest"], _batch(ids, first))
        created = {key: id_ for id_, key in cur.fetchall()}
        missing = [key for key in first if key not in created]
        existing: dict[str, int] = {}
        if missing:
            cur.execute(Q["held_by_keys"], (missing,))
            existing = _existing(first, _held(cur.fetchall()))
        results = enqueue_results(messages, created, existing)
        attachment_rows = rows_for(messages, results)
        if attachment_rows:
            cur.executemany(INSERT_PG, attachment_rows)
    return results


def psycopg2_template(conn: Any, name: str, version: int | None) -> TemplateVersion | None:
    """The template read (share-locked until the caller's transaction ends)."""
    with conn.cursor() as cur:
        cur.execute(Q["get_template_for_enqueue"], {"name": name, "version": version})
        row = cur.fetchone()
    return TemplateVersion(*row) if row else None


# -- asyncpg -------------------------------------------------------------------------------
async def _fetch(conn: Any, sql: str, params: dict[str, Any] | Sequence[Any]) -> list[Any]:
    statement, names = numbered(sql)
    args = [params[n] for n in names] if isinstance(params, dict) else list(params)
    return list(await conn.fetch(statement, *args))


async def asyncpg_insert_one(conn: Any, message: Message) -> EnqueueResult:
    """Insert-or-find through an asyncpg connection, in its transaction (outside one,
    asyncpg commits each statement: the delivery and its event are still one statement)."""
    for _ in range(3):
        rows = await _fetch(conn, INSERT_ONE, _params(message))
        if rows:
            result = EnqueueResult(rows[0][0], message.key, created=True)
            if message.attachments:
                await conn.executemany(INSERT_ASYNCPG, rows_for([message], [result]))
            return result
        held = _held(await _fetch(conn, Q["held_by_keys"], ([message.key],)))
        if held:
            _existing({message.key: message}, held)
            return EnqueueResult(held[0].id, message.key, created=False)
    raise StoreError(_NOT_VISIBLE.format(key=message.key))


async def asyncpg_insert_many(conn: Any, messages: Sequence[Message]) -> list[EnqueueResult]:
    """The bulk form through asyncpg; outside a transaction the batch brings its own."""
    if not messages:
        return []
    if not conn.is_in_transaction():
        async with conn.transaction():
            return await asyncpg_insert_many(conn, messages)
    first = first_by_key(messages)
    reserved = await _fetch(conn, Q["reserve_ids"], (len(first),))
    ids = dict(zip(first, sorted(reserved[0][1]), strict=True))
    created = {key: id_ for id_, key in await _fetch(conn, Q["insert_unnest"], _batch(ids, first))}
    missing = [key for key in first if key not in created]
    existing: dict[str, int] = {}
    if missing:
        existing = _existing(first, _held(await _fetch(conn, Q["held_by_keys"], (missing,))))
    results = enqueue_results(messages, created, existing)
    attachment_rows = rows_for(messages, results)
    if attachment_rows:
        await conn.executemany(INSERT_ASYNCPG, attachment_rows)
    return results


async def asyncpg_template(conn: Any, name: str, version: int | None) -> TemplateVersion | None:
    rows = await _fetch(conn, Q["get_template_for_enqueue"],
                        {"name": name, "version": version})
    return TemplateVersion(*rows[0]) if rows else None
