"""Bulk import: one templated delivery per row of a CSV file, of any size, in constant memory.

The file needs the columns ``user_id`` and ``email``; every column (those two included) is
a template variable. Each row becomes one delivery in the bulk lane with the key
``<template>:<user_id>:<import_id>`` and ``import_id`` set, so running the same import
again, or resuming it after a crash half-way, creates nothing twice: the keys exist.

Rows are streamed (the ``csv`` module over the file), rendered against one template version
(the current one when the run starts), validated, and written in batches through
``TemplateStore.enqueue_many_if_template_usable`` (COPY on PostgreSQL); the import's counters are
written in each batch's transaction. A bad row is skipped and reported with its line
number; with ``strict`` the whole file is validated first and nothing is written if any
row is bad. A row whose key another producer holds already (``KeyConflict``: the
application or an API client wrote ``<template>:<user_id>:<import_id>`` before), or that an
earlier row or run of this import wrote with other content (a repeated ``user_id`` with
another address), is skipped and reported the same way, found when its batch is written
(so even in strict mode). Problems with the file itself (a missing column, a variable the
template needs that no column provides, bytes that are not UTF-8, a NUL byte anywhere) stop
the import either way; a NUL byte is looked for before anything is written.

Operators see each import (``postlane imports show``): its run record, what became of its
deliveries, and whether it is paused (``pause``: every worker stops claiming its
deliveries within a second; nothing is deleted).

An import can start small (``canary=N``, ``postlane import --canary N``): the first ``N``
valid rows are sent as usual and every other row is written *held* (its ``run_at`` pushed
far ahead, ``core.canary.HOLD``) until the worker's housekeeping sees the canary sent and
releases the rest, or sees a canary delivery dead and pauses the import with the reason.
A re-run keeps the first run's canary (and holds its rows while it has not passed).
``resume`` after a failed canary releases the rest.
"""

from __future__ import annotations

import asyncio
import csv
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Protocol

from postlane.core.canary import HOLD
from postlane.core.message import EnqueueResult, Message
from postlane.core.producers import import_producer
from postlane.core.records import ImportCanary, ImportCounts, ImportProgress, ImportRecord
from postlane.core.validation import text_problem, validate
from postlane.errors import ImportRejected, InvalidMessage, KeyConflict, PostlaneError
from postlane.store.roles import FleetStore, ImportStore, TemplateStore
from postlane.templates import CompiledTemplate, check_name, compile_template, require_usable
from postlane.worker.controls import IMPORT_PAUSE, pause_import, resume_import

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "IMPORT_FAILED",
    "REQUIRED_COLUMNS",
    "ImportReport",
    "ImportStatus",
    "RowProblem",
    "failure_reason",
    "import_csv",
    "import_key",
    "import_status",
    "pause",
    "resume",
]

REQUIRED_COLUMNS = ("user_id", "email")
DEFAULT_BATCH_SIZE = 1000
BULK_LANE = "bulk"
MAX_PROBLEMS_KEPT = 1000
IMPORT_FAILED = "import:failed:"
"""Control naming a run that stopped on its file (a bad header, malformed CSV): the import
record alone would show it as "not finished", like a run still going. A control, not a
column, until a migration gives the import record a place for it; the next run clears it."""
FAILURE_LIMIT = 500
"""Bad rows beyond this are counted, not kept (constant memory on a file of bad rows)."""
YIELD_EVERY = 10
"""Rows parsed and rendered between turns given to the batch in flight: its statements
then go out while the next batch is rendered, and the database works beside the importer
instead of after it (the parsing loop never waits on anything otherwise)."""

Progress = Callable[[str, int, int], None]
"""``(phase, bytes done, bytes in the file)``; phase is ``validate`` (strict) or ``import``."""


class ImportingStore(ImportStore, TemplateStore, FleetStore, Protocol):
    """What an import uses: its runs' record, the template it renders and enqueues through,
    and the controls that pause it."""


@dataclass(frozen=True, slots=True)
class RowProblem:
    line: int
    """Line of the file where the row starts (the header is line 1)."""
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.reason}"


