"""The second channel and the import canary as an operator runs them: real ``postlane``
processes on both engines.

- ``postlane worker --provider sandbox-sms://`` sends SMS deliveries, while an email worker
  (``record://``) in the same lanes leaves them alone; an email's SMS fallback created by the
  email worker's housekeeping is sent by the SMS worker, and ``timeline`` shows the pair.
- ``postlane import --canary N`` holds the rest until the canary is sent; ``imports show``
  says so.
"""

from __future__ import annotations

import csv
import json
import signal
from pathlib import Path

import pytest
from conftest import SideDB

from postlane import Message, open_store
from postlane.core.fallback import with_sms_fallback
from postlane.core.sms import sms_message
from postlane.templates import add_template

from .conftest import Launcher, wait_until

PHONE = "+14155550100"


def _db_url(engine: str, request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("fresh_pg_url" if engine == "postgres" else "sqlite_url"))


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
async def test_an_sms_worker_from_the_command_line_sends_the_fallback_of_a_refused_email(
        engine: str, request: pytest.FixtureRequest, launcher: Launcher,
        tmp_path: Path) -> None:
    db = _db_url(engine, request)
    async with open_store(db) as store:
        await store.migrate()
        await store.enqueue(sms_message(key="otp:1", to=PHONE, text="Your code is 1"))
        refused = with_sms_fallback(
            Message(key="reset:1", to="bounce@example.com", subject="Reset", text="Code 2"),
            to=PHONE, text="Your reset code is 2")
        await store.enqueue(refused)
        await store.enqueue(Message(key="reset:2", to="ok@example.com", subject="Reset",
                                    text="Code 3"))
    email = launcher.worker(db, "sandbox://?reject=%5Ebounce", name="email")
    with SideDB(db) as side:
        def settled() -> bool:
            states = dict(side.query(
                "SELECT idempotency_key, state FROM postlane_delivery_rows"))
            return (states.get("reset:1") == "dead" and states.get("reset:2") == "sent"
                    and "sms-fallback:reset:1" in states)
        wait_until(settled, 30, "the email worker's outcomes and the fallback", watch=[email])
        # The email worker never claimed an SMS delivery.
        assert side.count("postlane_deliveries", "channel = 'sms' AND claims > 0") == 0
        texts = launcher.worker(db, "sandbox-sms://?seed=3", name="sms")
        wait_until(lambda: side.count("postlane_deliveries",
                                      "channel = 'sms' AND state = 'sent'") == 2,
                   30, "both SMS sent", watch=[email, texts])
        for proc in (email, texts):
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0, proc.log_tail()
        assert side.count("postlane_deliveries", "channel = 'email' AND claims > 1") == 0
    shown = launcher.cli_ok(db, "timeline", "reset:1")
    assert "sms fallback (dead): delivery" in shown and "key=sms-fallback:reset:1" in shown
    assert "state=sent GSM-7 1 segment(s)" in shown
    status = json.loads(launcher.cli_ok(db, "status", "--json"))
    assert status["sms_fallbacks"] == {"dead": 1}
    assert status["pending_by_channel"] == {}


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
async def test_import_canary_from_the_command_line(
        engine: str, request: pytest.FixtureRequest, launcher: Launcher,
        tmp_path: Path) -> None:
    db = _db_url(engine, request)
    async with open_store(db) as store:
        await store.migrate()
        await add_template(store, "welcome", subject="Welcome {{ name }}", text="Hi {{ name }}")
    path = tmp_path / "users.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["user_id", "email", "name"])
        for i in range(40):
            writer.writerow([f"u{i}", f"user{i}@example.com", f"User {i}"])
    out = launcher.cli_ok(db, "import", str(path), "--template", "welcome", "--import-id",
                          "spring", "--canary", "4")
    assert "canary: the first 4 go now" in out
    shown = json.loads(launcher.cli_ok(db, "imports", "show", "spring", "--json"))
    assert shown["canary"]["state"] == "waiting" and shown["canary"]["held"] == 36
    text = launcher.cli_ok(db, "imports", "show", "spring")
    assert "canary: waiting (4 first: 4 pending); 36 held" in text
    worker = launcher.worker(db, "sandbox://", name="email")
    with SideDB(db) as side:
        wait_until(lambda: side.count("postlane_deliveries", "state = 'sent'") == 40, 60,
                   "every delivery sent", watch=[worker])
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    shown = json.loads(launcher.cli_ok(db, "imports", "show", "spring", "--json"))
    assert shown["canary"]["state"] == "passed" and shown["canary"]["held"] == 0
