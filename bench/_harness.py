"""Process, database and statistics helpers shared by the scenarios that ``python -m bench``
runs (throughput, lanes, limiter, pickup, memory) and by the fault harness (``bench.chaos``).

Every Postlane process is the real ``postlane`` console script next to this interpreter,
started in its own session (so a scenario can signal it and everything it spawned by its
own id), with a clean ``POSTLANE_*`` environment and its output in a log file.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg

from postlane import Message, enqueue_many

POSTLANE_BIN = Path(sys.executable).with_name("postlane")
REDIS_URL = os.environ.get("POSTLANE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
BENCH_DIR = Path(__file__).resolve().parent
SUBJECT = "Your weekly digest is ready"
TEXT = "Hello,\n\n" + "This is the body of a benchmark message, about as long as a short one. " * 4


# -- processes -----------------------------------------------------------------------------
def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POSTLANE_")}
    env["PYTHONUNBUFFERED"] = "1"
    env["COLUMNS"] = "200"
    env.update(extra)
    return env


class Proc:
    """A child process in its own session; ``stop()``/``kill()`` signal only its group."""

    def __init__(self, args: Sequence[str], log_path: Path, *, name: str = "",
                 cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
        self.name = name or Path(args[0]).name
        self.args = list(args)
        self.log_path = log_path
        self.started = time.time()
        with log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                self.args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=cwd or log_path.parent, env=env or clean_env(), start_new_session=True,
            )
        self.ended: float | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int, *, group: bool = False) -> None:
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, sig)

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            code = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        if self.ended is None:
            self.ended = time.time()
        return code

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM (after SIGCONT, in case it is stopped), then SIGKILL past ``timeout``."""
        if self.alive():
            self.signal(signal.SIGCONT, group=True)
            self.signal(signal.SIGTERM, group=True)
            code = self.wait(timeout)
            if code is not None:
                return code
        self.kill()
        return self.popen.returncode

    def kill(self) -> None:
        self.signal(signal.SIGKILL, group=True)
        self.wait(10)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            text = []
        return f"--- {self.name} (pid {self.pid}) ---\n" + "\n".join(text)


def postlane(db: str, *args: str, log_path: Path, name: str = "", **env: str) -> Proc:
    return Proc([str(POSTLANE_BIN), "--db", db, *args], log_path, name=name,
                env=clean_env(**env))


def worker(db: str, provider: str, *args: str, log_path: Path, name: str = "") -> Proc:
    return postlane(db, "worker", "--provider", provider, "--log-level", "WARNING", *args,
                    log_path=log_path, name=name or "postlane worker")


