"""Dispatch throughput: pre-enqueued no-op deliveries drained end to end, Postlane next to
Python peers, side by side in one run on the same PostgreSQL server (and Redis).

    python -m bench --only throughput            # 50,000 jobs per system
    python -m bench.throughput --jobs 10000      # this section alone

For every system: a fresh database (or Redis queue), ``--jobs`` jobs enqueued with the
system's bulk API (timed: *enqueue*), a ``CHECKPOINT``, then the consumer processes are
started and the queue is drained (timed: *drain*, from the first job taken to the last one
done, so process start-up is not counted; *wall* adds it: from launching the consumers to
the last job done). jobs/s = jobs / drain. Every system drains ``--rounds`` times (3), the
systems taking turns, and reports its median round: on a shared machine whose speed drifts
by tens of percent from one minute to the next, a single drain each would compare two
moments as much as two systems.

- Postlane: ``postlane worker --provider noop:// --drain`` processes (real CLI, default
  settings: concurrency 200, batches of 100, lanes interactive=70/bulk=30, jobs in ``bulk``
  which borrows the idle interactive slots). Times from the database: first ``claimed_at``
  to the last ``finished_at`` -- the ack is written, so this is the stricter end.
- ``postlane-pg-2-pdf`` and ``postlane-sqlite-1-pdf``: the same drain with every tenth
  delivery carrying a 200 KB PDF (incompressible bytes, as a real PDF's streams are), stored
  beside it at enqueue and read by the worker before the send (``--pdf-share`` changes the
  share). The no-op adapter builds no MIME: the figure is the storage and the load, what
  large content costs the claim path and the dispatch around it.
- Peers run in ``bench/.venv-peers``; their handler only counts (``bench/peers/_peerstats.py``),
  times are the handler's first and last call.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import psycopg

from bench import _harness as h
from bench._common import fresh_pg_database
from postlane.core.attachments import Attachment
from postlane.core.message import Message
from postlane.worker.runner import WorkerConfig

_CONFIG = WorkerConfig()
_DEFAULTS = f"defaults: concurrency {_CONFIG.concurrency}, batch {_CONFIG.batch_size}"
PEERS_DIR = h.BENCH_DIR / "peers"
PEERS_VENV = h.BENCH_DIR / ".venv-peers"
PEERS_PY = PEERS_VENV / "bin" / "python"
PEER_PACKAGES = ("pgqueuer", "asyncpg", "procrastinate", "dramatiq", "celery", "kombu",
                 "redis", "psycopg")


# -- the peers' virtualenv -----------------------------------------------------------------
def ensure_peers_venv(log: Path | None = None) -> dict[str, str]:
    """Create ``bench/.venv-peers`` (once; again when requirements.txt changes) and return
    the installed versions of the peers."""
    requirements = PEERS_DIR / "requirements.txt"
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()
    stamp = PEERS_VENV / ".requirements.sha256"
    if not PEERS_PY.exists() or not stamp.exists() or stamp.read_text().strip() != digest:
        print(f"bench: creating {PEERS_VENV} (the peers' virtualenv)...", flush=True)
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", "--clear", str(PEERS_VENV)], check=True)
        out = subprocess.run(
            [str(PEERS_PY), "-m", "pip", "install", "-q", "--disable-pip-version-check",
             "-r", str(requirements)], capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"pip install of the peers failed:\n{out.stdout}\n{out.stderr}")
        stamp.write_text(digest + "\n")
    code = ("import importlib.metadata as m, json; print(json.dumps({n: m.version(n) "
            f"for n in {list(PEER_PACKAGES)!r}}}))")
    out = subprocess.run([str(PEERS_PY), "-c", code], capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout))


def peer_env(stats_dir: Path, **extra: str) -> dict[str, str]:
    env = h.clean_env(BENCH_PEER_STATS=str(stats_dir), **extra)
    env["PYTHONPATH"] = str(PEERS_DIR)
    env["PATH"] = f"{PEERS_VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.pop("VIRTUAL_ENV", None)
    return env


def read_peer_stats(stats_dir: Path) -> tuple[int, float | None, float | None]:
    count, first, last = 0, None, None
    for path in stats_dir.glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        count += data["count"]
        if data["first"] is not None:
            first = data["first"] if first is None else min(first, data["first"])
            last = data["last"] if last is None else max(last, data["last"])
    return count, first, last


# -- results ---------------------------------------------------------------------------------
@dataclass
class Result:
    system: str
    backend: str
    config: str
    jobs: int
    enqueue_s: float
    enqueue_how: str
    drain_s: float
    wall_s: float
    ok: bool = True
    note: str = ""
    done: int | None = None
    """Jobs done when the drain was capped at ``--drain-cap`` seconds (None: all of them)."""
    rounds: tuple[float, ...] = ()
    """Every round's jobs/s, in run order, when this is the median round of several."""

    @property
    def rate(self) -> float:
        done = self.jobs if self.done is None else self.done
        return done / self.drain_s if self.drain_s > 0 else 0.0

    @property
    def enqueue_rate(self) -> float:
        return self.jobs / self.enqueue_s if self.enqueue_s > 0 else 0.0


