"""Helpers shared by the benchmarks in ``bench/``: a throwaway PostgreSQL database per run,
a description of the machine and versions, and ``bench/RESULTS.md`` written section by
section so that each benchmark owns one clearly delimited section and leaves the others alone.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import platform
import re
import shlex
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"

PG_ADMIN_URL_ENV = "POSTLANE_BENCH_PG_URL"
DEFAULT_PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"

_RESULTS_PREAMBLE = """\
# Postlane benchmark results

Figures measured by the scripts in `bench/`, one section per benchmark. Each section is
rewritten in place by its own script (between its `BEGIN`/`END` markers) and names the
machine, the versions, the date and the exact command that produced it; re-run that
command to refresh it. Absolute numbers depend on the machine: compare rows within one
section, which were measured side by side in one run.
"""


def pg_admin_url() -> str:
    """A URL of a database we may CREATE/DROP other databases from."""
    return os.environ.get(PG_ADMIN_URL_ENV, DEFAULT_PG_ADMIN_URL)


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


@contextlib.contextmanager
def fresh_pg_database(prefix: str = "postlane_bench") -> Iterator[str]:
    """Create ``<prefix>_<pid>`` (dropping a leftover of that name first), yield its URL,
    and drop it afterwards, even on error or Ctrl-C."""
    name = f"{prefix}_{os.getpid()}"
    admin = pg_admin_url()
    ident = sql.Identifier(name)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(ident))
    try:
        yield with_database(admin, name)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _memory() -> str:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    return "unknown"


def _git(*args: str) -> str:
    try:
        out = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip()


def _tree_blobs(commit: str) -> dict[str, str]:
    blobs = {}
    for line in _git("ls-tree", "-r", commit, "--", "src/postlane").splitlines():
        meta, _, path = line.partition("\t")
        if path.endswith((".py", ".sql", ".typed")):
            blobs[path.removeprefix("src/postlane/")] = meta.split()[2]
    return blobs


def postlane_commit() -> str:
    """Which postlane was measured: the newest of the last 100 commits whose ``src/postlane``
    is file for file the imported package, else HEAD and the files that differ from it.

    Others may be editing ``src/`` while a benchmark runs; to measure a commit exactly,
    export it (``git archive HEAD src | tar -x -C /tmp/snap``) and put ``/tmp/snap/src``
    first on ``PYTHONPATH``.
    """
    import postlane

    package = Path(postlane.__file__).resolve().parent
    where = "" if package == ROOT / "src" / "postlane" else f", imported from `{package}`"
    files = sorted(
        p for p in package.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".py", ".sql", ".typed")
    )
    try:
        hashed = subprocess.run(
            ["git", "hash-object", "--stdin-paths"], input="\n".join(map(str, files)),
            cwd=ROOT, capture_output=True, text=True, check=True, timeout=30,
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return f"unknown (git unavailable){where}"
    local = {str(p.relative_to(package)): h for p, h in zip(files, hashed, strict=True)}
    for commit in _git("rev-list", "-n", "100", "HEAD", "--", "src/postlane").split():
        if _tree_blobs(commit) == local:
            short = _git("rev-parse", "--short=12", commit)
            return f"`{short}` (the imported `postlane` is identical to it{where})"
    head = _git("rev-parse", "--short=12", "HEAD") or "unknown"
    committed = _tree_blobs("HEAD")
    differ = sorted(n for n in set(local) | set(committed) if local.get(n) != committed.get(n))
    return (f"`{head}` plus uncommitted edits to " + ", ".join(f"`{d}`" for d in differ)
            + where)


def pg_settings(url: str) -> dict[str, str]:
    """Server version and the settings that move queue throughput the most."""
    names = ("server_version", "shared_buffers", "synchronous_commit", "fsync",
             "wal_level", "max_wal_size", "checkpoint_timeout")
    with psycopg.connect(url) as conn:
        return {n: str(conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(n)))
                       .fetchone()[0])  # type: ignore[index]
                for n in names}


@dataclass
class MachineInfo:
    cpu: str
    nproc: int
    memory: str
    kernel: str
    python: str
    psycopg: str
    sqlite: str
    postgres: str | None
    pg_settings: dict[str, str] | None
    commit: str
    date: str

    def markdown(self) -> str:
        lines = [
            f"- Date: {self.date}",
            f"- Machine: {self.cpu}, {self.nproc} CPUs (`nproc`), {self.memory} RAM, "
            f"Linux {self.kernel}",
            f"- Python {self.python}, psycopg {self.psycopg}, SQLite {self.sqlite}",
        ]
        if self.postgres:
            extra = ""
            if self.pg_settings:
                extra = " (" + ", ".join(
                    f"{k}={v}" for k, v in self.pg_settings.items() if k != "server_version"
                ) + ")"
            lines.append(f"- PostgreSQL {self.postgres}, same host over TCP 127.0.0.1{extra}")
        lines.append(f"- postlane: commit {self.commit}")
        return "\n".join(lines)


def machine_info(pg_url: str | None = None) -> MachineInfo:
    settings = None
    version = None
    if pg_url:
        settings = pg_settings(pg_url)
        version = settings.get("server_version")
    return MachineInfo(
        cpu=_cpu_model(),
        nproc=os.cpu_count() or 0,
        memory=_memory(),
        kernel=platform.release(),
        python=platform.python_version(),
        psycopg=psycopg.__version__,
        sqlite=sqlite3.sqlite_version,
        postgres=version,
        pg_settings=settings,
        commit=postlane_commit(),
        date=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    )


def command_line() -> str:
    """The command that is running, as one would type it from the repository root
    (with ``PYTHONPATH`` when set, e.g. to measure an exported commit)."""
    env = f"PYTHONPATH={shlex.quote(os.environ['PYTHONPATH'])} " if os.environ.get(
        "PYTHONPATH") else ""
    module = Path(sys.argv[0]).resolve()
    with contextlib.suppress(ValueError):
        rel = module.relative_to(ROOT).with_suffix("")
        return env + shlex.join(["python", "-m", ".".join(rel.parts), *sys.argv[1:]])
    return env + shlex.join([sys.executable, *sys.argv])


def write_section(key: str, body: str, path: Path = RESULTS) -> None:
    """Replace (or append) the section ``key`` of RESULTS.md; other sections are untouched.

    A section is everything between ``<!-- BEGIN <key> -->`` and ``<!-- END <key> -->``;
    ``body`` should start with its own ``## Heading``.
    """
    begin, end = f"<!-- BEGIN {key} -->", f"<!-- END {key} -->"
    block = f"{begin}\n{body.strip()}\n{end}"
    text = path.read_text("utf-8") if path.exists() else _RESULTS_PREAMBLE
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text(text, "utf-8")
    tmp.replace(path)


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _process_cpu(pid: int) -> float | None:
    """User + system CPU seconds of a process on this host, from /proc/<pid>/stat."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


