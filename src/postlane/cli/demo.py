"""``postlane demo``: the README's first command."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from postlane.cli.shell import console, run_async
from postlane.demo import DemoPlan, default_sandbox, print_summary, run_demo
from postlane.errors import ConfigurationError
from postlane.providers.registry import open_provider
from postlane.store import open_store


def demo(
    ctx: typer.Context,
    provider: Annotated[str | None, typer.Option(
        help="Provider URL instead of the built-in faulty sandbox (e.g. smtp://127.0.0.1:25).")
    ] = None,
    bulk: Annotated[int, typer.Option(help="Messages in the digest burst.")] = 10_000,
    interactive: Annotated[int, typer.Option(help="Resets and codes sent during it.")] = 1200,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print the summary as one JSON object on the last line.")] = False,
) -> None:
    """Run the whole pipeline on a throwaway SQLite database (or --db) and show it working."""
    db = ctx.obj.db if ctx.obj.db_explicit else None
    if db is None:
        folder = Path(tempfile.mkdtemp(prefix="postlane-demo-"))
        db = f"sqlite:///{folder / 'demo.db'}"
    plan = DemoPlan(bulk=bulk, interactive=interactive)
    try:
        chosen = open_provider(provider) if provider else default_sandbox(plan)
    except ConfigurationError as exc:
        raise typer.BadParameter(str(exc), param_hint="--provider") from None
    console.print(f"database: {db}\nprovider: {chosen.name}; ceiling {plan.ceiling:g}/s; "
                  f"{bulk} bulk digests, {interactive} interactive messages arriving during them")

    async def _run() -> object:
        async with open_store(db) as store:
            return await run_demo(store, chosen, plan, console, live=not as_json)

    result = run_async(_run())
    from postlane.demo import DemoResult

    assert isinstance(result, DemoResult)
    print_summary(result, console, db, command=invoked_as(),
                  timeline_key=(result.sms_fallbacks[0]["email_key"] if result.sms_fallbacks
                                else "reset:3" if interactive > 3 else "digest:2026-11:0"))
    if as_json:
        print(json.dumps(result.as_json()))
    if not result.ok:
        raise typer.Exit(1)


def invoked_as() -> str:
    """How the shell that ran this runs postlane again: ``postlane`` when that name finds
    this program, else the path it was started by (``.venv/bin/postlane`` when the venv is
    not activated, as after the README's first command)."""
    started = sys.argv[0]
    if Path(started).name != "postlane":
        return "postlane"  # not the console script (python -c, a test runner)
    found = shutil.which("postlane")
    try:
        if found and os.path.samefile(found, started):
            return "postlane"
    except OSError:
        pass
    return shlex.quote(started)
