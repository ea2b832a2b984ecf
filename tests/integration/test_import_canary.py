"""Imports that start small, on both engines: ``import_csv(..., canary=N)`` sends the first
N deliveries and holds the rest until they are sent; a canary delivery that dead-letters
pauses the import with the reason; ``resume`` after that releases the rest."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from conftest import SideDB
from test_imports import users, write_csv
from worker_helpers import Provider, all_terminal, fast_config, running, wait_until

from postlane.core.outcomes import Outcome
from postlane.errors import ImportRejected
from postlane.imports import import_csv, import_status, resume
from postlane.store import Store
from postlane.templates import add_template
from postlane.worker import Worker
from postlane.worker.controls import IMPORT_PAUSE

IMPORT = "imp-canary"


@pytest.fixture
async def tstore(store: Store) -> AsyncIterator[Store]:
    await add_template(store, "welcome", subject="Welcome, {{ name }}",
                       text="Hello {{ name }} (user {{ user_id }})")
    yield store


def held(side: SideDB) -> int:
    """Deliveries of the import not due for years: held behind the canary."""
    return len([r for r in side.query(
        "SELECT run_at FROM postlane_deliveries WHERE import_id = ? AND state = 'pending'",
        (IMPORT,)) if _years_ahead(side, r[0])])


def _years_ahead(side: SideDB, run_at: object) -> bool:
    now = side.now()
    if side.engine == "sqlite":
        return float(run_at) > now.timestamp() + 86400 * 365  # type: ignore[arg-type]
    return (run_at - now).days > 365  # type: ignore[operator]


async def test_the_rest_waits_for_the_canary_then_goes(
        tstore: Store, side: SideDB, tmp_path: Path) -> None:
    path = write_csv(tmp_path / "users.csv", users(30))
    report = await import_csv(tstore, path, template="welcome", import_id=IMPORT,
                              batch_size=4, canary=5)
    assert report.rows_created == 30
    assert held(side) == 25
    status = await import_status(tstore, IMPORT)
    assert status is not None and status.canary is not None
    assert status.canary.state == "waiting" and status.canary.size == 5
    assert status.canary.keys == tuple(f"welcome:{i}:{IMPORT}" for i in range(1, 6))
    assert status.canary.held == 25
    provider = Provider()
    # The canary goes first: nothing else is claimed until it is sent.
    order: list[str] = []
    provider.script(lambda d: order.append(d.key) or None)  # type: ignore[func-returns-value]
    async with running(Worker(tstore, provider, config=fast_config())):
        await all_terminal(tstore, timeout=20)
    assert sorted(order[:5]) == sorted(status.canary.keys)
    assert len(order) == 30
    after = await import_status(tstore, IMPORT)
    assert after is not None and after.canary is not None
    assert (after.canary.state, after.canary.held) == ("passed", 0)
    assert after.canary.reason == "canary passed: 5 of 5 sent"
    assert after.as_json()["canary"]["deliveries"] == {"sent": 5}
    assert side.count("postlane_events", "kind = 'released'") == 25


async def test_a_dead_canary_pauses_the_import_with_the_reason(
        tstore: Store, side: SideDB, tmp_path: Path) -> None:
    path = write_csv(tmp_path / "users.csv", users(12))
    await import_csv(tstore, path, template="welcome", import_id=IMPORT, canary=3)
    provider = Provider()
    provider.script_key(f"welcome:2:{IMPORT}", Outcome.permanent("550 5.1.1 no such user"))
    async with running(Worker(tstore, provider, config=fast_config())):
        async def paused() -> bool:
            return IMPORT_PAUSE + IMPORT in await tstore.get_controls()
        await wait_until(paused, what="the import paused by its canary")
    status = await import_status(tstore, IMPORT)
    assert status is not None and status.paused and status.canary is not None
    assert status.canary.state == "failed"
    assert status.canary.reason is not None
    assert f"welcome:2:{IMPORT} dead (permanent): 550 5.1.1 no such user" in status.canary.reason
    assert status.paused_because == status.canary.reason
    assert status.canary.held == 9 and held(side) == 9
    assert len(provider.requests) == 3  # none of the rest left
    # The operator fixed the cause: resume lets the rest go.
    assert await resume(tstore, IMPORT) == 9
    async with running(Worker(tstore, provider, config=fast_config())):
        await all_terminal(tstore, timeout=20)
    assert side.count("postlane_deliveries", "import_id = ? AND state = 'sent'", (IMPORT,)) == 11
    final = await import_status(tstore, IMPORT)
    assert final is not None and final.canary is not None and final.canary.state == "released"


async def test_a_rerun_keeps_the_first_runs_canary_and_holds_new_rows(
        tstore: Store, side: SideDB, tmp_path: Path) -> None:
    path = write_csv(tmp_path / "users.csv", users(6))
    await import_csv(tstore, path, template="welcome", import_id=IMPORT, canary=2)
    bigger = write_csv(tmp_path / "more.csv", users(10))
    await import_csv(tstore, bigger, template="welcome", import_id=IMPORT)  # no --canary
    canary = await tstore.get_import_canary(IMPORT)
    assert canary is not None and canary.keys == (f"welcome:1:{IMPORT}", f"welcome:2:{IMPORT}")
    assert held(side) == 8


async def test_a_canary_of_zero_is_refused(tstore: Store, tmp_path: Path) -> None:
    path = write_csv(tmp_path / "users.csv", users(3))
    with pytest.raises(ImportRejected, match="canary"):
        await import_csv(tstore, path, template="welcome", import_id=IMPORT, canary=0)
    assert await tstore.get_import(IMPORT) is None


async def test_without_a_canary_nothing_is_held(
        tstore: Store, side: SideDB, tmp_path: Path) -> None:
    path = write_csv(tmp_path / "users.csv", users(5))
    await import_csv(tstore, path, template="welcome", import_id=IMPORT)
    assert held(side) == 0 and await tstore.get_import_canary(IMPORT) is None
    assert (await import_status(tstore, IMPORT)).canary is None  # type: ignore[union-attr]