class Meter:
    """Wall time, this process's CPU time, and (``pg_url`` given, server on this host) the
    CPU time of every backend connected to that database, over the ``with`` block.

    CPU per row is steadier than rows/s on a shared machine, and it says which side,
    Python or PostgreSQL, spends the time. PostgreSQL's background processes (WAL writer,
    checkpointer, autovacuum) are not counted.
    """

    seconds: float = 0.0
    client_cpu: float = 0.0
    server_cpu: float | None = None

    def __init__(self, pg_url: str | None = None) -> None:
        self.pg_url = pg_url
        self._conn: psycopg.Connection[Any] | None = None

    def _backends(self) -> dict[int, float | None]:
        assert self._conn is not None
        rows = self._conn.execute(
            "SELECT pid FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
        return {pid: _process_cpu(pid) for (pid,) in rows}

    def __enter__(self) -> Meter:
        if self.pg_url:
            self._conn = psycopg.connect(self.pg_url, autocommit=True)
            self._before = self._backends()
        self._cpu = time.process_time()
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._start
        self.client_cpu = time.process_time() - self._cpu
        if self._conn is not None:
            after = self._backends()
            self._conn.close()
            if all(v is not None for v in after.values()):
                self.server_cpu = sum(
                    (v or 0.0) - (self._before.get(pid) or 0.0) for pid, v in after.items()
                )


class Timer:
    """``with Timer() as t: ...`` then ``t.seconds``."""

    seconds: float = 0.0

    def __enter__(self) -> Timer:
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._start
