"""``postlane import FILE`` and ``postlane imports show|list|pause|resume``."""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

from postlane.cli.shell import console, err_console, run_with_store, table, when
from postlane.core.records import Control, ImportCanary, ImportRecord
from postlane.errors import ImportRejected, PostlaneError
from postlane.imports import (
    DEFAULT_BATCH_SIZE,
    IMPORT_FAILED,
    ImportReport,
    ImportStatus,
    failure_reason,
    import_csv,
    import_status,
    pause,
    resume,
)
from postlane.store.base import Store
from postlane.worker.controls import IMPORT_PAUSE

imports = typer.Typer(help="Bulk imports as an operator sees them: show, list, pause, resume.",
                      no_args_is_help=True, rich_markup_mode=None)

SHOWN_PROBLEMS = 50
EXIT_ROWS_SKIPPED = 4
"""``postlane import`` wrote the good rows but skipped more bad ones than ``--max-skipped``:
not a crash (re-running after fixing the file creates nothing twice), but not all done."""


def import_(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True,
                                         help="CSV with a header: user_id, email, and the "
                                              "template's variables.")],
    template: Annotated[str, typer.Option(help="Template to render each row with.")],
    import_id: Annotated[str, typer.Option(
        "--import-id", help="This import's id: part of every key, so a re-run or a resume "
                            "creates nothing twice.")],
    strict: Annotated[bool, typer.Option(
        help="Validate the whole file first; one bad row and nothing is imported.")] = False,
    batch_size: Annotated[int, typer.Option(min=1, help="Rows per write.")] = DEFAULT_BATCH_SIZE,
    lane: Annotated[str, typer.Option(help="Lane of the deliveries.")] = "bulk",
    max_skipped: Annotated[int, typer.Option(
        min=0, help="Bad rows tolerated: past this many, exit with status 4 (the good rows "
                    "are imported either way).")] = 0,
    canary: Annotated[int | None, typer.Option(
        min=1, help="Send the first N deliveries first and hold the rest until they are "
                    "sent; a canary delivery that dead-letters pauses the import with the "
                    "reason.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    attachments: Annotated[str | None, typer.Option(
        "--attachments", metavar="MODULE",
        help="A Python module to import first: it declares the template's attachments "
             "(postlane.templates.declare_attachments), rendered for every row.")] = None,
) -> None:
    """Enqueue one templated delivery per row (key <template>:<user_id>:<import-id>)."""
    if attachments is not None:
        if os.getcwd() not in sys.path:  # the application's modules, as `python -m` sees them
            sys.path.insert(0, os.getcwd())
        try:
            importlib.import_module(attachments)
        except Exception as exc:
            raise typer.BadParameter(f"cannot import {attachments!r}: {type(exc).__name__}: "
                                     f"{exc}", param_hint="--attachments") from None
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
        console=err_console, disable=not err_console.is_terminal, transient=False,
    )
    tasks: dict[str, Any] = {}

    def on_progress(phase: str, done: int, total: int) -> None:
        if phase not in tasks:
            label = "validating" if phase == "validate" else f"importing {file.name}"
            tasks[phase] = progress.add_task(label, total=total)
        progress.update(tasks[phase], completed=done)

    async def _import(store: Store) -> ImportReport:
        try:
            with progress:
                return await import_csv(store, file, template=template, import_id=import_id,
                                        strict=strict, batch_size=batch_size, lane=lane,
                                        on_progress=on_progress, canary=canary)
        except ImportRejected as exc:
            _print_problems(exc.problems, len(exc.problems))
            raise

    report = run_with_store(ctx, _import)
    if as_json:
        print(json.dumps(report.as_json()))
    else:
        rate = report.rows_read / report.elapsed_s if report.elapsed_s else 0.0
        console.print(
            f"import {report.import_id}: {report.rows_read} rows read, "
            f"{report.rows_enqueued} enqueued ({report.rows_created} new), "
            f"{report.rows_skipped} skipped; template {report.template} "
            f"v{report.template_version}; {report.elapsed_s:.1f}s ({rate:,.0f} rows/s)")
        if canary is not None:
            console.print(f"canary: the first {canary} go now; the rest is held until they "
                          f"are sent (postlane imports show {report.import_id})")
    _print_problems([(p.line, p.reason) for p in report.problems], report.rows_skipped)
    if report.rows_skipped > max_skipped:
        err_console.print(f"[red]error:[/red] {report.rows_skipped} row(s) skipped "
                          f"(--max-skipped {max_skipped}); fix them and run the same "
                          "command again: rows already imported are not created twice")
        raise typer.Exit(EXIT_ROWS_SKIPPED)


def _print_problems(problems: list[tuple[int, str]], total: int) -> None:
    for line, reason in problems[:SHOWN_PROBLEMS]:
        err_console.print(f"line {line}: {reason}", markup=False, highlight=False)
    if total > SHOWN_PROBLEMS:
        err_console.print(f"... and {total - SHOWN_PROBLEMS} more skipped row(s)")


