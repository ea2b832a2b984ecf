"""`postlane cancel` and `postlane resolve` on a real SQLite file, through the CLI."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

from typer.testing import CliRunner

from postlane import Message, State, open_store
from postlane.cli.main import app
from postlane.store.base import Claim, Transition

runner = CliRunner()


async def prepare(url: str) -> None:
    async with open_store(url) as store:
        await store.migrate()
        for key in ("a", "b", "c", "d"):
            await store.enqueue(Message(key=key, to=f"{key}@example.com", text="t"))
        claimed = await store.claim_batch("interactive", 3, "w", timedelta(seconds=30))
        await store.start_attempts("w", [Claim(d.id, d.claims) for d in claimed])
        await store.set_state_if_sending_many("w", [
            Transition(d.id, d.claims, State.AMBIGUOUS, "ambiguous",
                       detail={"outcome": "ambiguous"}) for d in claimed])


async def states(url: str) -> dict[str, tuple[str, str | None]]:
    async with open_store(url) as store:
        found = {}
        for key in ("a", "b", "c", "d"):
            d = await store.get(key)
            assert d is not None
            found[key] = (str(d.state), d.dead_reason)
        return found


def cli(url: str, *args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["--db", url, *args])
    return result.exit_code, result.output


def test_resolve_and_cancel(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ops.db'}"
    asyncio.run(prepare(url))
    assert cli(url, "resolve", "1", "--as", "sent", "--provider-message-id", "p-1")[0] == 0
    assert cli(url, "resolve", "2", "--as", "resend")[0] == 0
    assert cli(url, "resolve", "3", "--as", "dead", "--note", "checked: not sent")[0] == 0
    code, out = cli(url, "resolve", "1", "--as", "dead")
    assert code == 1 and "not ambiguous" in out
    assert cli(url, "cancel", "4", "--reason", "user deleted")[0] == 0
    code, out = cli(url, "cancel", "1")
    assert code == 1 and "nothing cancelled" in out
    assert asyncio.run(states(url)) == {
        "a": ("sent", None), "b": ("pending", None),
        "c": ("dead", "ambiguous_unresolved"), "d": ("cancelled", None),
    }
    code, out = cli(url, "dlq", "list", "--json")
    assert code == 0 and '"reason": "ambiguous_unresolved"' in out


async def fill(url: str) -> None:
    """Six queued deliveries, three of import "weekly", and two ambiguous ones."""
    async with open_store(url) as store:
        await store.migrate()
        for i in range(6):
            await store.enqueue(Message(key=f"q{i}", to=f"q{i}@example.com", text="t",
                                        lane="bulk", import_id="weekly" if i < 3 else None))
        for i in range(2):
            await store.enqueue(Message(key=f"x{i}", to=f"x{i}@example.com", text="t"))
        claimed = await store.claim_batch("interactive", 2, "w", timedelta(seconds=30))
        await store.start_attempts("w", [Claim(d.id, d.claims) for d in claimed])
        await store.set_state_if_sending_many("w", [
            Transition(d.id, d.claims, State.AMBIGUOUS, "ambiguous",
                       detail={"outcome": "ambiguous"}) for d in claimed])


async def by_key(url: str) -> dict[str, str]:
    async with open_store(url) as store:
        found = {}
        for key in [f"q{i}" for i in range(6)] + ["x0", "x1"]:
            d = await store.get(key)
            assert d is not None
            found[key] = str(d.state)
        return found


def test_cancel_a_selection_previewed_then_confirmed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'bulk.db'}"
    asyncio.run(fill(url))
    code, out = cli(url, "cancel", "--import", "weekly", "--dry-run")
    assert code == 0
    assert "3 deliveries match (state=queued, import_id=weekly)" in out
    assert "--expected 3 --upto-id 3" in out
    code, out = cli(url, "cancel", "--import", "weekly")  # unconfirmed: a preview, no more
    assert code == 1 and "--expected 3 --upto-id 3" in out and "nothing done" in out
    assert set(asyncio.run(by_key(url)).values()) == {"pending", "ambiguous"}
    code, out = cli(url, "cancel", "--import", "weekly", "--expected", "2", "--upto-id", "3")
    assert code == 1 and "more than the 2 confirmed" in out  # the count it confirmed is stale
    code, out = cli(url, "cancel", "--import", "weekly", "--reason", "wrong week",
                    "--expected", "3", "--upto-id", "3")
    assert code == 0 and "3 of 3 deliveries cancelled" in out
    assert asyncio.run(by_key(url)) == {
        "q0": "cancelled", "q1": "cancelled", "q2": "cancelled", "q3": "pending",
        "q4": "pending", "q5": "pending", "x0": "ambiguous", "x1": "ambiguous"}


def test_cancel_touches_nothing_above_the_confirmed_bound(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'bulk.db'}"
    asyncio.run(fill(url))
    code, out = cli(url, "cancel", "--lane", "bulk", "--expected", "6", "--upto-id", "4")
    assert code == 0 and "4 of 4 deliveries cancelled" in out
    assert [k for k, v in asyncio.run(by_key(url)).items() if v == "cancelled"] == [
        "q0", "q1", "q2", "q3"]


def test_resolve_a_selection_alike(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'bulk.db'}"
    asyncio.run(fill(url))
    code, out = cli(url, "resolve", "--as", "dead", "--lane", "interactive", "--dry-run")
    assert code == 0 and "2 deliveries match (state=ambiguous, lane=interactive)" in out
    code, out = cli(url, "resolve", "--as", "dead", "--lane", "interactive", "--note",
                    "never arrived", "--expected", "2", "--upto-id", "8")
    assert code == 0 and "2 of 2 deliveries resolved as dead" in out
    assert asyncio.run(by_key(url))["x0"] == asyncio.run(by_key(url))["x1"] == "dead"


def test_bulk_forms_refuse_what_would_select_too_much_or_too_little(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'bulk.db'}"
    asyncio.run(fill(url))
    code, out = cli(url, "cancel")  # a bare command selects nothing, not everything
    assert code != 0 and "give a delivery id, or a selection" in out
    code, out = cli(url, "cancel", "1", "--lane", "bulk")
    assert code != 0 and "not both" in out
    code, out = cli(url, "cancel", "--state", "ambiguous", "--lane", "bulk")
    assert code == 1 and "cancel applies to deliveries in state queued" in out
    code, out = cli(url, "cancel", "--state", "sideways")
    assert code != 0 and "unknown state 'sideways'" in out
    code, out = cli(url, "resolve", "--as", "sent", "--lane", "interactive",
                    "--provider-message-id", "p-1")
    assert code != 0 and "not to a selection" in out
    assert set(asyncio.run(by_key(url)).values()) == {"pending", "ambiguous"}


def test_dlq_replay_dry_run_of_one_entry_refuses_as_the_replay_would(tmp_path: Path) -> None:
    """`dlq replay ID --dry-run` runs every check of the replay and changes nothing."""
    url = f"sqlite:///{tmp_path / 'ops.db'}"
    asyncio.run(prepare(url))
    assert cli(url, "resolve", "3", "--as", "dead", "--note", "checked: not sent")[0] == 0
    code, out = cli(url, "dlq", "replay", "3", "--dry-run")
    assert code == 0 and "would replay delivery 3" in out
    code, out = cli(url, "dlq", "replay", "2", "--dry-run")  # ambiguous, no dead letter
    assert code == 1 and "no dead letter for delivery 2" in out
    assert cli(url, "dlq", "discard", "3", "--reason", "not needed")[0] == 0
    code, out = cli(url, "dlq", "replay", "3", "--dry-run")
    assert code == 1 and "was discarded" in out
    assert asyncio.run(states(url))["c"] == ("dead", "ambiguous_unresolved")


def test_enqueue_an_sms_and_an_email_with_its_fallback(tmp_path: Path) -> None:
    import json

    url = f"sqlite:///{tmp_path / 'sms.db'}"
    assert cli(url, "migrate")[0] == 0
    code, out = cli(url, "enqueue", "--to", "+14155550100", "--key", "otp:1", "--channel",
                    "sms", "--text", "Код 1", "--json")
    assert code == 0 and json.loads(out)["channel"] == "sms"
    code, _ = cli(url, "enqueue", "--to", "a@example.com", "--key", "reset:1", "--text", "hi",
                  "--sms-fallback-to", "+14155550100", "--sms-fallback-text", "code 1")
    assert code == 0
    code, out = cli(url, "enqueue", "--to", "a@example.com", "--key", "reset:2", "--text",
                    "hi", "--sms-fallback-to", "+14155550100")
    assert code != 0 and "--sms-fallback-text" in out

    async def read() -> tuple[dict[str, object], dict[str, object]]:
        async with open_store(url) as store:
            sms, email = await store.get("otp:1"), await store.get("reset:1")
            assert sms is not None and email is not None
            return sms.metadata, email.metadata
    sms_meta, email_meta = asyncio.run(read())
    assert sms_meta["sms"] == {"encoding": "UCS-2", "segments": 1, "units": 5}
    assert email_meta["sms_fallback"] == {"to": "+14155550100", "text": "code 1"}
    code, out = cli(url, "status")
    assert code == 0 and "pending by channel: email=1  sms=1" in out
