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
)
from postlane.core.validation import validate
from postlane.errors import TemplateDeprecated, UnknownTemplate
from postlane.store.base import IMPORT_COLUMNS, TEMPLATE_REFERENCE_CONDITION
from postlane.store.sqlite._base import NOW, SQLiteEngine, _dt, _opt_dt
from postlane.store.sqlite._producing import insert_many


class TemplatesMixin(SQLiteEngine):
    # -- templates and bulk imports ----------------------------------------------------------
    _TEMPLATE_COLS = (
        "v.name, v.version, v.subject, v.text_body, v.html_body, v.created_at, "
        "t.latest_version, t.deprecated_at IS NOT NULL"
    )
    _GET_TEMPLATE = f"""
    SELECT {_TEMPLATE_COLS} FROM postlane_templates t
    JOIN postlane_template_versions v ON v.name = t.name
    WHERE t.name = :name AND t.deleted_at IS NULL
      AND v.version = COALESCE(:version, t.latest_version)
    """
    _COUNT_TEMPLATE_REFERENCES = (
        "SELECT count(*) FROM postlane_messages m JOIN postlane_deliveries d ON d.id = m.id "
        f"WHERE m.template_id = ? AND {TEMPLATE_REFERENCE_CONDITION}"
    )
    _IMPORT_PROGRESS = f"""
    UPDATE postlane_imports SET rows_read = :read, rows_enqueued = :enqueued,
        rows_skipped = :skipped, rows_created = rows_created + :created,
        finished_at = CASE WHEN :finished THEN {NOW} ELSE NULL END, updated_at = {NOW}
    WHERE import_id = :id
    """

    @staticmethod
    def _template(row: Sequence[Any]) -> TemplateVersion:
        return TemplateVersion(row[0], row[1], row[2], row[3], row[4], _dt(row[5]), row[6],
                               bool(row[7]))

    @classmethod
    def template_on_connection(
        cls, conn: sqlite3.Connection, name: str, version: int | None = None
    ) -> TemplateVersion | None:
        """Read a template version through ``conn``, in whatever transaction it is in."""
        row = conn.execute(cls._GET_TEMPLATE, {"name": name, "version": version}).fetchone()
        return cls._template(row) if row else None

    def add_template_version(
        self, name: str, subject: str, text: str | None, html: str | None
    ) -> TemplateVersion:
        with self._write() as conn:
            conn.execute(
                f"INSERT INTO postlane_templates (name, latest_version, created_at, "
                f"updated_at) VALUES (?, 1, {NOW}, {NOW}) ON CONFLICT (name) DO UPDATE SET "
                f"latest_version = latest_version + 1, deleted_at = NULL, "
                f"updated_at = {NOW}", (name,))
            conn.execute(
                f"INSERT INTO postlane_template_versions "
                f"(name, version, subject, text_body, html_body, created_at) "
                f"SELECT name, latest_version, ?, ?, ?, {NOW} FROM postlane_templates "
                f"WHERE name = ?", (subject, text, html, name))
            found = self.template_on_connection(conn, name)
        assert found is not None
        return found

    def get_template(self, name: str, version: int | None = None) -> TemplateVersion | None:
        return self.template_on_connection(self.conn, name, version)

    def list_templates(self) -> list[TemplateVersion]:
        rows = self.conn.execute(
            f"SELECT {self._TEMPLATE_COLS} FROM postlane_templates t "
            "JOIN postlane_template_versions v "
            "ON v.name = t.name AND v.version = t.latest_version "
            "WHERE t.deleted_at IS NULL ORDER BY t.name").fetchall()
        return [self._template(r) for r in rows]

    def set_template_deprecated(self, name: str, deprecated: bool = True) -> bool:
        with self._write() as conn:
            row = conn.execute(
                f"UPDATE postlane_templates SET deprecated_at = CASE WHEN :on "
                f"THEN COALESCE(deprecated_at, {NOW}) END, updated_at = {NOW} "
                f"WHERE name = :name AND deleted_at IS NULL RETURNING name",
                {"on": deprecated, "name": name}).fetchone()
            return row is not None

    def count_template_references(self, name: str) -> int:
        return int(self.conn.execute(self._COUNT_TEMPLATE_REFERENCES, (name,)).fetchone()[0])

    def delete_template_if_unreferenced(self, name: str) -> TemplateDeletion:
        with self._write() as conn:
            if conn.execute("SELECT 1 FROM postlane_templates WHERE name = ? "
                            "AND deleted_at IS NULL", (name,)).fetchone() is None:
                return TemplateDeletion(found=False, deleted=False, references=0)
            references = int(
                conn.execute(self._COUNT_TEMPLATE_REFERENCES, (name,)).fetchone()[0])
            if references:
                return TemplateDeletion(found=True, deleted=False, references=references)
            conn.execute("DELETE FROM postlane_template_versions WHERE name = ?", (name,))
            conn.execute(
                f"UPDATE postlane_templates SET deleted_at = {NOW}, deprecated_at = NULL, "
                f"updated_at = {NOW} WHERE name = ?", (name,))
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
            row = conn.execute(
                "SELECT deprecated_at IS NOT NULL FROM postlane_templates "
                "WHERE name = ? AND deleted_at IS NULL", (template,)).fetchone()
            if row is None:
                raise UnknownTemplate(f"unknown template {template!r}", field="template_id")
            if row[0]:
                raise TemplateDeprecated(
                    f"template {template!r} is deprecated: it takes no new enqueues",
                    field="template_id")
            results = insert_many(conn, messages, producer)
            if progress is not None:
                conn.execute(self._IMPORT_PROGRESS, {
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
                f"INSERT INTO postlane_imports (import_id, template, template_version, "
                f"file_name, lane, started_at, last_started_at, updated_at) "
                f"VALUES (?, ?, ?, ?, ?, {NOW}, {NOW}, {NOW}) "
                f"ON CONFLICT (import_id) DO UPDATE SET runs = runs + 1, "
                f"last_started_at = {NOW}, finished_at = NULL, "
                f"template_version = excluded.template_version, "
                f"file_name = excluded.file_name, lane = excluded.lane, rows_read = 0, "
                f"rows_enqueued = 0, rows_created = 0, rows_skipped = 0, "
                f"updated_at = {NOW} WHERE template = excluded.template "
                f"RETURNING {IMPORT_COLUMNS}",
                (import_id, template, template_version, file_name, lane)).fetchone()
        return self._import(row) if row else None

    @staticmethod
    def _import(row: Sequence[Any]) -> ImportRecord:
        v = list(row)
        v[6], v[7], v[8] = _dt(v[6]), _dt(v[7]), _opt_dt(v[8])
        return ImportRecord(*v)

    def finish_import(self, progress: ImportProgress) -> None:
        with self._write() as conn:
            conn.execute(self._IMPORT_PROGRESS, {
                "id": progress.import_id, "read": progress.rows_read,
                "enqueued": progress.rows_enqueued, "skipped": progress.rows_skipped,
                "created": 0, "finished": True})

    def get_import(self, import_id: str) -> ImportRecord | None:
        row = self.conn.execute(
            f"SELECT {IMPORT_COLUMNS} FROM postlane_imports WHERE import_id = ?",
            (import_id,)).fetchone()
        return self._import(row) if row else None

    def list_imports(self, limit: int = 100) -> list[ImportRecord]:
        rows = self.conn.execute(
            f"SELECT {IMPORT_COLUMNS} FROM postlane_imports "
            "ORDER BY last_started_at DESC, import_id LIMIT ?", (limit,)).fetchall()
        return [self._import(r) for r in rows]

    def import_counts(self, import_id: str) -> ImportCounts:
        rows = self.conn.execute(
            f"SELECT state, attempts > 0, count(*), {NOW} - min(created_at) "
            "FROM postlane_deliveries WHERE import_id = ? GROUP BY 1, 2",
            (import_id,)).fetchall()
        return import_counts_from_rows(rows)
