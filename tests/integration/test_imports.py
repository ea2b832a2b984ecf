"""Bulk import on both engines: idempotent re-runs, strict and lenient validation with line
numbers, the run record, the operator's counts, and pausing one import among others."""

from __future__ import annotations

import csv
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from pathlib import Path

import pytest
from conftest import SideDB, msg
from worker_helpers import Provider, fast_config, running, wait_until

from postlane import State
from postlane.core.outcomes import Outcome
from postlane.errors import ImportRejected, TemplateDeprecated, UnknownTemplate
from postlane.imports import import_csv, import_status, pause, resume
from postlane.store import Store, Transition
from postlane.templates import add_template, deprecate_template
from postlane.worker import Worker


@pytest.fixture
async def tstore(store: Store) -> AsyncIterator[Store]:
    """The ``store`` fixture with a ``welcome`` template."""
    await add_template(store, "welcome", subject="Welcome, {{ name }}",
                       text="Hello {{ name }} (user {{ user_id }})")
    yield store


def write_csv(path: Path, rows: Sequence[Sequence[str]],
              header: Sequence[str] = ("user_id", "email", "name")) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def users(n: int, start: int = 1) -> list[list[str]]:
    return [[str(i), f"user{i}@example.com", f"User {i}"] for i in range(start, start + n)]


async def test_the_same_file_twice_is_one_delivery_per_user(
    tstore: Store, side: SideDB, tmp_path: Path
) -> None:
    path = write_csv(tmp_path / "users.csv", users(25))
    first = await import_csv(tstore, path, template="welcome", import_id="imp-1", batch_size=10)
    assert (first.rows_read, first.rows_enqueued, first.rows_created, first.rows_skipped) == (
        25, 25, 25, 0)
    second = await import_csv(tstore, path, template="welcome", import_id="imp-1",
                              batch_size=7)
    assert (second.rows_read, second.rows_enqueued, second.rows_created) == (25, 25, 0)
    assert side.count("postlane_deliveries") == 25
    assert side.count("postlane_deliveries", "import_id = ? AND lane = 'bulk'", ("imp-1",)) == 25
    d = await tstore.get("welcome:7:imp-1")
    assert d is not None
    assert (d.recipient, d.subject, d.text) == ("user7@example.com", "Welcome, User 7",
                                                "Hello User 7 (user 7)")
    assert (d.template_id, d.template_version, d.import_id) == ("welcome", 1, "imp-1")
    record = await tstore.get_import("imp-1")
    assert record is not None
    assert (record.runs, record.template, record.file_name, record.lane) == (
        2, "welcome", "users.csv", "bulk")
    assert (record.rows_read, record.rows_enqueued, record.rows_created,
            record.rows_skipped) == (25, 25, 0, 0)
    assert record.finished_at is not None and record.finished_at >= record.last_started_at
    # Another import id is another business event: its own deliveries.
    await import_csv(tstore, path, template="welcome", import_id="imp-2")
    assert side.count("postlane_deliveries") == 50
    assert [r.import_id for r in await tstore.list_imports()] == ["imp-2", "imp-1"]


async def test_a_resumed_import_creates_only_what_is_missing(
    tstore: Store, side: SideDB, tmp_path: Path
) -> None:
    """A crash half-way (here: the first half of the file imported alone) and a re-run."""
    half = write_csv(tmp_path / "half.csv", users(12))
    whole = write_csv(tmp_path / "whole.csv", users(30))
    await import_csv(tstore, half, template="welcome", import_id="imp-1")
    report = await import_csv(tstore, whole, template="welcome", import_id="imp-1",
                              batch_size=5)
    assert (report.rows_enqueued, report.rows_created) == (30, 18)
    assert side.count("postlane_deliveries") == 30
    record = await tstore.get_import("imp-1")
    assert record is not None and record.rows_created == 18 and record.runs == 2


async def test_strict_mode_writes_nothing_when_one_row_is_bad(
    tstore: Store, side: SideDB, tmp_path: Path
) -> None:
    rows = users(3000)
    rows[2500][1] = "not-an-address"
    path = write_csv(tmp_path / "users.csv", rows)
    with pytest.raises(ImportRejected, match="1 bad row") as caught:
        await import_csv(tstore, path, template="welcome", import_id="imp-1", strict=True)
    assert caught.value.problems == [
        (2502, "email: address has no local part and domain ('user@host')")]
    assert side.count("postlane_deliveries") == 0
    assert await tstore.get_import("imp-1") is None


