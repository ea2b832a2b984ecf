"""Limiter: the provider's ceiling, seen from the provider, with 1 and 4 worker processes.

    python -m bench --only limiter
    python -m bench.limiter_bench --seconds 20 --processes 1,4

A fresh PostgreSQL database gets a backlog of ``ceiling x seconds`` messages; ``P`` processes
of ``postlane worker --provider record:///... --rate 200/s --limiter redis://.../0 --drain``
send them, sharing one ceiling through Redis. The provider (``RecordFileProvider``) stamps
every request on arrival into one SQLite file; from those times:

- *windows over*: sliding one-second windows ``[t, t+1)`` starting at each send that hold
  more than the ceiling (must be 0), and the most sends found in any one-second window;
- *utilisation*: sends per second over the backlog (first send to last send) divided by
  the ceiling, and the lowest full calendar second in between.
"""

from __future__ import annotations

import argparse
import asyncio
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import redis

from bench import _harness as h
from bench._common import fresh_pg_database
from postlane.providers.testing import read_record_file

CEILING = 200.0
LIMITER_KEY_PATTERN = "postlane:limiter:record*"


@dataclass
class LimiterRun:
    processes: int
    backlog: int
    sends: int
    over: int
    max_window: int
    utilisation: float
    min_second: int
    seconds: float
    duplicates: int
    ok: bool
    note: str = ""


async def _load(db: str, n: int) -> None:
    from postlane.store import open_store

    messages = h.bulk_messages(n, tag="ceiling")
    async with open_store(db) as store:
        for i in range(0, n, 5000):
            await store.enqueue_many(messages[i:i + 5000])


def one_run(work: Path, processes: int, seconds: float, redis_url: str) -> LimiterRun:
    backlog = int(CEILING * seconds)
    record = work / f"sends-{processes}.db"
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match=LIMITER_KEY_PATTERN):
        client.delete(key)
    with fresh_pg_database("postlane_bench_limiter") as db:
        h.migrate(db, work)
        asyncio.run(_load(db, backlog))
        procs = [h.worker(db, f"record://{record}", "--rate", f"{CEILING:g}/s", "--limiter",
                          redis_url, "--drain", log_path=work / f"limiter-{processes}-{i}.log",
                          name=f"worker {i}") for i in range(processes)]
        note = ""
        try:
            for proc in procs:
                if proc.wait(seconds * 3 + 60) is None:
                    note = "a worker did not drain in time"
        finally:
            for proc in procs:
                proc.stop()
        failed = [p for p in procs if p.popen.returncode not in (0, None)]
        if failed:
            note += " ".join(p.log_tail(5) for p in failed)
        (sent,), = h.query(db, "SELECT count(*) FROM postlane_deliveries WHERE state = 'sent'")
    for key in client.scan_iter(match=LIMITER_KEY_PATTERN):
        client.delete(key)
    client.close()
    stats = read_record_file(str(record))
    times = stats.send_times
    over, best = h.windows_over(times, CEILING)
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    utilisation = (len(times) - 1) / span / CEILING if span else 0.0
    per_second = Counter(math.floor(t) for t in times)
    full = range(math.floor(times[0]) + 1, math.floor(times[-1])) if times else range(0)
    min_second = min((per_second.get(s, 0) for s in full), default=0)
    ok = over == 0 and sent == backlog and not note
    if sent != backlog:
        note += f" {sent} of {backlog} sent"
    return LimiterRun(processes, backlog, len(times), over, best, utilisation, min_second, span,
                      stats.duplicates, ok, note.strip())


def measure(seconds: float, processes: tuple[int, ...], redis_url: str) -> list[LimiterRun]:
    runs = []
    with h.workdir("limiter") as work:
        for p in processes:
            print(f"bench limiter: {p} process(es), {seconds:g} s of backlog...", flush=True)
            runs.append(one_run(work, p, seconds, redis_url))
            r = runs[-1]
            print(f"  over={r.over} max={r.max_window} util={r.utilisation:.1%} "
                  f"min second={r.min_second} {r.note}", flush=True)
    return runs


def markdown(runs: list[LimiterRun], command: str, redis_url: str) -> str:
    lines = [
        "## Limiter: the ceiling at the provider, one and several processes",
        "",
        f"Command: `{command}`. Ceiling {CEILING:g}/s (`--rate {CEILING:g}/s`, default headroom "
        f"2 %, so the limiter aims at {CEILING * 0.98:g}/s), shared through Redis "
        f"(`--limiter {redis_url}`); a backlog of ceiling × duration messages in PostgreSQL, "
        "drained by P `postlane worker --drain` processes; send times stamped by the provider "
        "on arrival (`record://` file).",
        "",
        "| processes | backlog | sends seen | 1-s windows over the ceiling "
        "| most in any 1-s window "
        "| utilisation (first to last send) | lowest full second | duplicates |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        flag = "" if r.ok else f" — **{r.note or 'failed'}**"
        lines.append(f"| {r.processes} | {r.backlog:,} | {r.sends:,} | **{r.over}** | "
                     f"{r.max_window} | {r.utilisation:.1%} | {r.min_second} | "
                     f"{r.duplicates}{flag} |")
    lines += ["", "A window is `[t, t + 1 s)` starting at every send; it is over when it holds "
              f"more than {CEILING:g} sends. Utilisation is (sends − 1) / (last − first) / "
              "ceiling."]
    return "\n".join(lines)


def run(quick: bool = False, command: str = "", seconds: float | None = None,
        processes: tuple[int, ...] = (1, 4)) -> tuple[str, list[LimiterRun]]:
    seconds = seconds or (8.0 if quick else 20.0)
    runs = measure(seconds, processes, h.REDIS_URL)
    return markdown(runs, command, h.REDIS_URL), runs


def main() -> None:
    from bench._common import command_line, write_section

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=None)
    p.add_argument("--processes", default="1,4")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-write", action="store_true")
    a = p.parse_args()
    body, _ = run(a.quick, command_line(), a.seconds,
                  tuple(int(x) for x in a.processes.split(",")))
    print(body)
    if not a.no_write:
        write_section("limiter", body)


if __name__ == "__main__":
    main()
