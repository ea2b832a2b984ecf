"""The whole bounce loop with real processes: `postlane sandbox` accepts a message and posts
a signed hard-bounce event to `postlane serve`; the address is suppressed; the next message
to it ends as `suppressed` and never reaches the provider."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.acceptance.conftest import Launcher, WorkerProc, wait_until

pytestmark = pytest.mark.slow

SECRET = "whsec_" + base64.b64encode(b"acceptance-webhook-secret-0123").decode()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start(launcher: Launcher, name: str, db: str, *args: str) -> WorkerProc:
    log_path = launcher.workdir / f"{name}.log"
    env = {**launcher.env(), "POSTLANE_WEBHOOK_SECRET_SANDBOX": SECRET}
    with log_path.open("wb") as log:
        popen = subprocess.Popen(launcher.command(db, *args), cwd=launcher.workdir, env=env,
                                 stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    proc = WorkerProc(name, popen, log_path)
    launcher.procs.append(proc)
    return proc


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code < 500
    except httpx.HTTPError:
        return False


def test_a_bounce_posted_by_the_sandbox_suppresses_the_next_send(launcher: Launcher,
                                                                  tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'loop.db'}"
    launcher.cli_ok(db, "migrate")
    api_port, sandbox_port = free_port(), free_port()
    start(launcher, "serve", db, "serve", "--port", str(api_port))
    start(launcher, "sandbox", db, "sandbox", "--port", str(sandbox_port), "--webhook-url",
          f"http://127.0.0.1:{api_port}/v1/webhooks/sandbox", "--bounce", "^gone@")
    wait_until(lambda: answers(f"http://127.0.0.1:{api_port}/healthz"), 30, "the API answers")
    wait_until(lambda: answers(f"http://127.0.0.1:{sandbox_port}/sandbox/stats"), 30,
               "the sandbox answers")
    provider = f"sandbox+http://127.0.0.1:{sandbox_port}"

    launcher.cli_ok(db, "enqueue", "--to", "gone@example.com", "--key", "welcome:1",
                    "--text", "hi")
    launcher.worker(db, provider, "--drain").wait(60)

    def suppressed() -> bool:
        rows = json.loads(launcher.cli_ok(db, "suppress", "list", "--json"))
        return [r["address"] for r in rows] == ["gone@example.com"]

    wait_until(suppressed, 20, "the bounce suppressed the address")
    timeline = json.loads(launcher.cli_ok(db, "timeline", "welcome:1", "--json"))
    assert "provider:bounced" in [e["kind"] for e in timeline[0]["events"]]

    launcher.cli_ok(db, "enqueue", "--to", "gone@example.com", "--key", "reset:2",
                    "--text", "your code")
    launcher.worker(db, provider, "--drain").wait(60)
    second = json.loads(launcher.cli_ok(db, "timeline", "reset:2", "--json"))[0]
    assert second["delivery"]["state"] == "suppressed"
    stats = httpx.get(f"http://127.0.0.1:{sandbox_port}/sandbox/stats", timeout=5).json()
    assert stats["accepted_keys"] == ["welcome:1"]  # the second never reached the provider
