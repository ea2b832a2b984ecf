"""The dashboard in headless Chromium, against ``postlane serve`` started as a process on a
free loopback port over a fresh SQLite database: sign in, see the lanes, replay dead
letters through the canary flow, pause and resume a lane, open a message's timeline.

The test side plays the worker: it dead-letters messages and later sends the replayed
canary with an in-process ``Worker`` on the same database file. The pages' screenshots
go to the test's temporary directory, or, with ``POSTLANE_UPDATE_SCREENSHOTS=1``, to
``docs/screenshots/`` (the pictures in docs/dashboard.md), so that an ordinary run leaves
the working tree as it found it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sqlite3
import subprocess
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Browser, Dialog, Page, async_playwright, expect

from postlane import Message, State, __version__, open_store
from postlane.api.keys import create_key
from postlane.core.breaker import CONTROL_PREFIX, BreakerConfig, account_trouble
from postlane.core.outcomes import Outcome
from postlane.core.policy import RetryPolicy
from postlane.core.records import Claim, DeliveryFilter, Transition, WorkerHeartbeat
from postlane.imports import import_csv
from postlane.providers.testing import RecordingProvider
from postlane.store import Store
from postlane.templates import add_template
from postlane.worker import Worker, WorkerConfig
from postlane.worker.controls import LANE_PAUSE, pause_import, pause_lane, resume_lane

from .conftest import Launcher, WorkerProc

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
DOCS_SHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


def shots_dir(tmp_path: Path) -> Path:
    """Where this run's screenshots go (see the module's docstring)."""
    shots = DOCS_SHOTS if os.environ.get("POSTLANE_UPDATE_SCREENSHOTS") == "1" \
        else tmp_path / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    return shots


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
        await page.screenshot(path=str(shots_dir(tmp_path) / "dashboard.png"),
                              full_page=True)
        await context.close()


# -- the on-call pages -------------------------------------------------------------------


async def seed_on_call(store: Store, provider: RecordingProvider, workdir: Path) -> dict[str, int]:
    """A sent receipt with an HTML part, four dead digests (their outcomes counted by the
    worker that sent them), an import of twelve queued welcomes and three invoices held
    ambiguous for an operator."""
    receipt = await store.enqueue(Message(
        key="receipt:1001", to="ada@example.com", subject="Your receipt #1001",
        text="Thank you, Ada.\nTotal: 12.00 EUR",
        html='<h2 style="font-family:sans-serif">Thank you, Ada</h2>'
             '<p style="font-family:sans-serif">Total: <b>12.00 EUR</b></p>'
             '<img src="https://tracker.example/open.gif" width="1" height="1" alt="">'))
    provider.script_key("receipt:1001", Outcome.accepted(
        "4F2A1C", response="250 2.0.0 Ok: queued as 4F2A1C"))
    for i in range(4):
        await store.enqueue(Message(key=f"digest:{i}", to=f"reader{i}@example.com",
                                    subject="Your weekly digest", text="Hello", lane="bulk"))
        provider.script_key(f"digest:{i}", Outcome.permanent("550 5.1.1 mailbox unavailable"))
    await drain(store, provider)
    await add_template(store, "welcome", subject="Welcome, {{ name }}",
                       text="Hello {{ name }}, your account is ready.")
    rows = "".join(f"{i},new{i}@example.com,Reader {i}\n" for i in range(12))
    (workdir / "spring.csv").write_text("user_id,email,name\n" + rows)
    await import_csv(store, workdir / "spring.csv", template="welcome", import_id="spring")
    for i in range(3):
        await store.enqueue(Message(key=f"invoice:{i}", to=f"billing{i}@example.com",
                                    subject="Your invoice", text="Attached."))
    claimed = await store.claim_batch("interactive", 10, "test", timedelta(seconds=30))
    await store.start_attempts("test", [Claim(d.id, d.claims) for d in claimed])
    await store.set_state_if_sending_many("test", [Transition(
        d.id, d.claims, State.AMBIGUOUS, "ambiguous", error="timed out after DATA",
        detail={"outcome": "ambiguous", "resolution": "hold"}) for d in claimed])
    # A worker on another host that died an hour ago: its heartbeat stayed behind.
    await store.record_heartbeat(WorkerHeartbeat(
        owner="mail-2:7177:0be1d3", host="mail-2", pid=7177, version=__version__,
        provider="record", lanes={"interactive": 0.7, "bulk": 0.3}, in_flight=12,
        interval_s=5.0), {})
    return {"receipt": receipt.id, "ambiguous": len(claimed)}


def age_heartbeat(db_path: Path, owner: str, seconds: float) -> None:
    with sqlite3.connect(db_path) as conn:
        conn.execute("UPDATE postlane_workers SET started_at = started_at - ?, "
                     "heartbeat_at = heartbeat_at - ? WHERE owner = ?",
                     (seconds + 3600, seconds, owner))


async def test_on_call_pages_in_a_browser(launcher: Launcher, browser: Browser,
                                          tmp_path: Path) -> None:
    async with asyncio.timeout(150):
        await operate_on_call(launcher, browser, tmp_path)


async def operate_on_call(launcher: Launcher, browser: Browser, tmp_path: Path) -> None:
    shots = shots_dir(tmp_path)
    db_path = tmp_path / "postlane.db"
    db = f"sqlite:///{db_path}"
    provider = RecordingProvider()
    async with open_store(db) as store:
        await store.migrate()
        _, token = await create_key(store, "read,operate", name="ops")
        seeded = await seed_on_call(store, provider, tmp_path)
        age_heartbeat(db_path, "mail-2:7177:0be1d3", 3600)
        # The lanes are paused while the operator works, so the worker process started
        # later heart-beats but sends nothing.
        for lane in ("interactive", "bulk"):
            await pause_lane(store, lane, by="on-call")

        port = free_port()
        base = f"http://127.0.0.1:{port}"
        await wait_healthy(base, serve(launcher, db, port))
        context = await browser.new_context(viewport={"width": 1280, "height": 900})
        page = await context.new_page()
        page.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))
        await page.goto(f"{base}/dashboard/login")
        await page.fill("#api_key", token)
        await page.click("button[type=submit]")
        await expect(page).to_have_url(f"{base}/dashboard")

        # The messages browser: every delivery, newest first, then filtered.
        await page.click("nav >> text=Messages")
        count = page.locator("p.count strong")
        await expect(count).to_have_text("20")
        rows = page.locator("table.browser tbody tr")
        await expect(rows).to_have_count(20)
        await page.select_option("select[name=lane]", "bulk")
        await page.click("form.filters button[type=submit]")
        await expect(count).to_have_text("16")
        await expect(page.locator("table.browser")).to_contain_text("digest:0")
        await page.screenshot(path=str(shots / "messages.png"), full_page=True)

        # A bulk cancel of the import's queued welcomes: counted, confirmed, done.
        await page.select_option("select[name=lane]", "")
        await page.fill("input[name=import_id]", "spring")
        await page.click("form.filters button[type=submit]")
        await expect(count).to_have_text("12")
        await page.get_by_role("link", name="Cancel queued…").click()
        await expect(page.locator("p.count")).to_contain_text("Cancel 12 queued deliveries")
        await page.fill("input[name=reason]", "wrong list uploaded")
        await page.screenshot(path=str(shots / "bulk-cancel.png"), full_page=True)
        await page.get_by_role("button", name="Cancel queued: 12").click()
        await expect(page.locator("p.notice")).to_have_text("cancelled 12 queued deliveries")
        await expect(page.locator("table.browser tbody")).to_contain_text("No messages match")
        welcomes = await store.list_deliveries(DeliveryFilter(import_id="spring"))
        assert {d.state for d in welcomes} == {"cancelled"} and len(welcomes) == 12
        event = (await store.timeline(welcomes[0].id))[-1]
        assert event.data == {"reason": "wrong list uploaded", "by": "apikey:ops#1"}

        # A bulk resolve of the invoices held ambiguous.
        await page.goto(f"{base}/dashboard/messages?state=ambiguous")
        await expect(count).to_have_text(str(seeded["ambiguous"]))
        await page.get_by_role("link", name="Resolve ambiguous…").click()
        await expect(page.locator("p.count")).to_contain_text("Resolve 3 ambiguous deliveries")
        await page.select_option("select[name=resolution]", "sent")
        await page.fill("input[name=reason]", "found in the provider's log")
        await page.get_by_role("button", name="Resolve ambiguous: 3").click()
        await expect(page.locator("p.notice")).to_have_text(
            "resolved 3 ambiguous deliveries as sent")
        invoices = await store.list_deliveries(DeliveryFilter(state="sent"))
        assert sorted(d.key for d in invoices if d.key.startswith("invoice:")) == [
            "invoice:0", "invoice:1", "invoice:2"]

        # A message's page: content previewed, the provider's reply labelled as such.
        await page.goto(f"{base}/dashboard/messages/{seeded['receipt']}")
        await expect(page.locator("pre.text-part")).to_contain_text("Total: 12.00 EUR")
        frame = page.frame_locator("iframe.html-part")
        await expect(frame.locator("h2")).to_have_text("Thank you, Ada")
        await expect(page.locator("table.attempts")).to_contain_text("accepted")
        await expect(page.locator("dl.facts")).to_contain_text(
            "Provider reply250 2.0.0 Ok: queued as 4F2A1C")
        assert await page.get_by_text("Last error").count() == 0
        await page.screenshot(path=str(shots / "message.png"), full_page=True)

        # The workers page: a running worker process, and the one that died.
        worker = launcher.worker(db, f"record://{tmp_path / 'sends.db'}", name="worker")
        await page.click("nav >> text=Workers")
        running = page.locator(f"tr.alive:has-text('{worker.pid}')")
        for _ in range(300):  # until its first heartbeat, a second or two after it starts
            if await running.count():
                break
            await asyncio.sleep(0.1)
            await page.reload()
        await expect(running).to_contain_text("running")
        await expect(running).to_contain_text("interactive 70%")
        await expect(page.locator("tr.gone")).to_contain_text("mail-2")
        await page.screenshot(path=str(shots / "workers.png"), full_page=True)

        # Throughput: the outcomes the seeding worker counted, read from the database.
        await page.click("nav >> text=Throughput")
        bulk_dead = page.locator("section[data-lane=bulk] tr[data-outcome=dead] td.total")
        await expect(bulk_dead).to_have_text("4")
        await page.screenshot(path=str(shots / "throughput.png"), full_page=True)

        # The breaker banner on every page, and "probe now" that lets a worker close it.
        await store.set_control(CONTROL_PREFIX + "record", account_trouble(
            time.time(), BreakerConfig(), "535 5.7.8 Authentication credentials invalid",
            retry_after_s=3600).as_json())
        await store.enqueue(Message(key="reset:probe", to="ada@example.com",
                                    subject="Reset your password", text="Follow the link."))
        await resume_lane(store, "interactive")
        await page.goto(f"{base}/dashboard")
        banner = page.locator(".breaker-banner")
        await expect(banner).to_contain_text("Breaker open for record")
        await expect(banner).to_contain_text("535 5.7.8 Authentication credentials invalid")
        await page.click("nav >> text=Messages")
        await expect(banner).to_be_visible()
        await page.click("nav >> text=Overview")
        await page.screenshot(path=str(shots / "breaker.png"), full_page=True)
        await banner.get_by_role("button", name="Probe now").click()
        await expect(page.locator("p.notice")).to_contain_text("a worker sends the probe")
        for _ in range(200):  # the worker probes within a second or two; the banner goes
            await page.reload()
            if await banner.count() == 0:
                break
            await asyncio.sleep(0.1)
        await expect(banner).to_have_count(0)
        probe = await store.get("reset:probe")
        assert probe is not None and probe.state is State.SENT

        # A clean stop removes the worker from the page.
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
        await page.goto(f"{base}/dashboard/workers")
        await expect(page.locator("tr.alive")).to_have_count(0)
        await expect(page.locator("tr.gone")).to_have_count(1)
        await context.close()
