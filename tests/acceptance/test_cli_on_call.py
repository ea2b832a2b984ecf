"""The command line as the on-call screen: a database it cannot reach is one line naming the
cause (no pool retries, no wait), and a worker's log is one JSON object per line with the
configuration it runs with, secrets and addresses redacted."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
from conftest import PG_ADMIN_URL

from .conftest import Launcher, WorkerProc, record_url, wait_until


def _closed_port() -> int:
    with socket.socket() as sock:  # bound, then closed: nobody listens there
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _with(url: str, *, port: int | None = None, path: str | None = None,
          user: str | None = None) -> str:
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    netloc = f"{user or parts.username or 'postgres'}@{host}:{port or parts.port or 5432}"
    return urlunsplit(parts._replace(netloc=netloc, path=path or parts.path))


@pytest.mark.parametrize(("case", "cause"), [
    ("closed port", "Connection refused"),
    ("no such database", 'database "postlane_h7_missing" does not exist'),
    ("no such role", 'role "postlane_h7_nobody" does not exist'),
])
def test_an_unreachable_database_is_one_line_with_its_cause(
        launcher: Launcher, case: str, cause: str) -> None:
    db = {
        "closed port": _with(PG_ADMIN_URL, port=_closed_port()),
        "no such database": _with(PG_ADMIN_URL, path="/postlane_h7_missing"),
        "no such role": _with(PG_ADMIN_URL, user="postlane_h7_nobody"),
    }[case]
    env = {**launcher.env(), "COLUMNS": "80"}  # the width of an on-call laptop's terminal
    result = subprocess.run(launcher.command(db, "status"), cwd=launcher.workdir, env=env,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: cannot connect to PostgreSQL:") and cause in lines[0]
    assert "pool" not in result.stderr and result.stdout == ""


def test_a_worker_logs_json_lines_with_its_configuration_redacted(
        launcher: Launcher, fresh_pg_url: str, tmp_path: Path) -> None:
    parts = urlsplit(fresh_pg_url)  # the test server trusts local connections: any password
    db = urlunsplit(parts._replace(netloc=f"postgres:s3cret-pw@{parts.hostname}:{parts.port}"))
    launcher.cli_ok(db, "migrate")
    for i in range(3):
        launcher.cli_ok(db, "enqueue", "--to", f"grace.hopper{i}@example.com", "--key",
                        f"reset:{i}", "--text", "t", "--from", "app@example.org")
    sent = tmp_path / "sent.db"
    result = subprocess.run(
        launcher.command(db, "--log-format", "json", "worker", "--provider", record_url(sent),
                         "--drain", "--rate", "1000/s"),
        cwd=launcher.workdir, env=launcher.env(), capture_output=True, text=True, timeout=120,
        check=False)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stderr.splitlines()]  # every line is JSON
    assert records and all({"time", "level", "logger", "message"} <= r.keys() for r in records)
    configured = [r for r in records if r["message"].startswith("worker configuration:")]
    assert len(configured) == 1
    settings = configured[0]["configuration"]
    assert settings["db"].startswith("postgresql://postgres:***@")
    assert settings["rate"] == "1000/s" and settings["drain"] is True
    assert "s3cret-pw" not in result.stderr and "grace.hopper" not in result.stderr
    assert not [r for r in records if r["logger"].split(".")[0] in ("httpx", "httpcore")]
    assert os.path.exists(sent)


def test_serve_logs_json_lines_and_no_address_from_a_query(
        launcher: Launcher, sqlite_url: str) -> None:
    launcher.cli_ok(sqlite_url, "migrate")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    log_path = launcher.workdir / "serve.log"
    with log_path.open("wb") as log:
        popen = subprocess.Popen(
            launcher.command(sqlite_url, "--log-format", "json", "serve", "--port", str(port)),
            cwd=launcher.workdir, env=launcher.env(), stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT)
    proc = WorkerProc("serve", popen, log_path)
    launcher.procs.append(proc)
    wait_until(lambda: "Application startup complete" in proc.log(), 60, "serve to start",
               watch=[proc])
    base = f"http://127.0.0.1:{port}"
    assert httpx.get(f"{base}/healthz", timeout=10).status_code == 200
    httpx.get(f"{base}/v1/deliveries?recipient=heidi.lamarr%40example.com", timeout=10)
    wait_until(lambda: "heidi" in proc.log() or "h***@example.com" in proc.log(), 30,
               "the access line", watch=[proc])
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)  # uvicorn re-raises SIGTERM once it has shut down: -15, not 0
    records = [json.loads(line) for line in proc.log().splitlines()]  # every line is JSON
    assert [r for r in records if r["message"].startswith("serve configuration:")]
    assert any(r["logger"] == "uvicorn.access" for r in records)
    assert "heidi" not in proc.log()
