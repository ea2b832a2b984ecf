"""Acceptance helpers: real ``postlane`` processes, real signals, deadlines instead of sleeps.

Every worker is an OS process started from the ``postlane`` console script next to the test
interpreter, with its own working directory (so no stray ``postlane.toml`` is read) and a
clean ``POSTLANE_*`` environment. Its output goes to a log file that is printed when a test
fails. Whatever a test leaves running is SIGCONTed and SIGKILLed in the finalizer.

The provider side of every test is a ``record:///...`` file: a SQLite file that every worker
process writes its sends into, so the test reads one provider-side truth (send times, keys,
which process sent what).

This directory is a package (``__init__.py``) so that this ``conftest`` does not replace the
top-level ``conftest`` module that other test files import helpers from.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import psycopg
import pytest
import redis

from postlane import Message, enqueue_many
from postlane.providers.testing import open_record_file

T = TypeVar("T")

POSTLANE_BIN = Path(sys.executable).with_name("postlane")
REDIS_BASE_URL = os.environ.get("POSTLANE_TEST_REDIS_BASE", "redis://127.0.0.1:6379")
LIMITER_KEY = "postlane:limiter:record"  # the record provider's account is "record"
_REDIS_CLAIM_KEY = "postlane:acceptance:claimed-by"


# -- figures, printed at the end of the run ----------------------------------------------
FIGURES: dict[str, str] = {}


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if FIGURES:
        terminalreporter.section("postlane acceptance figures")
        for name, value in FIGURES.items():
            terminalreporter.write_line(f"{name}: {value}")


# -- waiting -----------------------------------------------------------------------------
def wait_until(
    predicate: Callable[[], T],
    timeout: float,
    what: str,
    *,
    interval: float = 0.05,
    watch: Sequence[WorkerProc] = (),
) -> T:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds.

    ``watch``: processes that must stay alive meanwhile (a crash fails at once, with its log).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        for proc in watch:
            if proc.popen.poll() is not None:
                pytest.fail(f"while waiting for {what}: {proc.name} exited with "
                            f"{proc.popen.returncode}\n{proc.log_tail()}", pytrace=False)
        if time.monotonic() >= deadline:
            logs = "\n".join(p.log_tail() for p in watch)
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}\n{logs}",
                        pytrace=False)
        time.sleep(interval)


# -- processes ---------------------------------------------------------------------------
@dataclass
class WorkerProc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def owner_marker(self) -> str:
        """The part of the worker's lease owner (``host:pid:random``) that names this pid."""
        return f":{self.pid}:"

    def send_signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def wait(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.name} did not exit within {timeout:g}s\n{self.log_tail()}",
                        pytrace=False)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 40) -> str:
        text = self.log().splitlines()[-lines:]
        return f"--- {self.name} (pid {self.pid}) log tail ---\n" + "\n".join(text)


