"""Templates (versions, deprecation, deletion while unreferenced) and bulk imports."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from postlane.core.message import EnqueueResult, Message
from postlane.core.records import (
    ImportCounts,
    ImportProgress,
    ImportRecord,
    TemplateDeletion,
    TemplateVersion,
    check_template_id,
    import_counts_from_rows,
)
from postlane.core.validation import validate
from postlane.errors import TemplateDeprecated, UnknownTemplate
from postlane.store.base import IMPORT_COLUMNS, TEMPLATE_REFERENCE_CONDITION
from postlane.store.postgres._base import PostgresBase
from postlane.store.postgres._producing import enqueue_many_on_connection


class TemplatesMixin(PostgresBase):
    # -- templates and bulk imports ----------------------------------------------------------
    _TEMPLATE_COLS = (
        "v.name, v.version, v.subject, v.text_body, v.html_body, v.created_at, "
        "t.latest_version, t.deprecated_at IS NOT NULL"
    )
    _ADD_TEMPLATE = f"""
    WITH t AS (
        INSERT INTO postlane_templates AS tp (name, latest_version) VALUES (%(name)s, 1)
        ON CONFLICT (name) DO UPDATE SET latest_version = tp.latest_version + 1,
            deleted_at = NULL, updated_at = now()
        RETURNING name, latest_version, deprecated_at
    ), v AS (
        INSERT INTO postlane_template_versions (name, version, subject, text_body, html_body)
        SELECT name, latest_version, %(subject)s, %(text)s, %(html)s FROM t
        RETURNING name, version, subject, text_body, html_body, created_at
    )
    SELECT {_TEMPLATE_COLS} FROM v, t
    """
    _GET_TEMPLATE = f"""
    SELECT {_TEMPLATE_COLS} FROM postlane_templates t
    JOIN postlane_template_versions v ON v.name = t.name
    WHERE t.name = %(name)s AND t.deleted_at IS NULL
      AND v.version = COALESCE(%(version)s::int, t.latest_version)
    """
    # Held until the enqueueing transaction ends: delete and deprecate wait for it.
    _GET_TEMPLATE_FOR_ENQUEUE = _GET_TEMPLATE + " FOR SHARE OF t"
    _LOCK_TEMPLATE_FOR_ENQUEUE = (
        "SELECT deprecated_at IS NOT NULL FROM postlane_templates "
        "WHERE name = %s AND deleted_at IS NULL FOR SHARE"
    )
    _COUNT_TEMPLATE_REFERENCES = (
        "SELECT count(*) FROM postlane_messages m JOIN postlane_deliveries d ON d.id = m.id "
        f"WHERE m.template_id = %s AND {TEMPLATE_REFERENCE_CONDITION}"
    )
    _IMPORT_PROGRESS = """
    UPDATE postlane_imports SET rows_read = %(read)s, rows_enqueued = %(enqueued)s,
        rows_skipped = %(skipped)s, rows_created = rows_created + %(created)s,
        finished_at = CASE WHEN %(finished)s THEN now() ELSE NULL END, updated_at = now()
    WHERE import_id = %(id)s
    """

    async def add_template_version(
        self, name: str, subject: str, text: str | None, html: str | None
    ) -> TemplateVersion:
        async with self._pool.connection() as conn:
            cur = await conn.execute(self._ADD_TEMPLATE, {"name": name, "subject": subject,
                                                          "text": text, "html": html})
            row = await cur.fetchone()
        assert row is not None
        return TemplateVersion(*row)

    async def get_template(self, name: str, version: int | None = None) -> TemplateVersion | None:
        async with self._pool.connection() as conn:
            return await self.template_on_connection(conn, name, version, lock=False)

    @classmethod
    async def template_on_connection(
        cls, conn: psycopg.AsyncConnection[Any], name: str, version: int | None = None,
        *, lock: bool = True,
    ) -> TemplateVersion | None:
        """Read a template version in the caller's transaction; ``lock`` keeps a concurrent
        delete or deprecate waiting until that transaction ends."""
        sql = cls._GET_TEMPLATE_FOR_ENQUEUE if lock else cls._GET_TEMPLATE
        async with conn.cursor(row_factory=tuple_row) as cur:
            await cur.execute(sql, {"name": name, "version": version})
            row = await cur.fetchone()
        return TemplateVersion(*row) if row else None

    @classmethod
    def template_on_sync_connection(
        cls, conn: psycopg.Connection[Any], name: str, version: int | None = None
    ) -> TemplateVersion | None:
        """``template_on_connection`` for a synchronous psycopg connection (the outbox)."""
        with conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(cls._GET_TEMPLATE_FOR_ENQUEUE, {"name": name, "version": version})
            row = cur.fetchone()
        return TemplateVersion(*row) if row else None

    async def list_templates(self) -> list[TemplateVersion]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {self._TEMPLATE_COLS} FROM postlane_templates t "
                "JOIN postlane_template_versions v "
                "ON v.name = t.name AND v.version = t.latest_version "
                "WHERE t.deleted_at IS NULL ORDER BY t.name"
            )
            return [TemplateVersion(*row) for row in await cur.fetchall()]

    async def set_template_deprecated(self, name: str, deprecated: bool = True) -> bool:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "UPDATE postlane_templates SET deprecated_at = CASE WHEN %(on)s "
                "THEN COALESCE(deprecated_at, now()) END, updated_at = now() "
                "WHERE name = %(name)s AND deleted_at IS NULL RETURNING name",
                {"on": deprecated, "name": name},
            )
            return await cur.fetchone() is not None

    async def count_template_references(self, name: str) -> int:
        async with self._pool.connection() as conn:
            cur = await conn.execute(self._COUNT_TEMPLATE_REFERENCES, (name,))
            row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def delete_template_if_unreferenced(self, name: str) -> TemplateDeletion:
        async with self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "SELECT 1 FROM postlane_templates WHERE name = %s AND deleted_at IS NULL "
                "FOR UPDATE", (name,),
            )
            if await cur.fetchone() is None:
                return TemplateDeletion(found=False, deleted=False, references=0)
            cur = await conn.execute(self._COUNT_TEMPLATE_REFERENCES, (name,))
            row = await cur.fetchone()
            references = int(row[0]) if row else 0
            if references:
                return TemplateDeletion(found=True, deleted=False, references=references)
            await conn.execute("DELETE FROM postlane_template_versions WHERE name = %s", (name,))
            await conn.execute(
                "UPDATE postlane_templates SET deleted_at = now(), deprecated_at = NULL, "
                "updated_at = now() WHERE name = %s", (name,),
            )
        return TemplateDeletion(found=True, deleted=True, references=0)

    async def enqueue_many_if_template_usable(
        self, template: str, messages: Sequence[Message],
        progress: ImportProgress | None = None, *, validated: bool = False,
        producer: str | None = None,
    ) -> list[EnqueueResult]:
        for message in messages:
            if not validated:
                validate(message, self.limits)
            check_template_id(message, template)
        results: list[EnqueueResult] = []
        async with self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute(self._LOCK_TEMPLATE_FOR_ENQUEUE, (template,))
            row = await cur.fetchone()
            if row is None:
                raise UnknownTemplate(f"unknown template {template!r}", field="template_id")
            if row[0]:
                raise TemplateDeprecated(
                    f"template {template!r} is deprecated: it takes no new enqueues",
                    field="template_id")
            if messages:
                results = await enqueue_many_on_connection(conn, messages, producer)
            if progress is not None:
                await conn.execute(self._IMPORT_PROGRESS, {
                    "id": progress.import_id, "read": progress.rows_read,
                    "enqueued": progress.rows_enqueued, "skipped": progress.rows_skipped,
                    "created": sum(1 for r in results if r.created), "finished": False})
        if messages:
            self._wakeup.set()
        return results

    async def start_import(
        self, import_id: str, template: str, template_version: int, file_name: str, lane: str
    ) -> ImportRecord | None:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "INSERT INTO postlane_imports AS i "
                "(import_id, template, template_version, file_name, lane) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (import_id) DO UPDATE SET "
                "runs = i.runs + 1, last_started_at = now(), finished_at = NULL, "
                "template_version = excluded.template_version, file_name = excluded.file_name, "
                "lane = excluded.lane, rows_read = 0, rows_enqueued = 0, rows_created = 0, "
                "rows_skipped = 0, updated_at = now() WHERE i.template = excluded.template "
                f"RETURNING {IMPORT_COLUMNS}",
                (import_id, template, template_version, file_name, lane),
            )
            row = await cur.fetchone()
        return ImportRecord(*row) if row else None

    async def finish_import(self, progress: ImportProgress) -> None:
        async with self._pool.connection() as conn:
            await conn.execute(self._IMPORT_PROGRESS, {
                "id": progress.import_id, "read": progress.rows_read,
                "enqueued": progress.rows_enqueued, "skipped": progress.rows_skipped,
                "created": 0, "finished": True})

    async def get_import(self, import_id: str) -> ImportRecord | None:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {IMPORT_COLUMNS} FROM postlane_imports WHERE import_id = %s",
                (import_id,))
            row = await cur.fetchone()
        return ImportRecord(*row) if row else None

    async def list_imports(self, limit: int = 100) -> list[ImportRecord]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {IMPORT_COLUMNS} FROM postlane_imports "
                "ORDER BY last_started_at DESC, import_id LIMIT %s", (limit,))
            return [ImportRecord(*row) for row in await cur.fetchall()]

    async def import_counts(self, import_id: str) -> ImportCounts:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT state, attempts > 0, count(*), "
                "EXTRACT(EPOCH FROM now() - min(created_at))::float8 "
                "FROM postlane_deliveries WHERE import_id = %s GROUP BY 1, 2", (import_id,))
            return import_counts_from_rows(await cur.fetchall())
