"""The sandbox over HTTP: its own answers, its client adapter, and ``postlane sandbox`` as a
subprocess taking a Worker's traffic with 5% accept-then-timeout."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from conftest import msg
from typer.testing import CliRunner

from postlane.cli.main import app as cli
from postlane.core.lanes import LaneConfig
from postlane.core.outcomes import OutcomeClass
from postlane.core.policy import RetryPolicy
from postlane.providers.registry import open_provider
from postlane.providers.sandbox import SandboxConfig, SandboxEngine
from postlane.providers.sandbox_client import SandboxHttpProvider
from postlane.providers.sandbox_server import bind, create_app
from postlane.store import Store
from postlane.worker import Worker, WorkerConfig
from tests.factories import delivery

POSTLANE_BIN = Path(sys.executable).with_name("postlane")




class Clock:
    def __init__(self, now: float = 1_000_000.25) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@asynccontextmanager
async def sandbox(config: SandboxConfig, clock: Clock | None = None
                  ) -> AsyncIterator[tuple[SandboxEngine, str]]:
    """The sandbox app on uvicorn in this event loop, on a free loopback port."""
    engine = SandboxEngine(config, clock=clock) if clock else SandboxEngine(config)
    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(create_app(engine), log_level="warning",
                                           lifespan="off", timeout_graceful_shutdown=0))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield engine, f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        sock.close()


# -- the server's own answers ---------------------------------------------------------------
async def test_accept_and_replay_by_key() -> None:
    async with sandbox(SandboxConfig()) as (_, base), httpx.AsyncClient() as client:
        body = {"to": "bob@example.com", "subject": "hi", "text": "x"}
        first = await client.post(f"{base}/v1/messages", json=body,
                                  headers={"Idempotency-Key": "a/b:c"})
        again = await client.post(f"{base}/v1/messages", json=body,
                                  headers={"Idempotency-Key": "a/b:c"})
        found = await client.get(f"{base}/v1/messages/a%2Fb%3Ac")
        missing = await client.get(f"{base}/v1/messages/nope")
        stats = (await client.get(f"{base}/sandbox/stats")).json()
    assert first.status_code == 200 and again.status_code == 200
    assert again.json() == {"id": first.json()["id"], "duplicate": True}
    assert found.status_code == 200 and found.json() == {"id": first.json()["id"], "key": "a/b:c"}
    assert missing.status_code == 404
    assert stats["accepted"] == 1 and stats["duplicates_suppressed"] == 1
    assert stats["accepted_keys"] == ["a/b:c"]
    assert sum(stats["by_second"].values()) == 1


async def test_rate_limit_answers_429_with_retry_after_until_the_second_ends() -> None:
    clock = Clock(1_000_000.25)
    async with sandbox(SandboxConfig(rate=2), clock) as (_, base), httpx.AsyncClient() as client:
        answers = [await client.post(f"{base}/v1/messages", json={"to": "b@example.com"},
                                     headers={"Idempotency-Key": f"k{i}"}) for i in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert answers[2].headers["Retry-After"] == "0.750"


@pytest.mark.parametrize(("config", "body", "headers", "status"), [
    (SandboxConfig(error_rate=1.0), {"to": "b@example.com"}, {"Idempotency-Key": "k"}, 503),
    (SandboxConfig(reject="^bounce"), {"to": "bounce@example.com"},
     {"Idempotency-Key": "k"}, 400),
    (SandboxConfig(unknown_templates=frozenset({"gone"})),
     {"to": "b@example.com", "template_id": "gone"}, {"Idempotency-Key": "k"}, 404),
    (SandboxConfig(), {"to": "b@example.com"}, {}, 400),
    (SandboxConfig(), {"subject": "no recipient"}, {"Idempotency-Key": "k"}, 400),
])
async def test_error_answers(config: SandboxConfig, body: dict[str, Any],
                             headers: dict[str, str], status: int) -> None:
    async with sandbox(config) as (_, base), httpx.AsyncClient() as client:
        answer = await client.post(f"{base}/v1/messages", json=body, headers=headers)
        not_json = await client.post(f"{base}/v1/messages", content=b"{",
                                     headers={"Idempotency-Key": "j"})
    assert answer.status_code == status
    assert not_json.status_code == 400


# -- the client adapter against it ----------------------------------------------------------
async def test_client_maps_the_sandbox_and_reconciles_by_lookup() -> None:
    config = SandboxConfig(timeout_rate=1.0, timeout_delay_s=2.0)
    async with sandbox(config) as (engine, base):
        provider = open_provider(f"sandbox+{base}?timeout=0.3")
        assert isinstance(provider, SandboxHttpProvider)
        await provider.open()
        try:
            outcome = await provider.send(delivery())
            found = await provider.lookup("reset:42")
            unknown = await provider.lookup("never-sent")
            again = await provider.send(delivery(attempts=1))
        finally:
            await provider.close()
    assert outcome.kind is OutcomeClass.AMBIGUOUS
    assert found is not None and found.kind is OutcomeClass.ACCEPTED
    assert unknown is None
    assert again.kind is OutcomeClass.ACCEPTED
    assert again.provider_message_id == found.provider_message_id
    assert engine.stats.accepted == 1 and engine.stats.duplicates_suppressed == 1


@pytest.mark.parametrize(("config", "kind"), [
    (SandboxConfig(throttle_rate=1.0, retry_after_s=2.0), OutcomeClass.THROTTLED),
    (SandboxConfig(error_rate=1.0), OutcomeClass.TRANSIENT),
    (SandboxConfig(reject="^bob"), OutcomeClass.PERMANENT),
])
async def test_client_table_over_the_wire(config: SandboxConfig, kind: OutcomeClass) -> None:
    async with sandbox(config) as (_, base):
        provider = open_provider(f"sandbox+{base}")
        await provider.open()
        try:
            outcome = await provider.send(delivery())
        finally:
            await provider.close()
    assert outcome.kind is kind
    if kind is OutcomeClass.THROTTLED:
        assert outcome.retry_after_s == 2.0


# -- the CLI ---------------------------------------------------------------------------------
@pytest.mark.parametrize("args", [["--error-rate", "1.5"], ["--reject", "("]])
def test_cli_refuses_bad_options(args: list[str]) -> None:
    result = CliRunner().invoke(cli, ["sandbox", "--port", "0", *args])
    assert result.exit_code == 2


class SandboxProcess:
    """``postlane sandbox`` as an OS process; its first line names the address."""

    def __init__(self, *args: str) -> None:
        if not POSTLANE_BIN.exists():
            pytest.fail(f"the postlane console script is missing at {POSTLANE_BIN} "
                        "(pip install -e .)", pytrace=False)
        env = {k: v for k, v in os.environ.items() if not k.startswith("POSTLANE_")}
        env["COLUMNS"] = "200"
        self.process = subprocess.Popen(
            [str(POSTLANE_BIN), "sandbox", "--port", "0", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )
        self.lines: list[str] = []
        ready = threading.Event()

        def read() -> None:
            assert self.process.stdout is not None
            for line in self.process.stdout:
                self.lines.append(line.rstrip("\n"))
                if "listening on" in line:
                    ready.set()
            ready.set()

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()
        if not ready.wait(30) or not any("listening on" in x for x in self.lines):
            self.stop()
            pytest.fail(f"postlane sandbox did not start: {self.lines}", pytrace=False)
        line = next(x for x in self.lines if "listening on" in x)
        self.url = line.split("listening on ", 1)[1].split()[0]

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.reader.join(5)
        if self.process.stdout is not None:
            self.process.stdout.close()
        return self.process.returncode


@pytest.fixture
def sandbox_process() -> Iterator[SandboxProcess]:
    process = SandboxProcess("--rate", "400", "--error-rate", "0.02", "--timeout-rate", "0.05",
                             "--timeout-delay", "3", "--seed", "1")
    try:
        yield process
    finally:
        process.stop()


async def test_worker_against_postlane_sandbox_with_accept_then_timeout(
    store: Store, sandbox_process: SandboxProcess,
) -> None:
    count = 400
    keys = [f"sbx:{i}" for i in range(count)]
    await store.enqueue_many([msg(k, lane="bulk", to=f"user{i}@example.com")
                              for i, k in enumerate(keys)])
    provider = open_provider(sandbox_process.url.replace("http://", "sandbox+http://"))
    lanes = (LaneConfig("interactive", 0.5), LaneConfig("bulk", 0.5, max_attempts=20))
    worker = Worker(store, provider, config=WorkerConfig(
        concurrency=40, drain=True, attempt_timeout_s=1.0, lanes=lanes,
        controls_interval_s=0.05, poll_interval_s=0.1, rescue_interval_s=0.5,
        retry=RetryPolicy(base_s=0.05, cap_s=1.0, throttle_default_s=0.1),
    ))
    async with asyncio.timeout(120):
        await worker.run()
    async with httpx.AsyncClient() as client:
        stats = (await client.get(f"{sandbox_process.url}/sandbox/stats")).json()
    states = (await store.stats()).states
    assert states.get("sent", 0) == count, states
    assert stats["timeouts"] > 0, stats  # the 5% accept-then-timeout did happen
    assert worker.counters["outcome:ambiguous"] >= stats["timeouts"]
    # No key accepted twice, and every delivery sent reached the sandbox exactly once.
    assert stats["accepted"] == len(stats["accepted_keys"]) == count
    assert sorted(stats["accepted_keys"]) == sorted(keys)
    assert stats["duplicates_suppressed"] >= stats["timeouts"]
    assert sandbox_process.stop() == 0
    assert any("sandbox stopped" in line for line in sandbox_process.lines)


async def test_the_sandbox_over_http_records_each_part_s_name_type_and_size() -> None:
    from postlane.core.attachments import Attachment, calendar_invite

    parts = (Attachment("receipt.pdf", b"%PDF-1.4\n" + bytes(range(256)), "application/pdf"),
             calendar_invite("BEGIN:VCALENDAR\r\nMETHOD:REQUEST\r\nEND:VCALENDAR\r\n"))
    async with sandbox(SandboxConfig()) as (engine, base):
        provider = open_provider(f"sandbox+{base}")
        await provider.open()
        try:
            outcome = await provider.send(delivery(attachments=parts))
        finally:
            await provider.close()
        async with httpx.AsyncClient() as client:
            found = (await client.get(f"{base}/v1/messages/reset:42")).json()
    assert outcome.kind is OutcomeClass.ACCEPTED
    expected = [
        {"filename": "receipt.pdf", "content_type": "application/pdf", "kind": "attachment",
         "size": 265},
        {"filename": "invite.ics", "content_type": "text/calendar; method=REQUEST; "
         "charset=UTF-8", "kind": "calendar", "size": 48}]
    assert engine.attachments["reset:42"] == expected
    assert found["attachments"] == expected