def checkpoint(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")


# -- Postlane --------------------------------------------------------------------------------
PDF_BYTES = 200 * 1024
PDF_SHARE = 0.10


def with_pdfs(messages: list[Message], share: float) -> list[Message]:
    """Every ``1/share``-th message with a 200 KB PDF attached (the same bytes each time:
    one copy stored per delivery all the same, as a real receipt's would be)."""
    if share <= 0:
        return messages
    pdf = b"%PDF-1.4\n" + random.Random(0).randbytes(PDF_BYTES - 9)
    part = (Attachment("receipt.pdf", pdf, "application/pdf"),)
    every = max(1, round(1 / share))
    return [replace(m, attachments=part) if i % every == 0 else m
            for i, m in enumerate(messages)]


async def _store_load(db: str, jobs: int, tag: str, chunk: int = 5000,
                      pdf_share: float = 0.0) -> float:
    from postlane.store import open_store

    messages = with_pdfs(h.bulk_messages(jobs, tag=tag), pdf_share)
    if pdf_share:
        chunk = 500  # 10 MB of PDFs per call, not 100
    async with open_store(db) as store:
        started = time.perf_counter()
        for i in range(0, jobs, chunk):
            await store.enqueue_many(messages[i:i + chunk])
        return time.perf_counter() - started


TUNED = ("--concurrency", "400", "--batch-size", "100")
"""Postlane's tuned row: several claims in flight per process (the default concurrency of
100 equals the batch size, so each process waits for one batch's claim, start mark and sends
before it claims the next)."""


def run_postlane(db: str, work: Path, jobs: int, procs: int, backend: str,
                 timeout: float, extra: tuple[str, ...] = (),
                 pdf_share: float = 0.0) -> Result:
    h.migrate(db, work)
    enqueue_s = asyncio.run(_store_load(db, jobs, f"tp{procs}", pdf_share=pdf_share))
    if backend == "PostgreSQL":
        checkpoint(db)
    launched = time.time()
    workers = [h.worker(db, "noop://", "--drain", *extra,
                        log_path=work / f"postlane-{procs}-{i}.log",
                        name=f"postlane worker {i}") for i in range(procs)]
    capped = False
    try:
        for proc in workers:
            if proc.wait(max(1.0, launched + timeout + 30 - time.time())) is None:
                capped = True
                break
    finally:
        for proc in workers:
            proc.stop()
    failed = [] if capped else [p for p in workers if p.popen.returncode != 0]
    (first,), = h.query(db, f"SELECT {h.epoch(db, 'min(claimed_at)')} "
                            "FROM postlane_deliveries")
    (last, sent), = h.query(db, f"SELECT {h.epoch(db, 'max(finished_at)')}, "
                                "count(*) FILTER (WHERE state = 'sent') FROM postlane_deliveries"
                            if backend == "PostgreSQL" else
                            "SELECT max(finished_at), sum(state = 'sent') FROM postlane_deliveries")
    ok = (sent == jobs or capped) and not failed
    note = "" if ok else f"{sent} of {jobs} sent; " + "; ".join(p.log_tail(5) for p in failed)
    pdfs = (f"; {pdf_share:.0%} of the deliveries carry a {PDF_BYTES // 1024} KB PDF"
            if pdf_share else "")
    return Result(
        "Postlane", backend,
        f"{procs} × `postlane worker --provider noop:// --drain"
        + (f" {' '.join(extra)}`" if extra else f"` ({_DEFAULTS})") + pdfs,
        jobs, enqueue_s, f"`Store.enqueue_many`, {'500' if pdf_share else '5,000'} per call"
        + (" (COPY)" if backend == "PostgreSQL" else ""),
        float(last) - float(first), float(last) - launched, ok, note,
        int(sent) if capped else None)


# -- peers -----------------------------------------------------------------------------------
def _run_peer_script(args: list[str], env: dict[str, str],
                     timeout: float = 900) -> dict[str, float]:
    out = subprocess.run([str(PEERS_PY), *args], env=env, capture_output=True, text=True,
                         timeout=timeout, check=False, cwd=PEERS_DIR)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    return dict(json.loads(lines[-1])) if lines else {}


def _drain_peer(consumers: list[h.Proc], stats: Path, jobs: int, launched: float,
                cap: float, *, exits_by_itself: bool) -> tuple[float, float, bool, str, int | None]:
    """Wait for ``jobs`` handled (or ``cap`` seconds after the first one: then the rate is
    taken over the jobs done so far); (drain, wall, ok, note, done if capped)."""
    note = ""
    done: int | None = None
    deadline = time.monotonic() + cap + 120  # start-up may take a while; jobs may not
    while True:
        count, first, last = read_peer_stats(stats)
        if count >= jobs:
            break
        if all(not p.alive() for p in consumers):
            time.sleep(0.2)
            count, first, last = read_peer_stats(stats)
            if count < jobs:
                note = f"consumers exited after {count} of {jobs} jobs"
            break
        if first is not None and time.time() - first > cap:
            done = count
            break
        if time.monotonic() > deadline:
            note = f"timed out with {count} of {jobs} jobs"
            break
        time.sleep(0.05)
    if exits_by_itself and done is None:
        for proc in consumers:
            proc.wait(60)
    for proc in consumers:
        proc.stop()
    if done is not None:
        count, first, last = read_peer_stats(stats)
        done = count
    if first is None or last is None:
        return 0.0, 0.0, False, note or "no job ran", None
    return last - first, last - launched, not note, note, done


def run_pgqueuer(db: str, work: Path, jobs: int, timeout: float) -> Result:
    env = peer_env(work / "pgq-stats")
    (work / "pgq-stats").mkdir()
    script = str(PEERS_DIR / "pgqueuer_peer.py")
    _run_peer_script([script, "install", "--dsn", db], env)
    enqueue_s = _run_peer_script([script, "enqueue", "--dsn", db, "--jobs", str(jobs),
                                  "--batch", "5000"], env)["seconds"]
    checkpoint(db)
    launched = time.time()
    consumers = [h.Proc([str(PEERS_PY), script, "consume", "--dsn", db, "--managers", "2",
                         "--batch", "100"], work / f"pgq-{i}.log", name=f"pgqueuer {i}", env=env)
                 for i in range(2)]
    drain, wall, ok, note, done = _drain_peer(consumers, work / "pgq-stats", jobs, launched,
                                              timeout, exits_by_itself=True)
    return Result("PgQueuer", "PostgreSQL",
                  "2 processes × 2 QueueManagers (asyncpg), batch_size=100, drain mode",
                  jobs, enqueue_s, "`Queries.enqueue` with lists, 5,000 per call",
                  drain, wall, ok, note, done)


def run_procrastinate(db: str, work: Path, jobs: int, timeout: float) -> Result:
    env = peer_env(work / "pcr-stats")
    (work / "pcr-stats").mkdir()
    script = str(PEERS_DIR / "procrastinate_peer.py")
    _run_peer_script([script, "install", "--dsn", db], env)
    enqueue_s = _run_peer_script([script, "enqueue", "--dsn", db, "--jobs", str(jobs),
                                  "--batch", "1000"], env)["seconds"]
    checkpoint(db)
    launched = time.time()
    consumers = [h.Proc([str(PEERS_PY), script, "consume", "--dsn", db, "--concurrency", "10"],
                        work / f"pcr-{i}.log", name=f"procrastinate {i}", env=env)
                 for i in range(2)]
    drain, wall, ok, note, done = _drain_peer(consumers, work / "pcr-stats", jobs, launched,
                                              timeout, exits_by_itself=True)
    return Result("procrastinate", "PostgreSQL",
                  "2 processes × `run_worker_async(concurrency=10, wait=False)`",
                  jobs, enqueue_s, "`Task.batch_defer_async`, 1,000 per call",
                  drain, wall, ok, note, done)


def run_redis_peer(kind: str, redis_url: str, work: Path, jobs: int, timeout: float) -> Result:
    queue = f"postlane-bench-{kind}-{os.getpid()}"
    stats = work / f"{kind}-stats"
    stats.mkdir()
    env = peer_env(stats, BENCH_REDIS_URL=redis_url, BENCH_QUEUE=queue)
    script = str(PEERS_DIR / f"{kind}_peer.py")
    try:
        enqueue_s = _run_peer_script([script, "enqueue", str(jobs)], env)["seconds"]
        launched = time.time()
        if kind == "dramatiq":
            args = [str(PEERS_VENV / "bin" / "dramatiq"), "dramatiq_peer", "--processes", "2",
                    "--threads", "8", "--path", str(PEERS_DIR)]
            config = "`dramatiq --processes 2 --threads 8`, default middleware, RedisBroker"
            how = "`actor.send` per message (no bulk API)"
        else:
            args = [str(PEERS_VENV / "bin" / "celery"), "-A", "celery_peer", "worker",
                    "-c", "2", "-P", "prefork", "-Q", queue, "-l", "WARNING",
                    "--without-gossip", "--without-mingle", "--without-heartbeat"]
            config = ("`celery worker -c 2 -P prefork` (prefetch ×4), results ignored, "
                      "Redis broker")
            how = "`apply_async` per task on one producer (no bulk API)"
        consumer = h.Proc(args, work / f"{kind}.log", name=kind, env=env, cwd=PEERS_DIR)
        drain, wall, ok, note, done = _drain_peer([consumer], stats, jobs, launched, timeout,
                                                  exits_by_itself=False)
    finally:
        h.redis_delete_matching(redis_url, f"{queue}*", f"*{queue}*", "unacked*",
                                "_kombu.binding.*")
    return Result(kind, "Redis", config, jobs, enqueue_s, how, drain, wall, ok, note, done)


# -- the section -----------------------------------------------------------------------------
SYSTEMS = ("postlane-pg-1", "postlane-pg-2", "postlane-pg-2-tuned", "postlane-pg-2-pdf",
           "postlane-sqlite-1", "postlane-sqlite-1-pdf", "pgqueuer", "procrastinate",
           "dramatiq", "celery")


REDIS_PEERS = ("dramatiq", "celery")


ROUNDS = 3
"""Rounds per system: the machine's speed drifts by tens of percent between minutes, so one
drain each, one system after the other, makes a ratio of two moments as much as of two
systems. The systems take turns round by round, and each reports its median round."""


def median_round(results: list[Result]) -> Result:
    """The round with the median jobs/s among those that succeeded (the lower middle of an
    even count), carrying every round's rate; the last failure when none succeeded."""
    ok = sorted((r for r in results if r.ok), key=lambda r: r.rate)
    chosen = ok[(len(ok) - 1) // 2] if ok else results[-1]
    return replace(chosen, rounds=tuple(r.rate for r in results if r.ok))


def measure(jobs: int, systems: tuple[str, ...] = SYSTEMS, timeout: float = 90,
            redis_jobs: int | None = None, pdf_share: float = PDF_SHARE,
            rounds: int = ROUNDS) -> list[Result]:
    """``timeout``: the drain cap in seconds (the rate is then taken over the jobs done).
    ``rounds``: every system this many times, in turns (see ``ROUNDS``)."""
    by_system: dict[str, list[Result]] = {system: [] for system in systems}
    with h.workdir("throughput") as work:
        for turn in range(1, rounds + 1):
            for system in systems:
                by_system[system].append(_measure_one(
                    work / f"{system}-{turn}", system, jobs, timeout, redis_jobs, pdf_share,
                    f" (round {turn} of {rounds})" if rounds > 1 else ""))
    return [median_round(by_system[system]) for system in systems]


def _measure_one(sub: Path, system: str, all_jobs: int, timeout: float,
                 redis_jobs: int | None, pdf_share: float, turn: str) -> Result:
    """One drain of ``system``: its result, or a failed one that says why (one failed
    system must not lose the others' figures)."""
    jobs = (redis_jobs or all_jobs) if system in REDIS_PEERS else all_jobs
    print(f"bench throughput: {system}, {jobs:,} jobs{turn}...", flush=True)
    sub.mkdir()
    try:
        result = _drain(sub, system, jobs, timeout, pdf_share)
    except Exception as exc:
        result = Result(system, "", "", jobs, 0.0, "", 0.0, 0.0, False,
                        f"failed: {type(exc).__name__}: {str(exc)[:600]}")
    if jobs != all_jobs:
        result.note = (result.note + " " if result.note else "") + \
            f"{jobs:,} jobs (one enqueue round trip per message)"
    print(f"  {result.system} ({result.backend}): enqueue {result.enqueue_rate:,.0f}/s, "
          f"drain {result.drain_s:.2f}s = {result.rate:,.0f} jobs/s "
          f"{'' if result.ok else 'FAILED ' + result.note}", flush=True)
    return result


def _drain(sub: Path, system: str, jobs: int, timeout: float, pdf_share: float) -> Result:
    share = pdf_share if system.endswith("-pdf") else 0.0
    if system.startswith("postlane-pg"):
        with fresh_pg_database("postlane_bench_tp") as db:
            return run_postlane(db, sub, jobs, int(system.split("-")[2]), "PostgreSQL",
                                timeout, TUNED if system.endswith("-tuned") else (), share)
    if system.startswith("postlane-sqlite"):
        return run_postlane(f"sqlite:///{sub / 'postlane.db'}", sub, jobs, 1, "SQLite",
                            timeout, pdf_share=share)
    if system == "pgqueuer":
        with fresh_pg_database("postlane_bench_pgq") as db:
            return run_pgqueuer(db, sub, jobs, timeout)
    if system == "procrastinate":
        with fresh_pg_database("postlane_bench_pcr") as db:
            return run_procrastinate(db, sub, jobs, timeout)
    with h.claimed_redis_db() as redis_url:
        return run_redis_peer(system, redis_url, sub, jobs, timeout)


def markdown(results: list[Result], versions: dict[str, str], command: str) -> str:
    lines = [
        "## Throughput: no-op dispatch, Postlane and Python peers",
        "",
        f"Command: `{command}`. Jobs pre-enqueued, then drained; every system on the same "
        "PostgreSQL server (a fresh database each) or the same Redis, one after another in "
        "this run, a `VACUUM ANALYZE` and a `CHECKPOINT` before each PostgreSQL drain. "
        + (f"{rounds} rounds: every system drains once per round, in the table's order, and "
           "shows its median round (every round's jobs/s beside it, in run order), so a "
           "drift of the machine's speed weighs on every system alike."
           if (rounds := max((len(r.rounds) for r in results), default=1)) > 1 else ""),
        "",
        "| system | backend | consumers | enqueue (bulk) | drain | wall incl. start-up "
        "| jobs/s | Postlane 2 proc. / this | Postlane 1 proc. / this "
        "| Postlane 2 proc. tuned / this |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    best = max((r for r in results if r.system == "Postlane" and r.backend == "PostgreSQL"
                and r.ok), key=lambda r: r.rate, default=None)
    def default(r: Result) -> bool:
        return (r.system == "Postlane" and r.backend == "PostgreSQL" and "defaults" in r.config
                and "PDF" not in r.config)

    two = next((r for r in results if default(r) and r.config.startswith("2 ") and r.ok), best)
    tuned = next((r for r in results if r.system == "Postlane" and r.ok
                  and "--concurrency" in r.config), None)
    one = next((r for r in results if default(r) and r.config.startswith("1 ") and r.ok), None)
    for r in results:
        ratio = f"{two.rate / r.rate:.2f}" if two and r.ok and r.rate else "—"
        ratio1 = f"{one.rate / r.rate:.2f}" if one and r.ok and r.rate else "—"
        ratio_t = f"{tuned.rate / r.rate:.2f}" if tuned and r.ok and r.rate else "—"
        status = "" if r.ok else f" **failed**: {r.note}"
        drain = f"{r.drain_s:.2f} s"
        if r.done is not None:
            drain += f" ({r.done:,} of {r.jobs:,}: capped)"
        spread = (" (" + " · ".join(f"{rate:,.0f}" for rate in r.rounds) + ")"
                  if len(r.rounds) > 1 else "")
        lines.append(
            f"| {r.system} | {r.backend} | {r.config} | {r.jobs:,} in {r.enqueue_s:.2f} s "
            f"({r.enqueue_rate:,.0f}/s) | {drain} | {r.wall_s:.2f} s | "
            f"{r.rate:,.0f}{spread}{status} | {ratio} | {ratio1} | {ratio_t} |")
    lines += [
        "",
        "How each was measured:",
        "",
        "- *enqueue*: the system's bulk API as listed: "
        + "; ".join(dict.fromkeys(f"{r.system} ({r.backend}): {r.enqueue_how}"
                                  for r in results if r.ok))
        + ".",
        "- *drain*: first job taken to last job done. Postlane: database times, first "
        "`claimed_at` to the last `finished_at` (the outcome is written). Peers: their "
        "handler's first and last call (a counter, `bench/peers/_peerstats.py`); the queue's "
        "own completion write for the last batch comes after it. *wall*: from launching the "
        "consumer processes to the last job done (Python start-up and connection set-up "
        "included).",
        "- A drain still running 90 s after its first job is stopped there (*capped*) and "
        "its rate taken over the jobs done by then (steady state: the queue was still full). "
        "The Redis peers get fewer jobs when so noted: their enqueue is one round trip per "
        "message, and the drain rate does not depend on the backlog's size.",
        "- The ratio columns divide Postlane's jobs/s on PostgreSQL with 2 worker processes (the "
        "process count of the best peer configurations) and with 1, at default settings, and "
        f"with 2 tuned (`{' '.join(TUNED)}`: several claims in flight per process, as PgQueuer "
        "is tuned to its documented batch size), by each row's jobs/s: above 1, Postlane is "
        "faster.",
        "- The rows whose consumers say *carry a 200 KB PDF* drain the same no-op jobs with "
        "that share of them carrying an attachment, stored beside the delivery at enqueue "
        "(`postlane_attachments`) and loaded by the worker, one query per claimed batch, "
        "before the sends: set them beside the plain row of the same backend and process "
        "count. The no-op adapter builds no MIME, so the difference is what large content "
        "costs the storage and the dispatch path.",
    ]
    if versions:
        lines.append("- Peers' versions: " + ", ".join(f"{k} {v}" for k, v in versions.items())
                     + " (in `bench/.venv-peers`, the same Python).")
    return "\n".join(lines)


def run(quick: bool = False, jobs: int | None = None,
        systems: tuple[str, ...] = SYSTEMS, command: str = "",
        redis_jobs: int | None = None, cap: float = 90.0,
        pdf_share: float = PDF_SHARE, rounds: int | None = None) -> tuple[str, list[Result]]:
    versions = ensure_peers_venv() if any(not s.startswith("postlane") for s in systems) else {}
    jobs = jobs or (5_000 if quick else 50_000)
    redis_jobs = redis_jobs or min(jobs, 20_000)
    rounds = rounds or (1 if quick else ROUNDS)
    results = measure(jobs, systems, cap, redis_jobs, pdf_share, rounds)
    return markdown(results, versions, command), results


def main() -> None:
    from bench._common import command_line, write_section

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=None)
    p.add_argument("--redis-jobs", type=int, default=None,
                   help="jobs for dramatiq and celery [default: min(jobs, 20000)]")
    p.add_argument("--cap", type=float, default=90.0, help="drain cap in seconds")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--rounds", type=int, default=None,
                   help=f"drains per system, in turns [default: {ROUNDS}; --quick: 1]")
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--pdf-share", type=float, default=PDF_SHARE,
                   help="share of the deliveries carrying a 200 KB PDF in the *-pdf systems")
    p.add_argument("--section", default="throughput",
                   help="the RESULTS.md section to write (e.g. 'attachments' for the PDF "
                        "rows beside the plain ones, leaving the peers' table alone)")
    a = p.parse_args()
    body, _ = run(a.quick, a.jobs, tuple(s for s in a.systems.split(",") if s),
                  command_line(), a.redis_jobs, a.cap, a.pdf_share, a.rounds)
    if a.section == "attachments":
        body = body.replace("## Throughput: no-op dispatch, Postlane and Python peers",
                            "## Throughput with attachments: the plain drain beside one where "
                            f"{a.pdf_share:.0%} of the deliveries carry a "
                            f"{PDF_BYTES // 1024} KB PDF", 1)
    print(body)
    if not a.no_write:
        write_section(a.section, body)


if __name__ == "__main__":
    main()
