"""Bulk import throughput: ``postlane.imports.import_csv`` over a generated CSV (default one
million rows) into PostgreSQL (COPY per batch) and SQLite, with the peak memory of the
importing process.

Each engine's import runs in a child process of its own, so ``ru_maxrss`` is that import's
peak and nothing else's. The child stops at ``--budget`` seconds if the file is not done by
then (the batch in flight completes); the report then says so and extrapolates the time for
the whole file from the measured rate, labelled as such.

    python -m bench.import_bench                 # 1,000,000 rows, both engines, 180 s budget
    python -m bench.import_bench --rows 100000 --engines sqlite --no-write

Writes the ``import`` section of ``bench/RESULTS.md`` (``--no-write`` to only print it).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._common import (
    command_line,
    fresh_pg_database,
    machine_info,
    pg_admin_url,
    write_section,
)

TEMPLATE = {
    "subject": "Welcome to Postlane, {{ first_name }}",
    "text": "Hello {{ first_name }} {{ last_name }},\n\nyour account {{ user_id }} is ready "
            "on the {{ plan }} plan.\n",
    "html": "<p>Hello {{ first_name }} {{ last_name }},</p><p>your account {{ user_id }} is "
            "ready on the <b>{{ plan }}</b> plan.</p>",
}


def generate(path: Path, rows: int) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["user_id", "email", "first_name", "last_name", "plan"])
        plans = ("free", "pro", "team")
        for i in range(rows):
            writer.writerow([f"u{i}", f"user{i}@example.com", f"First{i}", f"Last{i}",
                             plans[i % 3]])


def maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


class _Budget(Exception):
    pass


async def child(url: str, path: str, budget: float, batch: int) -> dict[str, Any]:
    from postlane import open_store
    from postlane.imports import import_csv
    from postlane.templates import add_template

    async with open_store(url) as store:
        await store.migrate()
        await add_template(store, "welcome", **TEMPLATE)
        baseline = maxrss_mib()
        started = time.monotonic()
        cpu0 = time.process_time()
        stopped = False
        samples: list[tuple[int, float]] = []

        def on_progress(phase: str, done: int, total: int) -> None:
            if len(samples) < 1 or done - samples[-1][0] > total // 20:
                samples.append((done, maxrss_mib()))
            if time.monotonic() - started > budget and done < total:
                raise _Budget

        try:
            report = await import_csv(store, path, template="welcome", import_id="bench",
                                      batch_size=batch, on_progress=on_progress)
            rows = report.rows_read
        except _Budget:
            stopped = True
            rows = (await store.import_counts("bench")).created
        elapsed = time.monotonic() - started
        cpu = time.process_time() - cpu0
        created = (await store.import_counts("bench")).created
    return {"rows": rows, "created": created, "elapsed_s": elapsed, "cpu_s": cpu,
            "stopped": stopped, "baseline_mib": baseline, "peak_mib": maxrss_mib(),
            "rss_at_10pct_mib": samples[min(2, len(samples) - 1)][1] if samples else None}


def run_child(url: str, path: Path, args: argparse.Namespace) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.import_bench", "--child", url, str(path),
         "--budget", str(args.budget), "--batch-size", str(args.batch_size)],
        capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parent.parent,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def report(results: dict[str, dict[str, Any]], args: argparse.Namespace, info: str,
           elapsed: float) -> str:
    lines = [
        "## Import",
        "",
        "`postlane import` without the command-line start-up: `postlane.imports.import_csv`",
        "streaming a generated CSV (user_id, email, first_name, last_name, plan), rendering",
        "subject, text and html (Jinja2, sandboxed, html autoescaped), validating each row,",
        f"and writing batches of {args.batch_size:,} through "
        "`Store.enqueue_many_if_template_usable`",
        "(COPY into a staging table, then one INSERT on PostgreSQL; one transaction of",
        "single-row inserts on SQLite), with the import's counters in each batch's",
        "transaction and the next batch parsed while one is written. Peak memory is the",
        "child process's `ru_maxrss` (it includes the interpreter and the libraries:",
        "*baseline* is after imports and migration, before the first row). *CPU µs/row* is",
        "the importing process's own CPU time per row (10⁶ divided by it is the rate the",
        "importer alone could sustain); the rest of the wall time is the database, and on a",
        "shared machine (see the load average) waiting for a CPU.",
        "",
        info,
        f"- Command: `{command_line()}` ({elapsed / 60:.1f} min; load average "
        f"{args.load[0]} before, {args.load[1]} after)",
        f"- File: {args.rows:,} rows, {args.file_mib:.1f} MiB; budget {args.budget:.0f} s "
        "per engine",
        "",
        "| Engine | Rows imported | Wall s | Rows/s | CPU µs/row (importer) "
        "| RSS baseline MiB | RSS at ~10% MiB | Peak RSS MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    notes = []
    for engine, r in results.items():
        rate = r["rows"] / r["elapsed_s"] if r["elapsed_s"] else 0.0
        lines.append(
            f"| {engine} | {r['rows']:,}{' (stopped)' if r['stopped'] else ''} "
            f"| {r['elapsed_s']:.1f} | {rate:,.0f} | {r['cpu_s'] / max(r['rows'], 1) * 1e6:.0f} "
            f"| {r['baseline_mib']:.0f} | {r['rss_at_10pct_mib'] or 0:.0f} "
            f"| {r['peak_mib']:.0f} |")
        if r["stopped"]:
            notes.append(
                f"- **{engine}: {args.rows:,} rows did not fit the {args.budget:.0f} s budget**; "
                f"{r['rows']:,} rows were imported when it stopped. *Extrapolated* (not "
                f"measured) time for all {args.rows:,} rows at that rate: "
                f"{args.rows / rate:,.0f} s ({args.rows / rate / 60:.1f} min).")
    lines.append("")
    lines += notes
    if notes:
        lines.append("")
    growth = max(r["peak_mib"] - r["baseline_mib"] for r in results.values())
    lines.append(f"Largest growth from baseline to peak: {growth:.0f} MiB. The file is streamed "
                 "and at most two batches are held at once, so this does not grow with the "
                 "file.")
    lines.append("")
    return "\n".join(lines)


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.import_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--engines", default="postgres,sqlite")
    p.add_argument("--budget", type=float, default=180.0,
                   help="seconds per engine before the import is stopped")
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--child", nargs=2, metavar=("URL", "CSV"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        url, path = args.child
        print(json.dumps(asyncio.run(child(url, path, args.budget, args.batch_size))))
        return
    info = machine_info(pg_admin_url() if "postgres" in args.engines else None).markdown()
    load_before = loadavg()
    started = time.monotonic()
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="postlane-import-bench-") as folder:
        path = Path(folder) / "users.csv"
        generate(path, args.rows)
        args.file_mib = os.path.getsize(path) / 1024 / 1024
        print(f"generated {args.rows:,} rows ({args.file_mib:.1f} MiB)", flush=True)
        for engine in args.engines:
            if engine == "postgres":
                with fresh_pg_database("postlane_import_bench") as url:
                    results[engine] = run_child(url, path, args)
            else:
                results[engine] = run_child(f"sqlite:///{Path(folder) / 'bench.db'}", path, args)
            print(engine, results[engine], flush=True)
    args.load = (load_before, loadavg())
    text = report(results, args, info, time.monotonic() - started)
    print()
    print(text)
    if not args.no_write:
        write_section("import", text)
        print("\nwritten to bench/RESULTS.md (section `import`)")


if __name__ == "__main__":
    main()
