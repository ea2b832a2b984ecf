"""Templates and bulk imports on SQLite."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

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
from postlane.store.sqlite._base import Q, SQLiteEngine, _dt, _opt_dt
from postlane.store.sqlite._producing import insert_many


class TemplatesMixin(SQLiteEngine):
    # -- templates and bulk imports ----------------------------------------------------------
    @staticmethod
    def _template(row: Sequence[Any]) -> TemplateVersion:
        return TemplateVersion(row[0], row[1], row[2], row[3], row[4], _dt(row[5]), row[6],
                               bool(row[7]))

    @classmethod
    def template_on_connection(
        cls, conn: sqlite3.Connection, name: str, version: int | None = None
    ) -> TemplateVersion | None:
        """Read a template version through ``conn``, in whatever transaction it is in."""
        row = conn.execute(Q["get_template"], {"name": name, "version": version}).fetchone()
        return cls._template(row) if row else None

    def add_template_version(
        self, name: str, subject: str, text: str | None, html: str | None
    ) -> TemplateVersion:
        with self._write() as conn:
            conn.execute(Q["add_template"], (name,))
            conn.execute(Q["add_template_version"], (subject, text, html, name))
            found = self.template_on_connection(conn, name)
        assert found is not None
        return found

    def get_template(self, name: str, version: int | None = None) -> TemplateVersion | None:
        return self.template_on_connection(self.conn, name, version)

    def list_templates(self) -> list[TemplateVersion]:
        rows = self.conn.execute(Q["list_templates"]).fetchall()
        return [self._template(r) for r in rows]

    def set_template_deprecated(self, name: str, deprecated: bool = True) -> bool:
        with self._write() as conn:
            row = conn.execute(
                Q["set_template_deprecated"], {"on": deprecated, "name": name}).fetchone()
            return row is not None

    def count_template_references(self, name: str) -> int:
        return int(self.conn.execute(Q["count_template_references"], (name,)).fetchone()[0])

    def delete_template_if_unreferenced(self, name: str) -> TemplateDeletion:
        with self._write() as conn:
            if conn.execute(Q["template_exists"], (name,)).fetchone() is None:
                return TemplateDeletion(found=False, deleted=False, references=0)
            references = int(conn.execute(Q["count_template_references"], (name,)).fetchone()[0])
            if references:
                return TemplateDeletion(found=True, deleted=False, references=references)
            conn.execute(Q["delete_template_versions"], (name,))
            conn.execute(Q["delete_template"], (name,))
        return TemplateDeletion(found=True, deleted=True, references=0)

    def enqueue_many_if_template_usable(
        self, template: str, messages: Sequence[Message],
        progress: ImportProgress | None = None, *, validated: bool = False,
        producer: str | None = None,
    ) -> list[EnqueueResult]:
        for message in messages:
            if not validated:
                validate(message, self.limits)
            check_template_id(message, template)
        with self._write() as conn:
            row = conn.execute(Q["template_deprecated"], (template,)).fetchone()
            refuse_unusable_template(template, None, None if row is None else bool(row[0]))
            results = insert_many(conn, messages, producer)
            if progress is not None:
                conn.execute(Q["import_progress"], {
                    "id": progress.import_id, "read": progress.rows_read,
                    "enqueued": progress.rows_enqueued, "skipped": progress.rows_skipped,
                    "created": sum(1 for r in results if r.created), "finished": False})
        if messages:
            self.wake()
        return results

    def start_import(
        self, import_id: str, template: str, template_version: int, file_name: str, lane: str
    ) -> ImportRecord | None:
        with self._write() as conn:
            row = conn.execute(
                Q["start_import"],
                (import_id, template, template_version, file_name, lane)).fetchone()
        return self._import(row) if row else None

    @staticmethod
    def _import(row: Sequence[Any]) -> ImportRecord:
        v = list(row)
        v[6], v[7], v[8] = _dt(v[6]), _dt(v[7]), _opt_dt(v[8])
        return ImportRecord(*v)

    def finish_import(self, progress: ImportProgress) -> None:
        with self._write() as conn:
            conn.execute(Q["import_progress"], {
                "id": progress.import_id, "read": progress.rows_read,
                "enqueued": progress.rows_enqueued, "skipped": progress.rows_skipped,
                "created": 0, "finished": True})

    def get_import(self, import_id: str) -> ImportRecord | None:
        row = self.conn.execute(Q["get_import"], (import_id,)).fetchone()
        return self._import(row) if row else None

    def list_imports(self, limit: int = 100) -> list[ImportRecord]:
        rows = self.conn.execute(Q["list_imports"], (limit,)).fetchall()
        return [self._import(r) for r in rows]

    def import_counts(self, import_id: str) -> ImportCounts:
        rows = self.conn.execute(Q["import_counts"], (import_id,)).fetchall()
        return import_counts_from_rows(rows)
