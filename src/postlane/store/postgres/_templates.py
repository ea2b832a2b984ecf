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
    refuse_unusable_template,
)
from postlane.core.validation import validate
from postlane.store.postgres._base import PostgresBase, Q
from postlane.store.postgres._producing import enqueue_many_on_connection


class TemplatesMixin(PostgresBase):
    # -- templates and bulk imports ----------------------------------------------------------
    async def add_template_version(
        self, name: str, subject: str, text: str | None, html: str | None
    ) -> TemplateVersion:
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["add_template"], {"name": name, "subject": subject,
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
        sql = Q["get_template_for_enqueue"] if lock else Q["get_template"]
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
            cur.execute(Q["get_template_for_enqueue"], {"name": name, "version": version})
            row = cur.fetchone()
        return TemplateVersion(*row) if row else None

    async def list_templates(self) -> list[TemplateVersion]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["list_templates"])
            return [TemplateVersion(*row) for row in await cur.fetchall()]

    async def set_template_deprecated(self, name: str, deprecated: bool = True) -> bool:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                Q["set_template_deprecated"],
                {"on": deprecated, "name": name},
            )
            return await cur.fetchone() is not None

    async def count_template_references(self, name: str) -> int:
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["count_template_references"], (name,))
            row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def delete_template_if_unreferenced(self, name: str) -> TemplateDeletion:
        async with self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute(Q["lock_template_for_delete"], (name,))
            if await cur.fetchone() is None:
                return TemplateDeletion(found=False, deleted=False, references=0)
            cur = await conn.execute(Q["count_template_references"], (name,))
            row = await cur.fetchone()
            references = int(row[0]) if row else 0
            if references:
                return TemplateDeletion(found=True, deleted=False, references=references)
            await conn.execute(Q["delete_template_versions"], (name,))
            await conn.execute(Q["mark_template_deleted"], (name,))
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
            cur = await conn.execute(Q["lock_template_for_enqueue"], (template,))
            row = await cur.fetchone()
            refuse_unusable_template(template, None, None if row is None else bool(row[0]))
            if messages:
                results = await enqueue_many_on_connection(conn, messages, producer)
            if progress is not None:
                await conn.execute(Q["import_progress"], {
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
                Q["start_import"],
                (import_id, template, template_version, file_name, lane),
            )
            row = await cur.fetchone()
        return ImportRecord(*row) if row else None

    async def finish_import(self, progress: ImportProgress) -> None:
        async with self._pool.connection() as conn:
            await conn.execute(Q["import_progress"], {
                "id": progress.import_id, "read": progress.rows_read,
                "enqueued": progress.rows_enqueued, "skipped": progress.rows_skipped,
                "created": 0, "finished": True})

    async def get_import(self, import_id: str) -> ImportRecord | None:
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["get_import"], (import_id,))
            row = await cur.fetchone()
        return ImportRecord(*row) if row else None

    async def list_imports(self, limit: int = 100) -> list[ImportRecord]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["list_imports"], (limit,))
            return [ImportRecord(*row) for row in await cur.fetchall()]

    async def import_counts(self, import_id: str) -> ImportCounts:
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["import_counts"], (import_id,))
            return import_counts_from_rows(await cur.fetchall())
