"""``postlane import`` as an operator runs it: a real process over a large CSV, killed with
SIGKILL half-way, then run again. Every user ends with exactly one delivery, and the run
record tells the operator what happened."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import SideDB

from postlane import open_store
from postlane.templates import add_template

from .conftest import Launcher, WorkerProc, wait_until

ROWS = 12_000
IMPORT = "imp-2026-03"


def _db_url(engine: str, request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("fresh_pg_url" if engine == "postgres" else "sqlite_url"))


async def _prepare(db: str, subject: str, text: str) -> None:
    """Schema and template in-process (the CLI forms are covered elsewhere; each CLI start
    costs a second or two)."""
    async with open_store(db) as store:
        await store.migrate()
        await add_template(store, "welcome", subject=subject, text=text)


def _write_users(path: Path, n: int) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["user_id", "email", "name"])
        for i in range(n):
            writer.writerow([f"u{i}", f"user{i}@example.com", f"User {i}"])
    return path


def _start_import(launcher: Launcher, db: str, path: Path) -> WorkerProc:
    log_path = launcher.workdir / "import-1.log"
    with log_path.open("wb") as log:
        popen = subprocess.Popen(
            launcher.command(db, "import", str(path), "--template", "welcome",
                             "--import-id", IMPORT, "--batch-size", "500"),
            cwd=launcher.workdir, env=launcher.env(), stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT,
        )
    proc = WorkerProc("import-1", popen, log_path)
    launcher.procs.append(proc)  # killed by the launcher's cleanup if the test fails early
    return proc


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["postgres", "sqlite"])
async def test_kill_9_half_way_then_rerun_creates_each_delivery_exactly_once(
    engine: str, request: pytest.FixtureRequest, launcher: Launcher, tmp_path: Path
) -> None:
    db = _db_url(engine, request)
    await _prepare(db, "Welcome, {{ name }}", "Hello {{ name }}, your id is {{ user_id }}.")
    path = _write_users(tmp_path / "users.csv", ROWS)

    with SideDB(db) as side:
        def created() -> int:
            return side.count("postlane_deliveries")

        proc = _start_import(launcher, db, path)
        wait_until(lambda: created() >= ROWS // 4, timeout=60,
                   what="the import to be a quarter through", watch=[proc])
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
        partial = created()
        assert 0 < partial < ROWS, f"killed too late to test a resume ({partial} of {ROWS})"
        killed = json.loads(launcher.cli_ok(db, "imports", "show", IMPORT, "--json"))
        assert killed["finished_at"] is None  # the operator sees it stopped half-way
        assert killed["deliveries"]["created"] == partial
        assert killed["rows"]["enqueued"] <= partial  # counters commit with their batch

        again = launcher.cli(db, "import", str(path), "--template", "welcome",
                             "--import-id", IMPORT, "--json", timeout=120)
        assert again.returncode == 0, again.stderr
        report = json.loads(again.stdout)
        assert (report["rows_read"], report["rows_enqueued"], report["rows_skipped"]) == (
            ROWS, ROWS, 0)
        assert report["rows_created"] == ROWS - partial

        assert created() == ROWS
        assert side.scalar("SELECT count(DISTINCT recipient) FROM postlane_delivery_rows") == ROWS
        assert side.count("postlane_delivery_rows",
                          "import_id = ? AND lane = 'bulk' AND template_id = 'welcome'",
                          (IMPORT,)) == ROWS
        assert side.scalar("SELECT max(n) FROM (SELECT count(*) AS n FROM postlane_delivery_rows "
                           "GROUP BY recipient) AS per_user") == 1
        row = side.query("SELECT subject, text_body FROM postlane_delivery_rows "
                         "WHERE idempotency_key = ?", (f"welcome:u123:{IMPORT}",))
        assert row == [("Welcome, User 123", "Hello User 123, your id is u123.")]

    shown = json.loads(launcher.cli_ok(db, "imports", "show", IMPORT, "--json"))
    assert shown["runs"] == 2 and shown["finished_at"] is not None
    assert shown["rows"] == {"read": ROWS, "enqueued": ROWS, "created": ROWS - partial,
                             "skipped": 0}
    assert shown["deliveries"]["created"] == ROWS
    assert shown["deliveries"]["queued"] == ROWS

    # The pause button, from the command line; nothing is deleted.
    launcher.cli_ok(db, "imports", "pause", IMPORT)
    listed = json.loads(launcher.cli_ok(db, "imports", "list", "--json"))
    assert [(i["import_id"], i["paused"]) for i in listed] == [(IMPORT, True)]
    launcher.cli_ok(db, "imports", "resume", IMPORT)
    status = json.loads(launcher.cli_ok(db, "status", "--json"))
    assert status["paused_imports"] == [] and status["states"]["pending"] == ROWS


async def test_strict_import_of_a_file_with_a_bad_row_exits_1_and_names_the_line(
    request: pytest.FixtureRequest, launcher: Launcher, tmp_path: Path
) -> None:
    db = _db_url("sqlite", request)
    await _prepare(db, "Hi {{ name }}", "Hello")
    path = tmp_path / "users.csv"
    path.write_text("user_id,email,name\n1,a@example.com,A\n2,broken,B\n3,c@example.com,C\n",
                    encoding="utf-8")
    strict = launcher.cli(db, "import", str(path), "--template", "welcome", "--import-id",
                          "i1", "--strict")
    assert strict.returncode == 1
    assert "line 3: email" in strict.stderr and "nothing was imported" in strict.stderr
    lenient = launcher.cli(db, "import", str(path), "--template", "welcome", "--import-id",
                           "i1", "--json")
    assert lenient.returncode == 4  # the good rows are in, but a row was skipped
    assert json.loads(lenient.stdout)["rows_created"] == 2
    assert "line 3: email" in lenient.stderr and "1 row(s) skipped" in lenient.stderr
    tolerant = launcher.cli(db, "import", str(path), "--template", "welcome", "--import-id",
                            "i1", "--json", "--max-skipped", "1")
    assert tolerant.returncode == 0
    assert json.loads(tolerant.stdout)["rows_created"] == 0  # a re-run creates nothing twice
    refused = launcher.cli(db, "templates", "delete", "welcome")
    assert refused.returncode == 1
    assert "still referenced by 2 deliveries" in refused.stderr


async def test_import_attachments_module_declares_each_row_s_parts(
        launcher: Launcher, sqlite_url: str) -> None:
    """``--attachments MODULE`` imports the application's module (from the working
    directory) before the rows are rendered: each delivery carries its own PDF."""
    await _prepare(sqlite_url, "Receipt", "Hi {{ name }}")
    (launcher.workdir / "shop_receipts.py").write_text(
        "from postlane.templates import declare_attachments, rendered\n"
        "declare_attachments('welcome', rendered(\n"
        "    'receipt-{{ user_id }}.pdf',\n"
        "    lambda v: ('%PDF-1.4 ' + v['name']).encode(), 'application/pdf'))\n")
    path = _write_users(launcher.workdir / "users.csv", 3)
    done = launcher.cli(sqlite_url, "import", str(path), "--template", "welcome",
                        "--import-id", "imp-pdf", "--attachments", "shop_receipts")
    assert done.returncode == 0, done.stdout + done.stderr
    async with open_store(sqlite_url) as store:
        found = await store.find_deliveries(import_id="imp-pdf")
        parts = await store.attachments_among([d.id for d in found])
    assert sorted((p.filename, p.content) for d in found for p in parts[d.id]) == [
        (f"receipt-u{i}.pdf", f"%PDF-1.4 User {i}".encode()) for i in range(3)]
    missing = launcher.cli(sqlite_url, "import", str(path), "--template", "welcome",
                           "--import-id", "imp-x", "--attachments", "no_such_module")
    assert missing.returncode != 0
    assert "cannot import 'no_such_module'" in missing.stdout + missing.stderr