@dataclass
class ImportReport:
    import_id: str
    template: str
    template_version: int
    file_name: str
    rows_read: int = 0
    rows_enqueued: int = 0
    """Rows written or found already written (a re-run enqueues every row, creates none)."""
    rows_created: int = 0
    rows_skipped: int = 0
    problems: list[RowProblem] = field(default_factory=list)
    """The first ``MAX_PROBLEMS_KEPT`` skipped rows, with their reasons."""
    elapsed_s: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "import_id": self.import_id, "template": self.template,
            "template_version": self.template_version, "file": self.file_name,
            "rows_read": self.rows_read, "rows_enqueued": self.rows_enqueued,
            "rows_created": self.rows_created, "rows_skipped": self.rows_skipped,
            "problems": [{"line": p.line, "reason": p.reason} for p in self.problems],
            "elapsed_s": round(self.elapsed_s, 3),
        }


def import_key(template: str, user_id: str, import_id: str) -> str:
    return f"{template}:{user_id}:{import_id}"


class _Lines:
    """The file's lines as text for ``csv.reader``, counting bytes for the progress bar."""

    def __init__(self, handle: IO[bytes]) -> None:
        self.handle = handle
        self.bytes = 0
        self.lines = 0

    def __iter__(self) -> Iterator[str]:
        for raw in self.handle:
            self.bytes += len(raw)
            self.lines += 1
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ImportRejected(
                    f"line {self.lines}: not UTF-8 ({exc.reason} at byte {exc.start})",
                    problems=[(self.lines, "not UTF-8")]) from None
            if self.lines == 1:
                text = text.removeprefix("\ufeff")
            yield text


class _Rows:
    """Turns CSV rows into messages, or into problems."""

    def __init__(self, store: ImportingStore, compiled: CompiledTemplate, header: list[str],
                 import_id: str, lane: str) -> None:
        self.store = store
        self.compiled = compiled
        self.header = header
        self.width = len(header)
        self.user_col = header.index("user_id")
        self.email_col = header.index("email")
        self.import_id = import_id
        self.lane = lane
        self.name = compiled.template.name

    def message(self, row: list[str]) -> Message:
        """The row's message; ``InvalidMessage`` (with the reason) when the row is bad."""
        if len(row) != self.width:
            raise InvalidMessage(f"has {len(row)} fields, the header has {self.width}")
        user_id = row[self.user_col].strip()
        email = row[self.email_col].strip()
        if not user_id:
            raise InvalidMessage("user_id is empty", field="user_id")
        variables = dict(zip(self.header, row, strict=True))
        variables["user_id"], variables["email"] = user_id, email
        message = self.compiled.message(
            variables, key=import_key(self.name, user_id, self.import_id), to=email,
            lane=self.lane, import_id=self.import_id)
        try:
            validate(message, self.store.limits)
        except InvalidMessage as exc:
            if exc.field == "to":  # name the column, not the message field
                raise InvalidMessage("email" + str(exc).removeprefix("to"),
                                     field="email") from None
            raise
        return message


def _check_no_nul(path: str) -> None:
    """Refuse a file with a NUL byte before a row is written: no database stores NUL in a
    text, and a CSV holding one is almost always UTF-16 or not text at all. One pass in
    large chunks (``bytes.find``), a small cost next to rendering every row."""
    line = 1
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            at = chunk.find(b"\0")
            if at >= 0:
                line += chunk.count(b"\n", 0, at)
                raise ImportRejected(
                    f"line {line}: contains a NUL byte (is the file UTF-16, or not text?); "
                    "save it as UTF-8 CSV", problems=[(line, "NUL byte")])
            line += chunk.count(b"\n")


def _read_header(reader: Iterator[list[str]], path: str,
                 compiled: CompiledTemplate) -> list[str]:
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise ImportRejected(f"{path} is empty (no header line)") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise ImportRejected(
            f"{path}: the header lacks the required column(s) {', '.join(missing)} "
            f"(found: {', '.join(header) or 'none'})")
    duplicates = sorted({h for h in header if header.count(h) > 1})
    if duplicates:
        raise ImportRejected(f"{path}: the header repeats column(s) {', '.join(duplicates)}")
    unknown = sorted(compiled.variables - set(header))
    if unknown:
        raise ImportRejected(
            f"template {compiled.template.name!r} v{compiled.template.version} uses "
            f"{', '.join(unknown)}, not column(s) of {path} (columns: {', '.join(header)})")
    return header


