"""Django's ``send_mail`` through ``postlane.django.EmailBackend``, in a real Django project
(tests/integration/django_project.py, a subprocess per run: Django's settings are global),
on SQLite and on PostgreSQL with psycopg 3 and with psycopg2.

The project migrates with ``manage.py postlane_migrate``, then writes business rows and
their emails together: a rolled-back block leaves neither, a committed one both (one
delivery per recipient, headers, HTML and lane mapped), a refused email leaves the caller's
transaction usable; then ``manage.py postlane_worker --provider sandbox:// --drain`` sends
every delivery.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from postlane.core.states import State
from postlane.store import open_store

PROJECT = Path(__file__).with_name("django_project.py")


def run(engine: str, database: str, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, str(PROJECT), engine, database, *args],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done


@pytest.fixture(params=["sqlite", "psycopg", "psycopg2"])
def project(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str, str]:
    """(engine, the database as the project names it, Postlane's store URL)."""
    if request.param == "sqlite":
        path = str(tmp_path / "site.db")
        return "sqlite", path, f"sqlite:///{path}"
    url = request.getfixturevalue("fresh_pg_url")
    return request.param, url, url


def accounts(url: str) -> list[int]:
    if url.startswith("sqlite"):
        with sqlite3.connect(url[len("sqlite:///"):]) as conn:
            return [r[0] for r in conn.execute("SELECT id FROM accounts ORDER BY id")]
    with psycopg.connect(url) as pg:
        return [r[0] for r in pg.execute("SELECT id FROM accounts ORDER BY id")]


async def test_send_mail_in_the_callers_transaction(project: tuple[str, str, str]) -> None:
    engine, database, url = project
    seen: dict[str, Any] = json.loads(run(engine, database, "scenario").stdout)
    assert seen["driver"] == ("sqlite3" if engine == "sqlite" else engine)
    assert "applied 0001_initial" in seen["migrate"]
    assert seen["outbox_after_rollback"] == 0
    assert (seen["sent_2"], seen["outbox_inside_atomic"], seen["outbox_after_commit"]) == (
        1, 0, 3)
    assert "other content" in seen["conflict"]
    assert (seen["send_mail"], seen["mass"], seen["fail_silently"]) == (1, 2, 0)
    assert "without a path" in seen["attachment_error"]
    assert "unknown POSTLANE settings ['LAEN']" in seen["typo"]
    # The business rows: 1 rolled back with its email, 3 committed after a refused email.
    assert accounts(url) == [2, 3]
    keys = [k for k, _, _ in seen["outbox"]]
    assert keys[:3] == ["welcome:2:0", "welcome:2:1", "welcome:2:2"]
    assert keys[-1] == "receipt:9"
    assert all(k.startswith("django:") for k in keys[3:6])

    async with open_store(url) as store:
        assert await store.get("welcome:1") is None
        assert (await store.stats()).states["pending"] == 7
        recipients = []
        for n in range(3):
            d = await store.get(f"welcome:2:{n}")
            assert d is not None
            recipients.append(d.recipient)
            assert (d.subject, d.text, d.html, d.lane, d.sender) == (
                "Welcome", "Hi Bo", "<p>Hi Bo</p>", "bulk", "shop@example.com")
            assert d.headers == {"X-Campaign": "spring", "Reply-To": "help@example.com"}
        assert recipients == ["bo@example.com", "cc@example.com", "audit@example.com"]
        receipt = await store.get("receipt:9")
        assert receipt is not None
        assert (receipt.subject, receipt.text, receipt.template_id) == (
            "Receipt 9", "Paid 9", "receipt")

    run(engine, database, "manage", "postlane_worker", "--provider", "sandbox://", "--drain",
        "--log-level", "WARNING")
    async with open_store(url) as store:
        states = (await store.stats()).states
        assert states["sent"] == 7 and states["pending"] == 0
        for key in keys:
            d = await store.get(key)
            assert d is not None and d.state == State.SENT


def test_postlane_migrate_twice_is_a_no_op(tmp_path: Path) -> None:
    path = str(tmp_path / "site.db")
    first = run("sqlite", path, "manage", "postlane_migrate").stdout
    again = run("sqlite", path, "manage", "postlane_migrate").stdout
    assert "applied 0001_initial" in first
    assert again.strip() == "Postlane's schema is up to date"


async def test_attach_attach_file_inline_and_an_invite_are_stored(
        project: tuple[str, str, str], tmp_path: Path) -> None:
    engine, database, url = project
    seen = json.loads(run(engine, database, "attachments", str(tmp_path)).stdout)
    assert seen == {"sent": 1}
    async with open_store(url) as store:
        delivery = await store.get("invoice:7")
        assert delivery is not None and delivery.html == '<p>Invoice</p><img src="cid:logo">'
        (parts,) = (await store.attachments_among([delivery.id])).values()
    assert [(p.filename, p.content_type, p.kind, p.content_id, p.content) for p in parts] == [
        ("invite.ics", "text/calendar; method=REQUEST; charset=UTF-8", "calendar", None,
         b"BEGIN:VCALENDAR\r\nMETHOD:REQUEST\r\nEND:VCALENDAR\r\n"),
        ("notes.txt", "text/plain", "attachment", None, "héllo".encode()),
        ("invoice 7.pdf", "application/pdf", "attachment", None, b"%PDF-1.4\n\x00\xff" * 50),
        ("logo", "image/png", "inline", "logo", b"\x89PNG\r\n\x1a\n\x00"),
    ]
