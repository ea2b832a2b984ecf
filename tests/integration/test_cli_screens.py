"""What the on-call operator reads, at the 80 columns of a laptop terminal: nothing cut to
``welcom…``, no Python lists, a dead letter readable without JSON, suppressed addresses that
can be told apart without being shown, and an import that stopped on its file named as failed.
"""

from __future__ import annotations

import asyncio
import json
import re
from datetime import timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from postlane import Message, State, open_store
from postlane.cli.main import app
from postlane.store.base import Claim, Transition
from postlane.templates import add_template

runner = CliRunner()
KEYS = [f"welcome:user-{1000 + i}:import-2026-11-30" for i in range(3)]
REASONS = ["permanent", "permanent", "budget_exhausted"]
RESPONSE = "550 5.1.1 <ada.lovelace@example.com>: Recipient address rejected: User unknown"
SUPPRESSED = ["alice.smith@example.com", "alice.smyth@example.com", "bob@example.org"]


async def prepare(url: str) -> None:
    async with open_store(url) as store:
        await store.migrate()
        for i, key in enumerate(KEYS):
            await store.enqueue(Message(key=key, to=f"ada.lovelace{i}@example.com", text="t"))
        claimed = await store.claim_batch("interactive", 3, "w", timedelta(seconds=30))
        await store.start_attempts("w", [Claim(d.id, d.claims) for d in claimed])
        await store.set_state_if_sending_many("w", [
            Transition(d.id, d.claims, State.DEAD, "dead_lettered", error=RESPONSE,
                       dead_reason=REASONS[d.id - 1],
                       detail={"outcome": "permanent", "response": RESPONSE})
            for d in claimed])
        for address in SUPPRESSED:
            await store.suppress(address, "*", "hard_bounce")
        await add_template(store, "welcome", subject="Hi {{ name }}", text="Hello")


@pytest.fixture
def db(sqlite_url: str) -> str:
    asyncio.run(prepare(sqlite_url))
    return sqlite_url


def cli(db: str, *args: str, code: int = 0) -> str:
    result = runner.invoke(app, ["--db", db, *args], env={"COLUMNS": "80"})
    assert result.exit_code == code, result.output
    return result.output


def assert_fits(output: str) -> None:
    assert "…" not in output
    assert max(len(line) for line in output.splitlines()) <= 80
    assert not [line for line in output.splitlines() if len(line) == 80 and line[-1] != " "], \
        "a table ran into the edge: its last column was cut"


def test_dead_letters_at_80_columns_show_whole_keys_reasons_and_times(db: str) -> None:
    out = cli(db, "dlq", "list")
    assert_fits(out)
    for key, reason in zip(KEYS, REASONS, strict=True):
        assert key in out and reason in out
    assert re.search(r"\d{4}-\d{2}-\d{2}\s+.*\n.*\d{2}:\d{2}:\d{2}", out)  # date, then time
    assert "ada.lovelace" not in out and "a***@example.com" in out
    assert "by reason: budget_exhausted=1  permanent=2" in out


def test_a_dead_letter_reads_as_text_and_still_as_json(db: str) -> None:
    out = cli(db, "dlq", "show", "3")
    assert_fits(out)
    for expected in ("budget_exhausted", KEYS[2], "last response", "Recipient address rejected",
                     "attempt history (1)", "a***@example.com"):
        assert expected in out
    assert "ada.lovelace" not in out and not out.lstrip().startswith("{")
    data = json.loads(cli(db, "dlq", "show", "3", "--json"))
    assert data["key"] == KEYS[2] and data["snapshot"]["recipient"] == "ada.lovelace2@example.com"


def test_suppressed_addresses_stay_masked_but_distinct(db: str) -> None:
    out = cli(db, "suppress", "list")
    assert_fits(out)
    masks = re.findall(r"\S+@\S+ #[0-9a-f]{6}", out)
    assert len(masks) == 3 and len(set(masks)) == 3
    assert not [a for a in SUPPRESSED if a in out]
    one = cli(db, "suppress", "list", "--address", "alice.smyth@example.com")
    assert "alice.smyth@example.com" in one
    lifted = cli(db, "suppress", "remove", "alice.smyth@example.com", "--replay")
    assert "lifted 1 suppression(s); requeued deliveries: none" in lifted


def test_status_speaks_in_words_not_python_lists(db: str) -> None:
    cli(db, "pause", "bulk")
    out = cli(db, "status")
    assert_fits(out)
    assert "paused: lanes bulk; imports none" in out
    assert "[" not in out and "'" not in out


def test_an_import_that_failed_its_header_check_is_listed_as_failed(db: str,
                                                                   tmp_path: Path) -> None:
    bad = tmp_path / "users.csv"
    bad.write_text("user_id,mail,name\n1,a@example.com,A\n", encoding="utf-8")
    out = cli(db, "import", str(bad), "--template", "welcome", "--import-id", "nov", code=1)
    assert "email" in out
    listed = cli(db, "imports", "list")
    assert_fits(listed)
    assert "nov" in listed and "failed:" in listed and "email" in listed
    shown = cli(db, "imports", "show", "nov")
    assert "FAILED" in shown and "not finished" not in shown
    as_json = json.loads(cli(db, "imports", "show", "nov", "--json"))
    assert "email" in as_json["failed"]
    assert json.loads(cli(db, "imports", "list", "--json"))[0]["failed"] == as_json["failed"]

    bad.write_text("user_id,email,name\n1,a@example.com,A\n", encoding="utf-8")
    cli(db, "import", str(bad), "--template", "welcome", "--import-id", "nov")
    again = cli(db, "imports", "list")
    assert "failed" not in again and "finished" in again
    assert json.loads(cli(db, "imports", "show", "nov", "--json"))["failed"] is None


def test_templates_list_keeps_whole_names_at_80_columns(db: str) -> None:
    cli(db, "templates", "add", "password-reset-for-enterprise-customers",
        "--subject", "Reset your password for {{ product }} within fifteen minutes",
        "--text", "Follow the link.")
    out = cli(db, "templates", "list")
    assert_fits(out)
    assert "password-reset-for-enterprise-customers" in out
    assert re.search(r"\b\d{4}-\d{2}-\d{2}\b", out) and "within" in out