def vm_hwm_kib(pid: int) -> int | None:
    """Peak resident set size (VmHWM) of a live process, in KiB."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return None


@contextlib.contextmanager
def workdir(prefix: str) -> Iterator[Path]:
    keep = os.environ.get("POSTLANE_BENCH_KEEP")
    path = Path(tempfile.mkdtemp(prefix=f"postlane-{prefix}-"))
    try:
        yield path
    finally:
        if not keep:
            import shutil

            shutil.rmtree(path, ignore_errors=True)


# -- databases -----------------------------------------------------------------------------
def migrate(db: str, log_dir: Path) -> None:
    out = subprocess.run([str(POSTLANE_BIN), "--db", db, "migrate"], capture_output=True,
                         text=True, env=clean_env(), cwd=log_dir, timeout=120, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"postlane migrate failed: {out.stdout}\n{out.stderr}")


def bulk_messages(n: int, *, tag: str, lane: str = "bulk", start: int = 0,
                  to: str = "user{i}@example.com") -> list[Message]:
    return [Message(key=f"{tag}:{i}", to=to.format(i=i), subject=SUBJECT, text=TEXT, lane=lane,
                    metadata={"user": i})
            for i in range(start, start + n)]


def load(db: str, messages: Sequence[Message], chunk: int = 5000) -> float:
    """Enqueue through the outbox API (``postlane.enqueue_many``: COPY on PostgreSQL), one
    commit per ``chunk``; returns the wall time."""
    started = time.perf_counter()
    if db.startswith("sqlite:"):
        conn = sqlite3.connect(db[len("sqlite:///"):], timeout=60)
        try:
            for i in range(0, len(messages), chunk):
                with conn:
                    enqueue_many(conn, messages[i:i + chunk])
        finally:
            conn.close()
    else:
        with psycopg.connect(db) as pg:
            for i in range(0, len(messages), chunk):
                with pg.transaction():
                    enqueue_many(pg, messages[i:i + chunk])
    return time.perf_counter() - started


def query(db: str, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """One read on either engine (``?`` placeholders are rewritten for PostgreSQL)."""
    if db.startswith("sqlite:"):
        conn = sqlite3.connect(db[len("sqlite:///"):], timeout=60)
        try:
            return list(conn.execute(sql, params).fetchall())
        finally:
            conn.close()
    with psycopg.connect(db, autocommit=True) as pg:
        return list(pg.execute(sql.replace("?", "%s"), params).fetchall())


def epoch(db: str, column: str) -> str:
    """SQL for a time column as unix seconds on either engine."""
    return column if db.startswith("sqlite:") else f"extract(epoch FROM {column})::float8"


# -- statistics ----------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def fmt_ms(seconds: float) -> str:
    if math.isnan(seconds):
        return "n/a"
    return f"{seconds * 1000:,.0f} ms" if seconds < 10 else f"{seconds:,.1f} s"


def windows_over(times: Sequence[float], ceiling: float, window: float = 1.0) -> tuple[int, int]:
    """(sliding windows ``[t, t + window)`` starting at a send that hold more than
    ``ceiling`` sends, the most sends in any such window)."""
    ordered = sorted(times)
    over = best = 0
    j = 0
    for i, start in enumerate(ordered):
        j = max(j, i)
        while j < len(ordered) and ordered[j] < start + window:
            j += 1
        count = j - i
        best = max(best, count)
        if count > ceiling:
            over += 1
    return over, best


def python_version_of(executable: str | Path) -> str:
    code = "import platform; print(platform.python_version())"
    out = subprocess.run([str(executable), "-c", code],
                         capture_output=True, text=True, check=False)
    return out.stdout.strip()


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def ignore_sigpipe() -> None:  # pragma: no cover - CLI nicety
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)


# -- Redis ---------------------------------------------------------------------------------
_REDIS_CLAIM_KEY = "postlane:acceptance:claimed-by"
"""The key the acceptance suite claims a Redis database with (SET NX): claiming one the same
way keeps a concurrent test run out of the database a benchmark uses, and vice versa."""


@contextlib.contextmanager
def claimed_redis_db(base: str = "redis://127.0.0.1:6379") -> Iterator[str]:
    import redis

    token = f"bench:{os.getpid()}:{time.monotonic_ns()}"
    for number in range(15, 0, -1):
        client = redis.Redis.from_url(f"{base}/{number}", socket_timeout=5)
        if client.set(_REDIS_CLAIM_KEY, token, nx=True, ex=3600):
            break
        client.close()
    else:
        raise RuntimeError("no free Redis database (1..15) for the benchmark")
    try:
        yield f"{base}/{number}"
    finally:
        if client.get(_REDIS_CLAIM_KEY) == token.encode():
            client.delete(_REDIS_CLAIM_KEY)
        client.close()


def redis_delete_matching(url: str, *patterns: str) -> None:
    import redis

    client = redis.Redis.from_url(url, socket_timeout=10)
    try:
        for pattern in patterns:
            keys = list(client.scan_iter(match=pattern, count=1000))
            for i in range(0, len(keys), 500):
                client.delete(*keys[i:i + 500])
    finally:
        client.close()


def redis_version(url: str = REDIS_URL) -> str:
    import redis

    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        return str(client.info("server").get("redis_version", "unknown"))
    finally:
        client.close()


def with_admin_db() -> str:
    from bench._common import pg_admin_url

    return pg_admin_url()
