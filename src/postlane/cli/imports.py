"""``postlane import FILE`` and ``postlane imports show|list|pause|resume``."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from postlane.cli.main import console, err_console, run_with_store
from postlane.errors import ImportRejected, PostlaneError
from postlane.imports import (
    DEFAULT_BATCH_SIZE,
    ImportReport,
    ImportStatus,
    import_csv,
    import_status,
    pause,
    resume,
)
from postlane.store.base import ImportRecord, Store

imports = typer.Typer(help="Bulk imports as an operator sees them: show, list, pause, resume.",
                      no_args_is_help=True)

SHOWN_PROBLEMS = 50


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
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Enqueue one templated delivery per row (key <template>:<user_id>:<import-id>)."""
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
                                        on_progress=on_progress)
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
    _print_problems([(p.line, p.reason) for p in report.problems], report.rows_skipped)


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
    title = f"import {import_id}" + ("  [yellow]PAUSED[/yellow]" if status.paused else "")
    console.print(title)
    record = status.record
    if record is not None:
        finished = (f"finished {_t(record.finished_at)}" if record.finished_at
                    else "[yellow]not finished[/yellow] (running, or stopped: re-run to resume)")
        console.print(f"template {record.template} v{record.template_version}, file "
                      f"{record.file_name}, lane {record.lane}, run {record.runs}, started "
                      f"{_t(record.last_started_at)}, {finished}")
        console.print(f"rows: {record.rows_read} read, {record.rows_enqueued} enqueued "
                      f"({record.rows_created} new in this run), {record.rows_skipped} skipped")
    table = Table(show_header=True)
    for column in ("created", "claimed", "accepted", "waiting retry", "queued", "dead",
                   "oldest waiting (s)"):
        table.add_column(column, justify="right")
    table.add_row(str(d["created"]), str(d["claimed"]), str(d["accepted"]),
                  str(d["waiting_retry"]), str(d["queued"]), str(d["dead"]),
                  f"{d['oldest_waiting_age_s']:.1f}")
    console.print(table)
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

    async def _list(store: Store) -> tuple[list[ImportRecord], set[str]]:
        from postlane.worker.controls import IMPORT_PAUSE

        controls = await store.get_controls()
        paused = {n.removeprefix(IMPORT_PAUSE) for n in controls if n.startswith(IMPORT_PAUSE)}
        return await store.list_imports(limit), paused

    records, paused = run_with_store(ctx, _list)
    if as_json:
        print(json.dumps([{**_record_json(r), "paused": r.import_id in paused}
                          for r in records]))
        return
    if not records:
        console.print("no imports")
        return
    table = Table()
    for column in ("import", "template", "file", "started", "finished", "read", "enqueued",
                   "skipped", ""):
        table.add_column(column)
    for r in records:
        table.add_row(r.import_id, f"{r.template} v{r.template_version}", r.file_name,
                      _t(r.last_started_at), _t(r.finished_at) if r.finished_at else "-",
                      str(r.rows_read), str(r.rows_enqueued), str(r.rows_skipped),
                      "paused" if r.import_id in paused else "")
    console.print(table)


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
    """Let workers claim this import's deliveries again."""

    async def _resume(store: Store) -> None:
        await resume(store, import_id)

    run_with_store(ctx, _resume)
    console.print(f"import {import_id} resumed")


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


def _t(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def register(app: typer.Typer) -> None:
    app.command("import")(import_)
    app.add_typer(imports, name="imports")


__all__ = ["import_", "imports", "register"]
