"""A/B of the no-op drain: source trees side by side, rounds interleaved, with the CPU
each side spends per job in the workers and in PostgreSQL (or SQLite, ``--engine``).

    git archive <commit> src | tar -x -C /tmp/a      # the "before" tree
    python -m bench.ab_drain --jobs 50000 --rounds 3 before=/tmp/a after=.
    python -m bench.ab_drain before=/tmp/a pgqueuer  # a peer in the same rounds
    python -m bench.ab_drain --engine sqlite before=/tmp/a after=.   # one process each
    python -m bench.ab_drain a=. b=.@--batch-size,200                  # settings side by side

Each name=DIR runs ``postlane worker --provider noop:// --drain`` (``--procs`` processes,
``--extra`` arguments) with ``PYTHONPATH=DIR/src``, on a fresh database filled by that tree's
``enqueue_many``; ``pgqueuer`` runs the throughput bench's PgQueuer consumers. With
``--engine sqlite`` each Postlane side drains a fresh SQLite file instead (one process
unless ``--procs`` says otherwise, as in the throughput bench), and there is no PostgreSQL
column. jobs/s is measured as in the throughput bench (database times for Postlane, the
handler's for peers).
CPU µs/job: the consumers' own (``RUSAGE_CHILDREN``: Python start-up included, ~1 s a
process), and PostgreSQL's, read from ``/proc`` (every ``postgres`` process, plus what the
postmaster collected from backends that exited). On a shared or throttled machine rows/s
moves by tens of percent between rounds; CPU per job moves less, and only a difference
seen in every round is one. Nothing is written to RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench import _harness as h
from bench._common import fresh_pg_database
from bench.throughput import PEERS_DIR, PEERS_PY, checkpoint, ensure_peers_venv, peer_env

_TICK = os.sysconf("SC_CLK_TCK")


def postgres_cpu_s() -> float:
    """CPU seconds of every PostgreSQL process so far, exited backends included (they are
    the postmaster's children: it collects their time when it reaps them)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name = text[text.index("(") + 1:text.rindex(")")]
        if not name.startswith("postgres"):
            continue
        fields = text[text.rindex(")") + 2:].split()
        parent = fields[1]
        utime, stime, cutime, cstime = map(int, fields[11:15])
        total += utime + stime
        try:  # the postmaster: its parent is not a postgres process
            postmaster = "(postgres)" not in Path(f"/proc/{parent}/stat").read_text()
        except OSError:
            postmaster = True
        if postmaster:
            total += cutime + cstime
    return total / _TICK


@dataclass
class Run:
    jobs_per_s: float
    consumer_us: float
    postgres_us: float | None
    """None on SQLite: the database is inside the consumer."""


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_postlane(src: Path, jobs: int, procs: int, extra: list[str], work: Path,
                 engine: str = "postgres") -> Run:
    env = {"PYTHONPATH": str(src / "src")}
    with _database(engine, work / f"ab-{src.name}.db") as db:
        subprocess.run([str(h.POSTLANE_BIN), "--db", db, "migrate"], env=h.clean_env(**env),
                       check=True, capture_output=True)
        fill = ("import asyncio, sys; from bench import _harness as h; "
                "from postlane.store import open_store\n"
                "async def fill():\n"
                f"    messages = h.bulk_messages({jobs}, tag='ab')\n"
                f"    async with open_store({db!r}) as store:\n"
                f"        for i in range(0, {jobs}, 5000):\n"
                "            await store.enqueue_many(messages[i:i + 5000])\n"
                "asyncio.run(fill())")
        subprocess.run([sys.executable, "-c", fill], check=True,
                       env=h.clean_env(PYTHONPATH=f"{src / 'src'}{os.pathsep}{h.BENCH_DIR.parent}"))
        if engine == "postgres":
            checkpoint(db)
        cpu0, pg0 = _children_cpu_s(), postgres_cpu_s()
        workers = [h.postlane(db, "worker", "--provider", "noop://", "--log-level", "WARNING",
                              "--drain", *extra, log_path=work / f"ab-{src.name}-{i}.log",
                              name=f"worker {i}", **env) for i in range(procs)]
        for proc in workers:
            if proc.wait(600) != 0:
                raise SystemExit(f"a worker failed:\n{proc.log_tail()}")
        cpu1, pg1 = _children_cpu_s(), postgres_cpu_s()
        (first, last, sent), = h.query(
            db, f"SELECT {h.epoch(db, 'min(claimed_at)')}, {h.epoch(db, 'max(finished_at)')},"
                " count(*) FILTER (WHERE state = 'sent') FROM postlane_deliveries")
    if sent != jobs:
        raise SystemExit(f"{src}: {sent} of {jobs} sent")
    return Run(jobs / (float(last) - float(first)), (cpu1 - cpu0) / jobs * 1e6,
               (pg1 - pg0) / jobs * 1e6 if engine == "postgres" else None)


@contextlib.contextmanager
def _database(engine: str, sqlite_path: Path) -> Iterator[str]:
    """A fresh database: a new PostgreSQL database, or a new SQLite file."""
    if engine == "postgres":
        with fresh_pg_database("postlane_ab") as db:
            yield db
        return
    for leftover in sqlite_path.parent.glob(sqlite_path.name + "*"):  # the file, -wal, -shm
        leftover.unlink()
    yield f"sqlite:///{sqlite_path}"


def run_pgqueuer(jobs: int, work: Path) -> Run:
    stats = work / "pgq-stats"
    stats.mkdir(exist_ok=True)
    for old in stats.iterdir():
        old.unlink()
    env = peer_env(stats)
    script = str(PEERS_DIR / "pgqueuer_peer.py")
    with fresh_pg_database("postlane_ab") as db:
        for args in (["install", "--dsn", db],
                     ["enqueue", "--dsn", db, "--jobs", str(jobs), "--batch", "5000"]):
            subprocess.run([str(PEERS_PY), script, *args], env=env, check=True,
                           capture_output=True)
        checkpoint(db)
        cpu0, pg0 = _children_cpu_s(), postgres_cpu_s()
        consumers = [h.Proc([str(PEERS_PY), script, "consume", "--dsn", db, "--managers", "2",
                             "--batch", "100"], work / f"pgq-{i}.log", env=env)
                     for i in range(2)]
        for proc in consumers:
            if proc.wait(600) != 0:
                raise SystemExit(f"pgqueuer failed:\n{proc.log_tail()}")
        cpu1, pg1 = _children_cpu_s(), postgres_cpu_s()
    counts = [json.loads(p.read_text()) for p in stats.glob("*.json")]
    seconds = max(c["last"] for c in counts) - min(c["first"] for c in counts)
    return Run(jobs / seconds, (cpu1 - cpu0) / jobs * 1e6, (pg1 - pg0) / jobs * 1e6)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.ab_drain",
                                description=__doc__.split("\n")[0])
    p.add_argument("sides", nargs="+",
                   help="name=DIR (a source tree), name=DIR@ARGS (with its own `postlane "
                        "worker` arguments, spaces as commas) or pgqueuer")
    p.add_argument("--jobs", type=int, default=50_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--engine", choices=("postgres", "sqlite"), default="postgres")
    p.add_argument("--procs", type=int, default=None,
                   help="worker processes per Postlane side (default: 2 on PostgreSQL, 1 on "
                        "SQLite)")
    p.add_argument("--extra", default="", help="more `postlane worker` arguments")
    args = p.parse_args()
    procs = args.procs or (2 if args.engine == "postgres" else 1)
    sides = [_side(s) for s in args.sides]
    if any(path is None for _, path, _ in sides):
        ensure_peers_venv()
    runs: dict[str, list[Run]] = {name: [] for name, _, _ in sides}
    with h.workdir("ab") as work:
        for round_ in range(1, args.rounds + 1):
            for name, path, own in sides:
                started = time.time()
                run = (run_pgqueuer(args.jobs, work) if path is None else
                       run_postlane(path.resolve(), args.jobs, procs,
                                    args.extra.split() + own, work, args.engine))
                runs[name].append(run)
                print(f"round {round_} {name:>12}: {run.jobs_per_s:8,.0f} jobs/s   "
                      f"consumers {run.consumer_us:6.1f} µs/job   "
                      f"{_postgres_column([run])}({time.time() - started:.0f} s)", flush=True)
    for name, done in runs.items():
        print(f"median {name:>12}: {statistics.median(r.jobs_per_s for r in done):8,.0f} jobs/s"
              f"   consumers {statistics.median(r.consumer_us for r in done):6.1f} µs/job"
              f"   {_postgres_column(done)}")


def _side(spec: str) -> tuple[str, Path | None, list[str]]:
    """(name, source tree or None for PgQueuer, this side's own worker arguments)."""
    if spec == "pgqueuer":
        return spec, None, []
    name, eq, rest = spec.partition("=")
    tree, _, own = rest.partition("@")
    if not eq or not name or not tree:
        raise SystemExit(f"ab_drain: side {spec!r} is not name=DIR, name=DIR@ARGS or pgqueuer")
    return name, Path(tree), [a for a in own.split(",") if a]


def _postgres_column(runs: list[Run]) -> str:
    """PostgreSQL's CPU per job, the median of ``runs``; nothing for SQLite sides."""
    values = [r.postgres_us for r in runs if r.postgres_us is not None]
    return f"PostgreSQL {statistics.median(values):6.1f} µs/job   " if values else ""


if __name__ == "__main__":
    main()