@dataclass
class Launcher:
    """Starts ``postlane`` processes for one test and cleans up after it."""

    workdir: Path
    procs: list[WorkerProc] = field(default_factory=list)

    @staticmethod
    def env() -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("POSTLANE_")}
        env["COLUMNS"] = "200"  # rich wraps long error lines at 80 columns otherwise
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def command(self, db: str, *args: str) -> list[str]:
        if not POSTLANE_BIN.exists():
            pytest.fail(f"the postlane console script is not installed at {POSTLANE_BIN}",
                        pytrace=False)
        return [str(POSTLANE_BIN), "--db", db, *args]

    def cli(self, db: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run one CLI command to completion; the caller checks the exit status."""
        return subprocess.run(self.command(db, *args), cwd=self.workdir, env=self.env(),
                              capture_output=True, text=True, timeout=timeout, check=False)

    def cli_ok(self, db: str, *args: str) -> str:
        result = self.cli(db, *args)
        assert result.returncode == 0, (
            f"postlane {' '.join(args)} exited {result.returncode}\n"
            f"stdout: {result.stdout}\nstderr: {result.stderr}"
        )
        return result.stdout

    def worker(self, db: str, provider: str, *args: str, name: str | None = None) -> WorkerProc:
        name = name or f"worker-{len(self.procs) + 1}"
        log_path = self.workdir / f"{name}.log"
        with log_path.open("wb") as log:
            popen = subprocess.Popen(
                self.command(db, "worker", "--provider", provider, *args),
                cwd=self.workdir, env=self.env(), stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT,
            )
        proc = WorkerProc(name, popen, log_path)
        self.procs.append(proc)
        return proc

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.popen.poll() is None:
                for sig in (signal.SIGCONT, signal.SIGKILL):
                    try:
                        proc.send_signal(sig)
                    except ProcessLookupError:
                        break
                try:
                    proc.popen.wait(timeout=10)
                except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL ignored?
                    print(f"{proc.name} (pid {proc.pid}) survived SIGKILL")


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Launcher]:
    workdir = tmp_path / "run"
    workdir.mkdir()
    launch = Launcher(workdir)
    try:
        yield launch
    finally:
        launch.cleanup()
        for proc in launch.procs:  # shown by pytest only when the test failed
            print(proc.log_tail(60))


# -- messages and stores -----------------------------------------------------------------
def email(key: str, lane: str = "interactive", **fields: Any) -> Message:
    values: dict[str, Any] = {"key": key, "to": "user@example.com", "subject": "Welcome",
                              "text": "Hello from the acceptance suite.", "lane": lane}
    values.update(fields)
    return Message(**values)


def is_sqlite(db: str) -> bool:
    return db.startswith("sqlite:")


def enqueue_all(db: str, messages: Sequence[Message], chunk: int = 2000) -> None:
    """Load messages through the outbox API (``postlane.enqueue_many``), committed."""
    for start in range(0, len(messages), chunk):
        part = messages[start:start + chunk]
        if is_sqlite(db):
            conn = sqlite3.connect(db[len("sqlite:///"):], timeout=60)
            try:
                with conn:
                    enqueue_many(conn, part)
            finally:
                conn.close()
        else:
            with psycopg.connect(db) as pg:  # commits on a clean exit
                enqueue_many(pg, part)


# -- the provider's record file ----------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SendRow:
    seq: int
    key: str
    delivery_id: int
    at: float
    pid: int


def record_url(path: Path, **options: object) -> str:
    query = "&".join(f"{k}={quote(str(v), safe='')}" for k, v in options.items())
    return f"record://{path}" + (f"?{query}" if query else "")


def record_rows(path: Path) -> list[SendRow]:
    """Every send the provider saw, in the order it recorded them."""
    conn = open_record_file(str(path))
    try:
        rows = conn.execute("SELECT seq, key, delivery_id, at, pid FROM sends ORDER BY seq")
        return [SendRow(*row) for row in rows.fetchall()]
    finally:
        conn.close()


def record_accepted(path: Path) -> set[str]:
    conn = open_record_file(str(path))
    try:
        return {row[0] for row in conn.execute("SELECT key FROM accepted")}
    finally:
        conn.close()


def max_in_window(times: Sequence[float], window: float = 1.0) -> int:
    """The most sends in any half-open window ``[t, t + window)`` starting at a send."""
    ordered = sorted(times)
    best = 0
    j = 0
    for i, start in enumerate(ordered):
        j = max(j, i)
        while j < len(ordered) and ordered[j] < start + window:
            j += 1
        best = max(best, j - i)
    return best


# -- Redis for the shared limiter --------------------------------------------------------
@pytest.fixture
def limiter_redis_url() -> Iterator[str]:
    """A Redis database of this test's own (claimed with SET NX), limiter key cleared.

    The limiter key is fixed per provider account (``postlane:limiter:record``), so two
    concurrent runs sharing one database would share one ceiling; claiming a database keeps
    them apart.
    """
    token = f"{os.getpid()}:{time.monotonic_ns()}"
    claimed: redis.Redis | None = None
    url = ""
    try:
        for db in range(15, 0, -1):
            client = redis.Redis.from_url(f"{REDIS_BASE_URL}/{db}", socket_timeout=5)
            if client.set(_REDIS_CLAIM_KEY, token, nx=True, ex=600):
                claimed, url = client, f"{REDIS_BASE_URL}/{db}"
                break
            client.close()
    except redis.RedisError as exc:
        pytest.fail(f"Redis is required at {REDIS_BASE_URL} ({exc}); `.ci/run` starts it",
                    pytrace=False)
    if claimed is None:
        pytest.fail("no free Redis database (1..15) to run the limiter test in", pytrace=False)
    try:
        claimed.delete(LIMITER_KEY)
        yield url
    finally:
        claimed.delete(LIMITER_KEY)
        if claimed.get(_REDIS_CLAIM_KEY) == token.encode():
            claimed.delete(_REDIS_CLAIM_KEY)
        claimed.close()