def _rows(lines: _Lines) -> Iterator[tuple[int, list[str]]]:
    """(line where the row starts, fields); blank lines are skipped."""
    reader = csv.reader(lines, strict=True)
    previous_end = 0
    try:
        for row in reader:
            start, previous_end = previous_end + 1, reader.line_num
            if row:
                yield start, row
    except csv.Error as exc:
        raise ImportRejected(f"line {reader.line_num}: malformed CSV: {exc}",
                             problems=[(reader.line_num, str(exc))]) from None


async def import_csv(
    store: ImportingStore, path: str | os.PathLike[str], *, template: str, import_id: str,
    strict: bool = False, batch_size: int = DEFAULT_BATCH_SIZE, lane: str = BULK_LANE,
    on_progress: Progress | None = None, canary: int | None = None,
) -> ImportReport:
    """Import ``path``: one delivery per valid row, in batches of ``batch_size``; with
    ``canary``, the first ``canary`` rows go first and the rest is held until they are sent.

    Raises ``ImportRejected`` when the file cannot be imported (nothing written), and
    ``UnknownTemplate`` / ``TemplateDeprecated`` for an unusable template.
    """
    started = time.monotonic()
    path = os.fspath(path)
    check_name(template)
    if (not import_id or any(ord(c) < 32 or c == ":" for c in import_id)
            or text_problem(import_id)):
        raise ImportRejected(f"import id {import_id!r} must be non-empty, without ':' or "
                             "control characters")
    if batch_size < 1:
        raise ImportRejected("batch size must be at least 1")
    if canary is not None and canary < 1:
        raise ImportRejected("a canary must be at least one delivery")
    compiled = compile_template(require_usable(await store.get_template(template), template, None))
    version = compiled.template.version
    file_name = Path(path).name
    total = os.path.getsize(path)
    report = ImportReport(import_id, template, version, file_name)
    _check_no_nul(path)

    existing = await store.get_import(import_id)
    if existing is not None and existing.template != template:
        raise ImportRejected(f"import {import_id!r} was started with template "
                             f"{existing.template!r}, not {template!r}")

    if strict:
        with open(path, "rb") as handle:
            lines = _Lines(handle)
            rows = _rows(lines)
            header_rows = (row for _, row in rows)
            header = _read_header(header_rows, file_name, compiled)
            converter = _Rows(store, compiled, header, import_id, lane)
            problems: list[tuple[int, str]] = []
            count = 0
            for line, row in rows:
                try:
                    converter.message(row)
                except InvalidMessage as exc:
                    count += 1
                    if len(problems) < MAX_PROBLEMS_KEPT:
                        problems.append((line, str(exc)))
                if on_progress is not None and lines.lines % 1000 == 0:
                    on_progress("validate", lines.bytes, total)
            if problems:
                more = f" (first {len(problems)} listed)" if count > len(problems) else ""
                raise ImportRejected(
                    f"{file_name}: {count} bad row(s){more}; strict mode: nothing was "
                    "imported", problems=problems)

    if await store.start_import(import_id, template, version, file_name, lane) is None:
        raise ImportRejected(f"import {import_id!r} belongs to another template")
    await store.set_control(IMPORT_FAILED + import_id, None)
    gate = _CanaryGate(store, import_id, canary, await store.get_import_canary(import_id))
    try:
        await _run(store, path, report, compiled, import_id, lane, batch_size, total,
                   on_progress, gate)
        await gate.finish()
    except PostlaneError as exc:  # the file, or the template deprecated meanwhile
        await store.finish_import(_progress(report))
        await store.set_control(IMPORT_FAILED + import_id,
                                {"reason": str(exc)[:FAILURE_LIMIT]})
        raise
    await store.finish_import(_progress(report))
    report.elapsed_s = time.monotonic() - started
    if on_progress is not None:
        on_progress("import", total, total)
    return report