async def test_lenient_mode_skips_bad_rows_and_reports_their_lines(
    tstore: Store, side: SideDB, tmp_path: Path
) -> None:
    path = tmp_path / "users.csv"
    path.write_text(
        "user_id,email,name,note\n"                # line 1
        "1,one@example.com,One,\n"                 # 2
        "2,bad@,Two,\n"                            # 3: bad address
        '3,three@example.com,Three,"two\nlines"\n'  # 4-5: a quoted newline, one row
        ",nobody@example.com,Nobody,\n"            # 6: no user id
        "\n"                                       # 7: blank, ignored
        "7,seven@example.com,Seven\n"              # 8: a field short
        '8,eight@example.com,"Ei\nght",\n'          # 9-10: renders a subject with LF
        "9,nine@example.com,Nine,\n",              # 11
        encoding="utf-8")
    report = await import_csv(tstore, path, template="welcome", import_id="imp-1")
    assert [(p.line, p.reason.split(":")[0]) for p in report.problems] == [
        (3, "email"), (6, "user_id is empty"), (8, "has 3 fields, the header has 4"),
        (9, "subject contains a line break (CR, LF, VT, FF, FS, GS, RS, NEL, U+2028, U+2029)")]
    assert (report.rows_read, report.rows_enqueued, report.rows_skipped) == (7, 3, 4)
    keys = {r[0] for r in side.query("SELECT idempotency_key FROM postlane_delivery_rows")}
    assert keys == {"welcome:1:imp-1", "welcome:3:imp-1", "welcome:9:imp-1"}
    record = await tstore.get_import("imp-1")
    assert record is not None and (record.rows_read, record.rows_skipped) == (7, 4)


async def test_file_level_problems_stop_the_import_before_anything_is_written(
    tstore: Store, side: SideDB, tmp_path: Path
) -> None:
    no_email = write_csv(tmp_path / "a.csv", [["1", "Ada"]], header=("user_id", "name"))
    with pytest.raises(ImportRejected, match=r"required column.*email"):
        await import_csv(tstore, no_email, template="welcome", import_id="i")
    no_name = write_csv(tmp_path / "b.csv", [["1", "a@example.com"]],
                        header=("user_id", "email"))
    with pytest.raises(ImportRejected, match="uses name, not column"):
        await import_csv(tstore, no_name, template="welcome", import_id="i")
    latin1 = tmp_path / "c.csv"
    latin1.write_bytes(b"user_id,email,name\n1,a@example.com,Jos\xe9\n")
    with pytest.raises(ImportRejected, match="line 2: not UTF-8"):
        await import_csv(tstore, latin1, template="welcome", import_id="i")
    good = write_csv(tmp_path / "d.csv", users(2))
    with pytest.raises(UnknownTemplate):
        await import_csv(tstore, good, template="nope", import_id="i")
    await add_template(tstore, "other", subject="x", text="y")
    await import_csv(tstore, good, template="other", import_id="i-other")
    with pytest.raises(ImportRejected, match="started with template 'other'"):
        await import_csv(tstore, good, template="welcome", import_id="i-other")
    await deprecate_template(tstore, "other")
    with pytest.raises(TemplateDeprecated):
        await import_csv(tstore, good, template="other", import_id="i-2")
    assert side.count("postlane_deliveries") == 2  # only the one good import


async def test_import_counts_answer_the_operators_questions(
    tstore: Store, side: SideDB, tmp_path: Path
) -> None:
    await import_csv(tstore, write_csv(tmp_path / "u.csv", users(6)), template="welcome",
                     import_id="imp-1")
    claimed = await tstore.claim_batch("bulk", 4, "w", timedelta(seconds=30))
    a, b, c, _ = claimed
    await tstore.set_state_if_sending_many("w", [
        Transition(a.id, a.claims, State.SENT, "sent"),
        Transition(b.id, b.claims, State.PENDING, "retry_scheduled", delay_s=600),
        Transition(c.id, c.claims, State.DEAD, "dead_lettered", dead_reason="permanent"),
    ])
    status = await import_status(tstore, "imp-1")
    assert status is not None and not status.paused
    data = status.as_json()["deliveries"]
    assert {k: data[k] for k in ("created", "claimed", "accepted", "waiting_retry", "queued",
                                 "dead")} == {
        "created": 6, "claimed": 1, "accepted": 1, "waiting_retry": 1, "queued": 2, "dead": 1}
    assert data["oldest_waiting_age_s"] >= 0
    side.query("UPDATE postlane_deliveries SET created_at = created_at - "
               + ("100" if side.engine == "sqlite" else "interval '100 seconds'")
               + " WHERE id = ?", (b.id,))
    status = await import_status(tstore, "imp-1")
    assert status is not None and status.counts.oldest_waiting_age_s >= 100
    assert status.as_json()["rows"] == {"read": 6, "enqueued": 6, "created": 6, "skipped": 0}
    assert await import_status(tstore, "nothing") is None


