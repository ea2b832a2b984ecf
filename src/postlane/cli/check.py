"""``postlane check``: verify a deployment before it takes traffic (exit 1 when anything is wrong).

It reads what ``postlane worker`` reads, in the same order: the command line, then the
environment (``POSTLANE_PROVIDER``, ``POSTLANE_RATE``, ...), then the configuration file's
``[check]`` table, then its ``[worker]`` table, so the check sees what the worker will run.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from postlane.check import SKIPPABLE, CheckSettings, Finding, run_checks, summary
from postlane.cli import options
from postlane.core.lanes import DEFAULT_CONCURRENCY
from postlane.core.rates import DEFAULT_HEADROOM

_WORKER_TABLE = "worker"
_FROM_WORKER = {"provider": str, "rate": str, "limiter": str, "lanes": str,
                "headroom": float, "concurrency": int, "retry_base": str, "retry_cap": str,
                "retry_budget": str, "bulk_lanes": str, "unsubscribe_url": str,
                "unsubscribe_mailto": str}


def check(
    ctx: typer.Context,
    provider: Annotated[str | None, typer.Option(**options.PROVIDER)] = None,
    rate: Annotated[str | None, typer.Option(**options.RATE)] = None,
    headroom: Annotated[float, typer.Option(**options.HEADROOM)] = DEFAULT_HEADROOM,
    limiter: Annotated[str | None, typer.Option(**options.LIMITER)] = None,
    concurrency: Annotated[int, typer.Option(**options.CONCURRENCY)] = DEFAULT_CONCURRENCY,
    lanes: Annotated[str | None, typer.Option(**options.LANES)] = None,
    lane_expiry: Annotated[str | None, typer.Option(
        envvar="POSTLANE_LANE_EXPIRY", show_envvar=True,
        help="How long each lane's messages stay useful, e.g. interactive=15m,bulk=24h "
             "[default: interactive 15m, bulk 24h].")] = None,
    retry_base: Annotated[str | None, typer.Option(**options.RETRY_BASE)] = None,
    retry_cap: Annotated[str | None, typer.Option(**options.RETRY_CAP)] = None,
    retry_budget: Annotated[str | None, typer.Option(**options.RETRY_BUDGET)] = None,
    bulk_lanes: Annotated[str | None, typer.Option(**options.BULK_LANES)] = None,
    unsubscribe_url: Annotated[str | None, typer.Option(**options.UNSUBSCRIBE_URL)] = None,
    unsubscribe_mailto: Annotated[str | None, typer.Option(
        **options.UNSUBSCRIBE_MAILTO)] = None,
    skip: Annotated[list[str] | None, typer.Option(
        help="Leave out a group of checks (repeatable): database, limiter, provider, rate, "
             "lanes. An API host (postlane serve) needs only the database.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Verify a deployment before it takes traffic: database and migrations, limiter,
    provider, lanes, retry budgets, one-click unsubscribe, rate. Exit 1 if anything is
    wrong."""
    values: dict[str, Any] = {"provider": provider, "rate": rate, "limiter": limiter,
                              "lanes": lanes, "headroom": headroom, "concurrency": concurrency,
                              "retry_base": retry_base, "retry_cap": retry_cap,
                              "retry_budget": retry_budget, "bulk_lanes": bulk_lanes,
                              "unsubscribe_url": unsubscribe_url,
                              "unsubscribe_mailto": unsubscribe_mailto}
    values.update(_worker_defaults(ctx, values))
    unknown = {name.strip() for item in skip or () for name in item.split(",")} - set(SKIPPABLE)
    if unknown:
        raise typer.BadParameter(f"unknown check {', '.join(sorted(unknown))!r} (choose from "
                                 f"{', '.join(SKIPPABLE)})", param_hint="--skip")
    settings = CheckSettings(
        db=ctx.obj.db, provider=values["provider"], rate=values["rate"],
        limiter=values["limiter"], lanes=values["lanes"], lane_expiry=lane_expiry,
        retry_base=values["retry_base"], retry_cap=values["retry_cap"],
        retry_budget=values["retry_budget"],
        headroom=values["headroom"], concurrency=values["concurrency"],
        bulk_lanes=values["bulk_lanes"], unsubscribe_url=values["unsubscribe_url"],
        unsubscribe_mailto=values["unsubscribe_mailto"],
        skip=frozenset(name.strip() for item in skip or () for name in item.split(",")),
    )

    from postlane.cli.shell import run_async

    findings = run_async(run_checks(settings))
    failed = any(f.failed for f in findings)
    if as_json:
        print(json.dumps({"ok": not failed, "findings": [f.as_json() for f in findings],
                          "summary": summary(findings)}))
    else:
        _print(findings)
    if failed:
        raise typer.Exit(1)


def _worker_defaults(ctx: typer.Context, values: dict[str, Any]) -> dict[str, Any]:
    """Options given nowhere else take the value of the config file's ``[worker]`` table."""
    table = (ctx.parent.default_map or {}).get(_WORKER_TABLE) if ctx.parent else None
    if not isinstance(table, dict):
        return {}
    found: dict[str, Any] = {}
    for name, kind in _FROM_WORKER.items():
        source = ctx.get_parameter_source(name)  # command line, environment, [check] table?
        if (source is not None and source.name != "DEFAULT") or name not in table:
            continue
        try:
            found[name] = kind(table[name])
        except (TypeError, ValueError):
            raise typer.BadParameter(
                f"[worker] {name} = {table[name]!r} in the configuration file is not a "
                f"{kind.__name__}") from None
    return found


_MARK = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}


def _print(findings: list[Finding]) -> None:
    width = max((len(f.check) for f in findings), default=0)
    for finding in findings:
        print(f"{_MARK[finding.status]}  {finding.check:<{width}}  {finding.message}")
        if finding.hint:
            print(f"{'':4}  {'':<{width}}  -> {finding.hint}")
    print(summary(findings))