class _CanaryGate:
    """Which rows go now and which are held behind the canary (``core.canary``)."""

    def __init__(self, store: ImportingStore, import_id: str, size: int | None,
                 existing: ImportCanary | None) -> None:
        self.store = store
        self.import_id = import_id
        self.recorded = existing is not None
        self.size = existing.size if existing is not None else size
        self.keys: list[str] = list(existing.keys) if existing is not None else []
        self.known = set(self.keys)
        self.hold = (existing.state in ("waiting", "failed") if existing is not None
                     else size is not None)

    async def admit(self, message: Message) -> Message:
        """``message`` as it is to be written: as it is, or held."""
        if not self.hold or message.key in self.known:
            return message
        if not self.recorded and self.size is not None and len(self.keys) < self.size:
            self.keys.append(message.key)
            self.known.add(message.key)
            if len(self.keys) == self.size:  # recorded before any held row is written
                await self.finish()
            return message
        return replace(message, delay=HOLD)

    async def finish(self) -> None:
        if not self.recorded and self.size is not None and self.keys:
            await self.store.start_import_canary(self.import_id, self.size, self.keys)
            self.recorded = True


async def _run(store: ImportingStore, path: str, report: ImportReport, compiled: CompiledTemplate,
               import_id: str, lane: str, batch_size: int, total: int,
               on_progress: Progress | None, gate: _CanaryGate) -> None:
    """Stream the file into the store (the run record is started; the caller closes it)."""
    template = report.template
    file_name = report.file_name

    pending: asyncio.Task[list[EnqueueResult]] | None = None
    producer = import_producer(import_id)

    async def write(batch: list[Message], lines: list[int],
                    progress: ImportProgress) -> list[EnqueueResult]:
        """Write a batch with the counters as they were when it was read; rows whose keys
        conflict are skipped (and reported) and the rest written again. Each try is one
        transaction, so a refused try wrote nothing."""
        for _ in range(3):
            try:
                return await store.enqueue_many_if_template_usable(
                    template, batch, progress, validated=True, producer=producer)
            except KeyConflict as exc:
                batch, lines, skipped = _without_conflicts(batch, lines, exc, report)
                progress = replace(progress, rows_enqueued=progress.rows_enqueued - skipped,
                                   rows_skipped=progress.rows_skipped + skipped)
        return await store.enqueue_many_if_template_usable(
            template, batch, progress, validated=True, producer=producer)

    async def settle() -> None:
        nonlocal pending
        if pending is not None:
            results = await pending
            pending = None
            report.rows_created += sum(1 for r in results if r.created)

    with open(path, "rb") as handle:
        lines = _Lines(handle)
        rows = _rows(lines)
        header = _read_header((row for _, row in rows), file_name, compiled)
        converter = _Rows(store, compiled, header, import_id, lane)
        batch: list[Message] = []
        batch_lines: list[int] = []
        try:
            for line, row in rows:
                report.rows_read += 1
                try:
                    message = converter.message(row)
                except InvalidMessage as exc:
                    report.rows_skipped += 1
                    if len(report.problems) < MAX_PROBLEMS_KEPT:
                        report.problems.append(RowProblem(line, str(exc)))
                else:
                    batch.append(await gate.admit(message) if gate.hold else message)
                    batch_lines.append(line)
                if (report.rows_read % YIELD_EVERY == 0 and pending is not None
                        and not pending.done()):
                    await asyncio.sleep(0)
                if len(batch) >= batch_size:
                    # One batch in flight while the next is parsed and rendered.
                    await settle()
                    report.rows_enqueued += len(batch)
                    pending = asyncio.ensure_future(
                        write(batch, batch_lines, _progress(report)))
                    batch, batch_lines = [], []
                    if on_progress is not None:
                        on_progress("import", lines.bytes, total)
            await settle()
            report.rows_enqueued += len(batch)
            results = await write(batch, batch_lines, _progress(report))
            report.rows_created += sum(1 for r in results if r.created)
        finally:
            if pending is not None:
                # An error while parsing: let the in-flight batch finish (it is whole).
                await asyncio.gather(pending, return_exceptions=True)