async def test_pausing_one_import_stops_its_claims_while_others_go_on(
    tstore: Store, side: SideDB, tmp_path: Path
) -> None:
    provider = Provider(latency_s=0.002)
    # The controls interval as in production (0.5 s): a pause reaches the worker within it.
    worker = Worker(tstore, provider, config=fast_config(controls_interval_s=0.5))
    async with running(worker):
        await pause(tstore, "imp-a")
        started = side.now()
        await wait_until(lambda: "imp-a" in worker.controls.paused_imports, timeout=1.0,
                         what="the pause to reach the worker within a second")
        assert (side.now() - started).total_seconds() < 1.0
        # A is enqueued first: a worker ignoring the pause would claim it before B.
        await import_csv(tstore, write_csv(tmp_path / "a.csv", users(40)),
                         template="welcome", import_id="imp-a")
        await import_csv(tstore, write_csv(tmp_path / "b.csv", users(40, start=100)),
                         template="welcome", import_id="imp-b")
        await tstore.enqueue(msg("reset:1"))
        await wait_until(lambda: side.count(
            "postlane_deliveries", "state = 'sent' AND (import_id = 'imp-b' OR lane = "
            "'interactive')") == 41, timeout=15, what="import B and the interactive lane")
        assert side.count("postlane_deliveries", "import_id = 'imp-a' AND claims = 0 "
                          "AND state = 'pending'") == 40
        assert not [k for k in provider.keys().elements() if k.endswith(":imp-a")]
        status = await import_status(tstore, "imp-a")
        assert status is not None and status.paused
        # Pausing mid-drain: claims of A stop, nothing is deleted.
        await resume(tstore, "imp-a")
        await wait_until(lambda: side.count("postlane_deliveries", "import_id = 'imp-a' "
                                            "AND state = 'sent'") >= 5, timeout=10,
                         what="import A to resume")
        await pause(tstore, "imp-a")
        await wait_until(lambda: "imp-a" in worker.controls.paused_imports, timeout=1.0,
                         what="the second pause to reach the worker")
        claimed_then = side.count("postlane_deliveries", "claimed_at IS NOT NULL AND "
                                  "import_id = 'imp-a'")
        await tstore.enqueue(msg("reset:2"))  # the rest of the fleet keeps going meanwhile
        await wait_until(lambda: side.count("postlane_delivery_rows", "idempotency_key = "
                                            "'reset:2' AND state = 'sent'"), timeout=10,
                         what="the interactive lane while A is paused")
        assert side.count("postlane_deliveries", "claimed_at IS NOT NULL AND "
                          "import_id = 'imp-a'") == claimed_then
        assert side.count("postlane_deliveries", "import_id = 'imp-a'") == 40
        await resume(tstore, "imp-a")
        await wait_until(lambda: side.count("postlane_deliveries", "import_id = 'imp-a' "
                                            "AND state = 'sent'") == 40, timeout=15,
                         what="import A to finish after the resume")
    assert provider.keys()["welcome:1:imp-a"] == 1


async def test_a_scripted_failure_shows_as_waiting_for_another_attempt(
    tstore: Store, side: SideDB, tmp_path: Path
) -> None:
    await import_csv(tstore, write_csv(tmp_path / "u.csv", users(3)), template="welcome",
                     import_id="imp-1")
    provider = Provider()
    provider.script_key("welcome:2:imp-1", Outcome.transient("503"))
    from postlane.core.policy import RetryPolicy

    config = fast_config(retry=RetryPolicy(base_s=3600, cap_s=3600))
    async with running(Worker(tstore, provider, config=config, rand=lambda: 1.0)):
        await wait_until(lambda: side.count("postlane_deliveries", "state = 'sent'") == 2,
                         what="the two good ones")
        async def retrying() -> bool:
            status = await import_status(tstore, "imp-1")
            return status is not None and status.counts.waiting_retry == 1
        await wait_until(retrying, what="the failed one to wait for another attempt")
