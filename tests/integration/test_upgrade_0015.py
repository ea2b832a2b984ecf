"""Upgrading across migration 0015 (a claim told by the row that ends it).

At 0014 a claim wrote its own ``claimed`` row. Claims held while the deployment upgrades
must read back and end the same way after it: one ``claimed`` entry each, never two (the
old row and one told by the outcome), whether the worker reports the outcome or the lease
expires and is rescued; and a claim made after the upgrade is told by its outcome.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from conftest import SideDB, msg
from test_upgrade_0007 import migrate_up_to, postlane_migrate

from postlane import State, open_store
from postlane.core.records import Transition
from postlane.store import migrations


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest) -> str:
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    return str(request.getfixturevalue("fresh_pg_url"))


def claim_as_0014_did(side: SideDB, delivery_id: int, owner: str, lease_s: float) -> None:
    """What a 0014 worker's claim wrote: the lease on the narrow row, a ``claimed`` row."""
    data = f'{{"owner": "{owner}", "claim": 1}}'
    if side.engine == "sqlite":
        now = "(julianday('now') - 2440587.5) * 86400.0"
        side.query(f"UPDATE postlane_deliveries SET state = 'sending', lease_owner = ?, "
                   f"claims = 1, lease_expires_at = {now} + ?, updated_at = {now} "
                   "WHERE id = ?", (owner, lease_s, delivery_id))
        side.query(f"INSERT INTO postlane_events (delivery_id, at, kind, state, data) "
                   f"VALUES (?, {now}, 'claimed', 'sending', ?)", (delivery_id, data))
    else:
        side.query("UPDATE postlane_deliveries SET state = 'sending', lease_owner = ?, "
                   "claims = 1, lease_expires_at = now() + make_interval(secs => ?::float8), "
                   "updated_at = now() WHERE id = ?", (owner, lease_s, delivery_id))
        side.query("INSERT INTO postlane_events (delivery_id, kind, state, data) "
                   "VALUES (?, 'claimed', 'sending', ?::jsonb)", (delivery_id, data))


def test_claims_held_across_the_upgrade_are_told_once(url: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    assert max(m.version for m in migrations.load("sqlite")) >= 15
    migrate_up_to(url, 14, monkeypatch)

    async def enqueue() -> dict[str, int]:
        async with open_store(url) as store:
            return {key: (await store.enqueue(msg(key))).id
                    for key in ("acked", "rescued", "after")}
    ids = asyncio.run(enqueue())
    with SideDB(url) as side:
        claim_as_0014_did(side, ids["acked"], "w-old", 300.0)
        claim_as_0014_did(side, ids["rescued"], "w-gone", -60.0)  # its lease ran out

    assert "0015_claims_told_by_outcomes" in postlane_migrate(url)

    async def after() -> None:
        async with open_store(url) as store:
            kinds = [e.kind for e in await store.timeline(ids["acked"])]
            assert kinds == ["enqueued", "claimed"]
            # The old worker reports its outcome after the upgrade.
            applied = await store.set_state_if_sending_many("w-old", [Transition(
                ids["acked"], 1, State.SENT, "sent", provider_message_id="pm-1",
                detail={"outcome": "accepted", "attempt": 1})])
            assert applied == {ids["acked"]}
            timeline = await store.timeline(ids["acked"])
            assert [e.kind for e in timeline] == ["enqueued", "claimed", "sent"]
            assert timeline[1].data == {"owner": "w-old", "claim": 1}

            rescued = await store.rescue_expired_leases()
            assert rescued.requeued == [ids["rescued"]]
            kinds = [e.kind for e in await store.timeline(ids["rescued"])]
            assert kinds == ["enqueued", "claimed", "lease_expired"]

            # A claim after the upgrade writes no row; its outcome tells it.
            (claimed,) = [d for d in await store.claim_batch(
                "interactive", 10, "w-new", timedelta(seconds=60)) if d.id == ids["after"]]
            held = await store.timeline(ids["after"])
            assert [e.kind for e in held] == ["enqueued", "claimed"]
            assert held[1].data == {"owner": "w-new", "claim": 1}
            await store.set_state_if_sending_many("w-new", [Transition(
                claimed.id, claimed.claims, State.SENT, "sent", provider_message_id="pm-2",
                detail={"outcome": "accepted", "attempt": 1})])
            done = await store.timeline(ids["after"])
            assert [e.kind for e in done] == ["enqueued", "claimed", "sent"]
            assert done[1].at == held[1].at <= done[2].at

    asyncio.run(after())
    with SideDB(url) as side:
        # Stored: the old claims' own rows, and one row for the new claim and its outcome.
        assert side.count("postlane_events", "kind = 'claimed'") == 2
        assert side.query("SELECT kind FROM postlane_events WHERE delivery_id = ?",
                          (ids["after"],)) == [("sent",)]  # its enqueue wrote no row