def _without_conflicts(batch: list[Message], lines: list[int], conflict: KeyConflict,
                       report: ImportReport) -> tuple[list[Message], list[int], int]:
    """The batch less its conflicting rows, which are counted and reported as skipped. A
    key repeated in the batch with other content (delivery id 0) keeps its first row."""
    reasons = {key: reason for key, _, reason in conflict.conflicts}
    in_batch = {key for key, id_, _ in conflict.conflicts if id_ == 0}
    kept: list[Message] = []
    kept_lines: list[int] = []
    seen: set[str] = set()
    for message, line in zip(batch, lines, strict=True):
        first = message.key not in seen
        seen.add(message.key)
        if message.key not in reasons or (first and message.key in in_batch):
            kept.append(message)
            kept_lines.append(line)
            continue
        report.rows_enqueued -= 1
        report.rows_skipped += 1
        if len(report.problems) < MAX_PROBLEMS_KEPT:
            report.problems.append(RowProblem(line, reasons[message.key]))
    return kept, kept_lines, len(batch) - len(kept)


def _progress(report: ImportReport) -> ImportProgress:
    return ImportProgress(report.import_id, report.rows_read, report.rows_enqueued,
                          report.rows_skipped)


# -- the operator's view -----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ImportStatus:
    import_id: str
    record: ImportRecord | None
    """None for deliveries enqueued with this import id by other means than an import run."""
    counts: ImportCounts
    paused: bool
    failed: str | None = None
    """Why the last run stopped on its file (a bad header...); None when it did not."""
    canary: ImportCanary | None = None
    paused_because: str | None = None
    """Why the import is paused, when the pause says (a failed canary does)."""

    def as_json(self) -> dict[str, Any]:
        record = self.record
        data: dict[str, Any] = {"import_id": self.import_id, "paused": self.paused,
                                "failed": self.failed, "paused_because": self.paused_because,
                                "canary": self.canary.as_json() if self.canary else None}
        if record is not None:
            data.update({
                "template": record.template, "template_version": record.template_version,
                "file": record.file_name, "lane": record.lane, "runs": record.runs,
                "started_at": record.started_at.isoformat(),
                "last_started_at": record.last_started_at.isoformat(),
                "finished_at": record.finished_at.isoformat() if record.finished_at else None,
                "rows": {"read": record.rows_read, "enqueued": record.rows_enqueued,
                         "created": record.rows_created, "skipped": record.rows_skipped},
            })
        data["deliveries"] = self.counts.as_json()
        return data


async def import_status(store: ImportingStore, import_id: str) -> ImportStatus | None:
    """The run record, delivery counts and pause state; None if nothing has that id."""
    record = await store.get_import(import_id)
    counts = await store.import_counts(import_id)
    if record is None and counts.created == 0:
        return None
    controls = await store.get_controls()
    failure = controls.get(IMPORT_FAILED + import_id)
    paused = controls.get(IMPORT_PAUSE + import_id)
    because = paused.value.get("reason") if paused is not None and isinstance(
        paused.value, dict) else None
    return ImportStatus(import_id, record, counts, paused is not None,
                        failure_reason(failure.value) if failure is not None else None,
                        await store.get_import_canary(import_id),
                        str(because) if because else None)


def failure_reason(value: Any) -> str:
    """The reason an ``IMPORT_FAILED`` control holds."""
    return str(value.get("reason", "failed")) if isinstance(value, dict) else "failed"


async def pause(store: FleetStore, import_id: str, *, by: str = "operator") -> None:
    """Every worker stops claiming this import's deliveries within a second; nothing is
    deleted, and deliveries already claimed finish."""
    await pause_import(store, import_id, by=by)


async def resume(store: ImportingStore, import_id: str) -> int:
    """Let workers claim the import again; after a failed canary, release the rest too (the
    operator fixed the cause). Returns how many held deliveries were released."""
    await resume_import(store, import_id)
    canary = await store.get_import_canary(import_id)
    if canary is not None and canary.state == "failed":
        return await store.release_import_hold(import_id)
    return 0