@imports.command("show")
def show(
    ctx: typer.Context,
    import_id: Annotated[str, typer.Argument(help="The import id.")],
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Created, claimed, accepted, waiting for another attempt, dead; oldest waiting age."""

    async def _show(store: Store) -> ImportStatus:
        status = await import_status(store, import_id)
        if status is None:
            raise PostlaneError(f"no import {import_id!r} (no run recorded, no deliveries)")
        return status

    status = run_with_store(ctx, _show)
    data = status.as_json()
    if as_json:
        print(json.dumps(data))
        return
    d = data["deliveries"]
    title = f"import {escape(import_id)}" + ("  [yellow]PAUSED[/yellow]" if status.paused
                                             else "")
    console.print(title + ("  [red]FAILED[/red]" if status.failed else ""))
    if status.failed:
        console.print(f"[red]failed:[/red] {escape(status.failed)}")
    if status.paused_because:
        console.print(f"[yellow]paused:[/yellow] {escape(status.paused_because)}")
    if status.canary is not None:
        console.print(_canary_line(status.canary))
    record = status.record
    if record is not None:
        finished = (f"stopped {_t(record.finished_at)}" if status.failed and record.finished_at
                    else f"finished {_t(record.finished_at)}" if record.finished_at
                    else "[yellow]not finished[/yellow] (running, or stopped: re-run to resume)")
        console.print(f"template {record.template} v{record.template_version}, file "
                      f"{record.file_name}, lane {record.lane}, run {record.runs}, started "
                      f"{_t(record.last_started_at)}, {finished}")
        console.print(f"rows: {record.rows_read} read, {record.rows_enqueued} enqueued "
                      f"({record.rows_created} new in this run), {record.rows_skipped} skipped")
    grid = table("created", "claimed", "accepted", "waiting retry", "queued", "dead",
                 "oldest waiting (s)", right=("created", "claimed", "accepted", "waiting retry",
                                              "queued", "dead", "oldest waiting (s)"))
    grid.add_row(str(d["created"]), str(d["claimed"]), str(d["accepted"]),
                 str(d["waiting_retry"]), str(d["queued"]), str(d["dead"]),
                 f"{d['oldest_waiting_age_s']:.1f}")
    console.print(grid)
    other = {k: v for k, v in d["states"].items()
             if v and k not in ("pending", "sending", "sent", "dead")}
    if other:
        console.print("also: " + "  ".join(f"{k}={v}" for k, v in other.items()))


@imports.command("list")
def list_(
    ctx: typer.Context,
    limit: int = 50,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Recorded imports, most recently started first."""

    async def _list(store: Store) -> tuple[list[ImportRecord], dict[str, Control]]:
        return await store.list_imports(limit), await store.get_controls()

    records, controls = run_with_store(ctx, _list)

    def failed(import_id: str) -> str | None:
        control = controls.get(IMPORT_FAILED + import_id)
        return failure_reason(control.value) if control is not None else None

    if as_json:
        print(json.dumps([{**_record_json(r), "paused": IMPORT_PAUSE + r.import_id in controls,
                           "failed": failed(r.import_id)} for r in records]))
        return
    if not records:
        console.print("no imports")
        return
    grid = table("import", "template", "file", "started (UTC)", "rows", "status",
                 keep=("import",))
    for r in records:
        why = failed(r.import_id)
        state = ("failed: " + why if why else "finished" if r.finished_at else "not finished")
        if IMPORT_PAUSE + r.import_id in controls:
            state += ", paused"
        grid.add_row(r.import_id, f"{r.template} v{r.template_version}", r.file_name,
                     _t(r.last_started_at), f"{r.rows_read} read, {r.rows_enqueued} "
                     f"enqueued, {r.rows_skipped} skipped", state)
    console.print(grid, markup=False, highlight=False)


@imports.command("pause")
def pause_cmd(ctx: typer.Context,
              import_id: Annotated[str, typer.Argument(help="The import id.")]) -> None:
    """Stop every worker claiming this import's deliveries (within a second); nothing is
    deleted, other imports and lanes go on."""

    async def _pause(store: Store) -> bool:
        known = await store.get_import(import_id) is not None
        await pause(store, import_id)
        return known

    known = run_with_store(ctx, _pause)
    console.print(f"import {import_id} paused: workers stop claiming it within a second"
                  + ("" if known else " (no run of it is recorded yet)"))


@imports.command("resume")
def resume_cmd(ctx: typer.Context,
               import_id: Annotated[str, typer.Argument(help="The import id.")]) -> None:
    """Let workers claim this import's deliveries again (after a failed canary: the
    deliveries held behind it too)."""

    async def _resume(store: Store) -> int:
        return await resume(store, import_id)

    released = run_with_store(ctx, _resume)
    console.print(f"import {import_id} resumed" + (
        f"; {released} deliveries held behind its failed canary released" if released else ""))


def _canary_line(canary: ImportCanary) -> str:
    colour = {"waiting": "yellow", "passed": "green", "failed": "red"}.get(canary.state, "cyan")
    states = ", ".join(f"{n} {s}" for s, n in sorted(canary.states.items()) if n) or "none yet"
    line = (f"canary: [{colour}]{canary.state}[/{colour}] ({canary.size} first: {states}); "
            f"{canary.held} held")
    if canary.reason:
        line += f"; {escape(canary.reason)}"
    return line


def _record_json(r: ImportRecord) -> dict[str, Any]:
    return {
        "import_id": r.import_id, "template": r.template,
        "template_version": r.template_version, "file": r.file_name, "lane": r.lane,
        "runs": r.runs, "started_at": r.started_at.isoformat(),
        "last_started_at": r.last_started_at.isoformat(),
        "finished_at": r.finished_at.isoformat() if r.finished_at else None,
        "rows_read": r.rows_read, "rows_enqueued": r.rows_enqueued,
        "rows_created": r.rows_created, "rows_skipped": r.rows_skipped,
    }


_t = when



__all__ = ["EXIT_ROWS_SKIPPED", "import_", "imports"]
