"""The attachment side table (``postlane_attachments``, migration 0013), for both engines.

A delivery's parts are written in the same transaction as its row, only when the enqueue
created it (a retry of the key writes nothing), and read back by delivery id when the
message is built to send, never by a claim: large content costs the claim path nothing.
Every engine and driver writes the same rows (``rows_for``) with its own placeholders.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from postlane.core.attachments import Attachment
from postlane.core.message import EnqueueResult, Message

COLUMNS = "delivery_id, position, kind, filename, content_type, content_id, size, content"
INSERT_PG = (f"INSERT INTO postlane_attachments ({COLUMNS}) "
             "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)")
INSERT_ASYNCPG = (f"INSERT INTO postlane_attachments ({COLUMNS}) "
                  "VALUES ($1, $2, $3, $4, $5, $6, $7, $8)")
INSERT_SQLITE = (f"INSERT INTO postlane_attachments ({COLUMNS}) "
                 "VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
_READ = "SELECT delivery_id, kind, filename, content_type, content_id, content "
SELECT_PG = (_READ + "FROM postlane_attachments WHERE delivery_id = ANY(%s) "
             "ORDER BY delivery_id, position")
SELECT_SQLITE = (_READ + "FROM postlane_attachments "
                 "WHERE delivery_id IN (SELECT value FROM json_each(?)) "
                 "ORDER BY delivery_id, position")


def rows_for(messages: Sequence[Message],
             results: Sequence[EnqueueResult]) -> list[tuple[Any, ...]]:
    """The rows to write for the deliveries these results created (one per part, in
    order); none for a key that existed, nor twice for a key repeated in the batch."""
    rows: list[tuple[Any, ...]] = []
    done: set[int] = set()
    for message, result in zip(messages, results, strict=True):
        if not message.attachments or not result.created or result.id in done:
            continue
        done.add(result.id)
        rows.extend(
            (result.id, position, part.kind, part.filename, part.content_type,
             part.content_id, part.size, part.content)
            for position, part in enumerate(message.attachments))
    return rows


def any_attachments(messages: Iterable[Message]) -> bool:
    return any(message.attachments for message in messages)


def parts_by_delivery(rows: Iterable[Sequence[Any]]) -> dict[int, tuple[Attachment, ...]]:
    """Rows of ``SELECT_*`` (ordered by delivery and position) as each delivery's parts."""
    found: dict[int, list[Attachment]] = {}
    for delivery_id, kind, filename, content_type, content_id, content in rows:
        found.setdefault(int(delivery_id), []).append(
            Attachment(filename, bytes(content), content_type, kind, content_id))
    return {id_: tuple(parts) for id_, parts in found.items()}
