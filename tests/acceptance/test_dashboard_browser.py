"""The dashboard in headless Chromium, against ``postlane serve`` started as a process on a
free loopback port over a fresh SQLite database: sign in, see the lanes, replay dead
letters through the canary flow, pause and resume a lane, open a message's timeline.

The test side plays the worker: it dead-letters messages and later sends the replayed
canary with an in-process ``Worker`` on the same database file. The dashboard's screenshot
is saved to ``docs/screenshots/dashboard.png``.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Browser, Dialog, Page, async_playwright, expect

from postlane import Message, State, open_store
from postlane.api.keys import create_key
from postlane.core.outcomes import Outcome
from postlane.core.policy import RetryPolicy
from postlane.imports import import_csv
from postlane.providers.testing import RecordingProvider
from postlane.store import Store
from postlane.templates import add_template
from postlane.worker import Worker, WorkerConfig
from postlane.worker.controls import LANE_PAUSE, pause_import

from .conftest import Launcher, WorkerProc

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "screenshots" / "dashboard.png"


# -- helpers -----------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def wait_healthy(base: str, proc: WorkerProc, timeout: float = 30.0) -> None:
    async with httpx.AsyncClient() as client:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            if proc.popen.poll() is not None:
                pytest.fail(f"postlane serve exited with {proc.popen.returncode}\n"
                            f"{proc.log_tail()}", pytrace=False)
            try:
                if (await client.get(f"{base}/healthz", timeout=1)).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if asyncio.get_running_loop().time() > deadline:
                pytest.fail(f"postlane serve not healthy after {timeout}s\n{proc.log_tail()}",
                            pytrace=False)
            await asyncio.sleep(0.1)


def serve(launcher: Launcher, db: str, port: int) -> WorkerProc:
    """``postlane serve`` as a process, cleaned up by the launcher like a worker."""
    log_path = launcher.workdir / "serve.log"
    with log_path.open("wb") as log:
        popen = subprocess.Popen(
            launcher.command(db, "serve", "--port", str(port), "--sample-interval", "1",
                             "--log-level", "warning"),
            cwd=launcher.workdir, env=launcher.env(), stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT)
    proc = WorkerProc("serve", popen, log_path)
    launcher.procs.append(proc)
    return proc


def worker_config(**overrides: object) -> WorkerConfig:
    return WorkerConfig(concurrency=4, poll_interval_s=0.05, controls_interval_s=0.05,
                        retry=RetryPolicy(base_s=0.01, cap_s=0.05), **overrides)  # type: ignore[arg-type]


async def drain(store: Store, provider: RecordingProvider) -> None:
    """Send everything that is due (the test plays the worker)."""
    await Worker(store, provider, config=worker_config(drain=True)).run()


async def send(store: Store, provider: RecordingProvider, delivery_id: int) -> None:
    """Run a worker until ``delivery_id`` is sent (other work may stay queued)."""
    worker = Worker(store, provider, config=worker_config())
    task = asyncio.create_task(worker.run())
    try:
        async with asyncio.timeout(20):
            while True:
                delivery = await store.get(delivery_id)
                if delivery is not None and delivery.state is State.SENT:
                    return
                await asyncio.sleep(0.05)
    finally:
        worker.stop()
        await task


async def seed(store: Store, provider: RecordingProvider, workdir: Path) -> list[int]:
    """Four digests dead-lettered (permanent), a sent reset, and some work still queued."""
    dead = []
    for i in range(4):
        result = await store.enqueue(Message(
            key=f"digest:{i}", to=f"reader{i}@example.com", subject="Your weekly digest",
            text="Hello", lane="bulk"))
        provider.script_key(f"digest:{i}", Outcome.permanent("550 5.1.1 mailbox unavailable"))
        dead.append(result.id)
    await store.enqueue(Message(key="reset:1", to="ada@example.com", subject="Reset",
                                text="Follow the link."))
    await drain(store, provider)
    # Work that stays queued, for depth and age to look at: an import run paused by its
    # operator, and a code sent later on purpose.
    await add_template(store, "welcome", subject="Welcome, {{ name }}",
                       text="Hello {{ name }}, your account is ready.")
    rows = "".join(f"{i},new{i}@example.com,Reader {i}\n" for i in range(12))
    (workdir / "spring.csv").write_text("user_id,email,name\n" + rows)
    await import_csv(store, workdir / "spring.csv", template="welcome", import_id="spring")
    await pause_import(store, "spring")
    await store.enqueue(Message(key="code:7", to="bob@example.com", subject="Your code",
                                text="123456", delay=timedelta(minutes=30)))
    return dead


def late_signup(i: int) -> Message:
    return Message(key=f"welcome:late:{i}", to=f"late{i}@example.com", subject="Welcome",
                   text="Hi", lane="bulk", import_id="spring")


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        instance = await playwright.chromium.launch(executable_path=CHROMIUM,
                                                    args=CHROMIUM_ARGS)
        try:
            yield instance
        finally:
            await instance.close()


async def notice(page: Page) -> str:
    text = await page.locator("p.notice").inner_text()
    return text.strip()


# -- the test ----------------------------------------------------------------------------
async def test_operator_dashboard_in_a_browser(launcher: Launcher, browser: Browser,
                                               tmp_path: Path) -> None:
    async with asyncio.timeout(120):
        await operate_the_dashboard(launcher, browser, tmp_path)


async def operate_the_dashboard(launcher: Launcher, browser: Browser, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'postlane.db'}"
    provider = RecordingProvider()
    async with open_store(db) as store:
        await store.migrate()
        _, token = await create_key(store, "read,operate", name="ops")
        _, reader_token = await create_key(store, "read", name="auditor")
        dead = await seed(store, provider, tmp_path)

        port = free_port()
        base = f"http://127.0.0.1:{port}"
        server = serve(launcher, db, port)
        await wait_healthy(base, server)

        context = await browser.new_context(viewport={"width": 1280, "height": 900})
        page = await context.new_page()
        dialogs: list[str] = []

        async def accept(dialog: Dialog) -> None:
            dialogs.append(dialog.message)
            await dialog.accept()

        page.on("dialog", accept)

        # Sign in: the dashboard sends us to the login form first.
        await page.goto(f"{base}/dashboard")
        await expect(page).to_have_url(f"{base}/dashboard/login?next=%2Fdashboard")
        await page.fill("#api_key", "pl_wrong")
        await page.click("button[type=submit]")
        await expect(page.locator("[role=alert]")).to_contain_text("unknown or revoked")
        await page.fill("#api_key", token)
        await page.click("button[type=submit]")
        await expect(page).to_have_url(f"{base}/dashboard")

        # The lanes, with depth, oldest age and charts.
        bulk = page.locator("tr[data-lane=bulk]")
        await expect(bulk.locator("td.depth")).to_have_text("12")
        await expect(page.locator("tr[data-lane=interactive] td.depth")).to_have_text("1")
        assert await bulk.locator("svg.spark").count() == 2
        await expect(page.locator("ul.counts").first).to_contain_text("permanent 4")

        # Pause and resume a lane (after a confirmation dialog).
        await bulk.get_by_role("button", name="Pause bulk").click()
        await expect(page.locator("p.notice")).to_contain_text("lane bulk paused")
        await expect(bulk.locator(".badge")).to_have_text("paused")
        assert dialogs and "Pause lane bulk" in dialogs[-1]
        assert LANE_PAUSE + "bulk" in await store.get_controls()
        await bulk.get_by_role("button", name="Resume bulk").click()
        await expect(page.locator("p.notice")).to_contain_text("lane bulk resumed")
        await expect(bulk.locator(".badge")).to_have_text("running")
        assert LANE_PAUSE + "bulk" not in await store.get_controls()

        # Dead letters: the rest of a selection is refused before its canary was sent.
        await page.click("nav >> text=Dead letters")
        await page.select_option("select[name=reason]", "permanent")
        await page.click("form.filters button[type=submit]")
        rows = page.locator("table.dead tbody tr")
        await expect(rows).to_have_count(4)
        rest = page.get_by_role("button", name="Replay the rest of this selection")
        await rest.click()
        await expect(page.locator("p.notice.error")).to_contain_text(
            "replay one entry of this selection first")

        canary = page.locator(f"tr[data-id='{dead[0]}']")
        await canary.get_by_role("button", name="Replay").click()
        await expect(page.locator("p.notice")).to_contain_text(
            f"replayed delivery {dead[0]} (the canary)")
        await expect(rows).to_have_count(3)  # it left the open list
        await rest.click()
        await expect(page.locator("p.notice.error")).to_contain_text(
            "the canary has not been sent yet")

        discard = page.locator(f"tr[data-id='{dead[3]}']")
        await discard.locator("input[name=reason]").fill("reader unsubscribed")
        await discard.get_by_role("button", name="Discard").click()
        await expect(page.locator("p.notice")).to_contain_text(
            f"discarded dead letter {dead[3]}: reader unsubscribed")
        await expect(rows).to_have_count(2)

        await send(store, provider, dead[0])  # the cause is fixed: the canary goes out

        await rest.click()
        await expect(page.locator("p.notice")).to_contain_text(
            f"canary {dead[0]} was sent; replayed 2 entries")
        await expect(page.locator("table.dead tbody")).to_contain_text("No dead letters match")
        for delivery_id in dead[1:3]:
            delivery = await store.get(delivery_id)
            assert delivery is not None and delivery.state is State.PENDING
        discarded = await store.get(dead[3])
        assert discarded is not None and discarded.state is State.DEAD

        # A message's timeline, found by its key from the search box.
        await page.fill("header input[name=q]", "digest:0")
        await page.press("header input[name=q]", "Enter")
        await expect(page).to_have_url(f"{base}/dashboard/messages/{dead[0]}")
        timeline = page.locator("table.timeline")
        for kind in ("enqueued", "claimed", "dead_lettered", "replayed", "sent"):
            await expect(timeline).to_contain_text(kind)
        await expect(page.locator("h1 .badge")).to_have_text("sent")

        # A read-only key sees everything and can change nothing.
        readonly = await browser.new_context()
        other = await readonly.new_page()
        await other.goto(f"{base}/dashboard/login")
        await other.fill("#api_key", reader_token)
        await other.click("button[type=submit]")
        await expect(other.locator("tr[data-lane=bulk] .badge")).to_have_text("running")
        assert await other.get_by_role("button", name="Pause bulk").count() == 0
        await readonly.close()

        # The screenshot of the overview, with a few seconds of samples in the charts.
        for i in range(12, 20):
            await store.enqueue(late_signup(i))
            await asyncio.sleep(0.4)
        await page.goto(f"{base}/dashboard")
        await expect(page.locator("tr[data-lane=bulk] td.depth")).to_have_text("22")
        await expect(page.locator("table.imports")).to_contain_text("spring")
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(SCREENSHOT), full_page=True)
        await context.close()
