"""Crashes and zombies with real processes and real signals.

- ``kill -9`` after the provider accepted a message but before the worker could record it:
  the next worker finds the expired lease, knows the attempt had started (so the provider
  may have it), reconciles, and re-sends under the same key, which the provider suppresses.
- A stopped worker (SIGSTOP) loses its lease to another worker that finishes the delivery;
  when it wakes (SIGCONT) its late result is dropped and nothing moves backwards.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from conftest import SideDB

from postlane.providers.testing import read_record_file

from .conftest import (
    Launcher,
    email,
    enqueue_all,
    record_accepted,
    record_rows,
    record_url,
    wait_until,
)


def _db_url(engine: str, request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("fresh_pg_url" if engine == "postgres" else "sqlite_url"))


def _kinds(side: SideDB, delivery_id: int) -> list[str]:
    """The timeline's kinds from its rows: a row that ends a claim tells it (0015), and the
    timeline shows a "claimed" entry before it (store.machine.timeline)."""
    kinds: list[str] = []
    for kind, ends_a_claim in side.query(
            "SELECT kind, claimed_at IS NOT NULL FROM postlane_events WHERE delivery_id = ? "
            "ORDER BY id", (delivery_id,)):
        kinds += ["claimed", kind] if ends_a_claim else [kind]
    return kinds


def _is_subsequence(wanted: list[str], kinds: list[str]) -> bool:
    it = iter(kinds)
    return all(kind in it for kind in wanted)


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["postgres", "sqlite"])
def test_kill_9_after_accept_before_ack(
    engine: str, request: pytest.FixtureRequest, launcher: Launcher, tmp_path: Path
) -> None:
    db = _db_url(engine, request)
    launcher.cli_ok(db, "migrate")
    keys = [f"welcome:{i}:import-7" for i in range(20)]
    hung = keys[7]
    enqueue_all(db, [email(k, lane="bulk", import_id="import-7") for k in keys])
    record = tmp_path / "sends.db"

    with SideDB(db) as side:
        ids = dict(side.query("SELECT idempotency_key, id FROM postlane_delivery_rows"))
        hung_id = ids[hung]

        first = launcher.worker(
            db, record_url(record, hang_key=hung), "--lease", "2s",
            "--attempt-timeout", "120s", name="crashing-worker",
        )
        # The provider has accepted the hung key (its answer never comes) and every other
        # delivery is acknowledged, so exactly one delivery is between accept and ack.
        wait_until(lambda: hung in record_accepted(record), 30, "the hung key to be accepted",
                   watch=[first])
        wait_until(lambda: side.count("postlane_deliveries", "state = 'sent'") == len(keys) - 1,
                   30, "every other delivery to be acknowledged", watch=[first])
        state, owner, started = side.query(
            "SELECT state, lease_owner, attempt_started_at FROM postlane_deliveries "
            "WHERE id = ?", (hung_id,))[0]
        assert state == "sending"
        assert first.owner_marker in owner
        assert started is not None, "the attempt must be marked started before the request"

        first.send_signal(signal.SIGKILL)
        assert first.wait(10) == -signal.SIGKILL

        second = launcher.worker(db, record_url(record), "--lease", "2s", "--drain",
                                 name="recovering-worker")
        assert second.wait(45) == 0, second.log_tail()

        states = dict(side.query("SELECT state, count(*) FROM postlane_deliveries GROUP BY state"))
        assert states == {"sent": len(keys)}

        stats = read_record_file(str(record))
        assert stats.accepted == len(keys), "one accepted message per key"
        assert stats.duplicates == 0, "nothing reached a recipient twice"
        assert stats.duplicates_suppressed == 1, "only the hung key was re-sent"
        assert stats.keys[hung] == 2
        assert all(stats.keys[k] == 1 for k in keys if k != hung)
        hung_sends = [row for row in record_rows(record) if row.key == hung]
        assert [row.pid for row in hung_sends] == [first.pid, second.pid]
        assert {row.delivery_id for row in hung_sends} == {hung_id}

        kinds = _kinds(side, hung_id)
        assert _is_subsequence(["claimed", "lease_expired", "reconciled", "claimed", "sent"],
                               kinds), kinds
        assert kinds[-1] == "sent", kinds
        started_flag = side.scalar(
            "SELECT data FROM postlane_events WHERE delivery_id = ? AND kind = 'lease_expired'",
            (hung_id,))
        if isinstance(started_flag, str):  # SQLite keeps JSON as text
            import json

            started_flag = json.loads(started_flag)
        assert started_flag["attempt_started"] is True
        pmid = side.scalar("SELECT provider_message_id FROM postlane_deliveries WHERE id = ?",
                           (hung_id,))
        assert pmid == f"rf-{hung}", "the provider's original id, returned for the replay"
        others = side.scalar(
            "SELECT count(*) FROM postlane_events WHERE kind IN ('lease_expired', 'reconciled') "
            "AND delivery_id <> ?", (hung_id,))
        assert others == 0


@pytest.mark.slow
def test_zombie_worker_result_is_dropped(
    fresh_pg_url: str, launcher: Launcher, tmp_path: Path
) -> None:
    db = fresh_pg_url
    launcher.cli_ok(db, "migrate")
    keys = [f"reset:token-{i}" for i in range(3)]
    enqueue_all(db, [email(k) for k in keys])
    record = tmp_path / "sends.db"

    with SideDB(db) as side:
        ids = sorted(row[0] for row in side.query("SELECT id FROM postlane_deliveries"))
        zombie = launcher.worker(
            db, record_url(record, latency_ms=4000), "--lease", "2s",
            "--attempt-timeout", "60s", name="zombie",
        )

        def all_in_flight() -> bool:
            rows = side.query("SELECT state, lease_owner, attempt_started_at "
                              "FROM postlane_deliveries")
            return all(s == "sending" and o and zombie.owner_marker in o and a is not None
                       for s, o, a in rows)

        wait_until(all_in_flight, 30, "the zombie to hold every delivery mid-send",
                   interval=0.01, watch=[zombie])
        zombie.send_signal(signal.SIGSTOP)
        assert read_record_file(str(record)).sends == 0, "stopped before the provider answered"

        rescuer = launcher.worker(db, record_url(record), "--lease", "2s", "--drain",
                                  name="rescuer")
        assert rescuer.wait(45) == 0, rescuer.log_tail()

        def snapshot() -> list[tuple[object, ...]]:
            return side.query(
                "SELECT d.id, d.state, d.attempts, d.claims, d.sent_at, d.provider_message_id, "
                "d.lease_owner, (SELECT count(*) FROM postlane_events e "
                "WHERE e.delivery_id = d.id) FROM postlane_deliveries d ORDER BY d.id")

        before = snapshot()
        assert [row[1] for row in before] == ["sent"] * len(ids)
        assert read_record_file(str(record)).sends == len(keys)

        zombie.send_signal(signal.SIGCONT)
        # The zombie wakes, its provider call completes (the provider suppresses the repeat
        # key), and it reports "sent" for claims it no longer holds: every report must drop.
        deadline = time.monotonic() + 20
        while zombie.log().count("outcome sent dropped, the lease was taken over") < len(keys):
            assert snapshot() == before, "a late result moved a delivery"
            assert zombie.popen.poll() is None, zombie.log_tail()
            assert time.monotonic() < deadline, zombie.log_tail()
            time.sleep(0.02)
        time.sleep(1.0)  # anything else the zombie might still write
        assert snapshot() == before

        zombie.send_signal(signal.SIGTERM)
        assert zombie.wait(15) == 0, zombie.log_tail()
        assert snapshot() == before

        zombie_sends = [row for row in record_rows(record) if row.pid == zombie.pid]
        assert sorted(row.delivery_id for row in zombie_sends) == ids
        stats = read_record_file(str(record))
        assert stats.accepted == len(keys)
        assert stats.duplicates == 0
        assert stats.duplicates_suppressed == len(keys)
        assert all(stats.keys[k] == 2 for k in keys)
