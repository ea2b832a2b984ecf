"""Reserved capacity, not strict priority: a password reset does not queue behind an import.

One worker drains a bulk backlog at the ceiling; interactive messages arrive one every half
second. Each must be sent within about a second of its enqueue (database clock), while the
bulk lane keeps at least its share of the ceiling. Then SIGTERM: in-flight sends finish,
nothing is left leased, and the process exits 0 within its grace period.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psycopg
import pytest
from conftest import SideDB

from postlane import enqueue
from postlane.providers.testing import read_record_file

from .conftest import (
    FIGURES,
    Launcher,
    email,
    enqueue_all,
    max_in_window,
    record_rows,
    record_url,
    wait_until,
)

# Sends per second measured on the wall clock: scripts/check runs these with the machine to
# itself, after the parallel part (a neighbour's CPU burst would bunch the sends).
pytestmark = pytest.mark.alone

CEILING = 200
BULK = 6000
BULK_SHARE = 0.30
INTERACTIVE = 16
CADENCE_S = 0.5
GRACE_S = 5.0


@pytest.mark.slow
def test_interactive_is_not_stuck_behind_bulk(
    fresh_pg_url: str, launcher: Launcher, tmp_path: Path
) -> None:
    db = fresh_pg_url
    launcher.cli_ok(db, "migrate")
    enqueue_all(db, [email(f"welcome:{i}:import-9", lane="bulk", import_id="import-9")
                     for i in range(BULK)])
    record = tmp_path / "sends.db"
    worker = launcher.worker(db, record_url(record), "--rate", f"{CEILING}/s",
                             "--grace", f"{GRACE_S:g}s")
    wait_until(lambda: read_record_file(str(record)).sends >= CEILING, 30,
               "the bulk lane to be draining", interval=0.1, watch=[worker])

    keys = [f"reset:token-{i}" for i in range(INTERACTIVE)]
    with psycopg.connect(db) as conn:
        start = time.monotonic()
        for i, key in enumerate(keys):
            delay = start + i * CADENCE_S - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            enqueue(conn, email(key, subject="Reset your password"))
            conn.commit()
            assert worker.popen.poll() is None, worker.log_tail()

    with SideDB(db) as side:
        wait_until(lambda: side.count("postlane_deliveries",
                                      "lane = 'interactive' AND state = 'sent'") == INTERACTIVE,
                   10, "every interactive message to be sent", watch=[worker])
        stopped_at = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(GRACE_S + 10)
        stop_s = time.monotonic() - stopped_at
        assert code == 0, worker.log_tail()
        assert stop_s <= GRACE_S + 1.0, f"took {stop_s:.1f}s to stop (grace {GRACE_S:g}s)"

        states = dict(side.query("SELECT state, count(*) FROM postlane_deliveries "
                                 "GROUP BY state"))
        assert states.get("sending", 0) == 0, f"left leased after SIGTERM: {states}"
        assert set(states) <= {"sent", "pending"}, states
        assert states["sent"] + states.get("pending", 0) == BULK + INTERACTIVE
        leased = side.count("postlane_deliveries", "lease_owner IS NOT NULL")
        assert leased == 0
        timing = {key: (created, sent) for key, created, sent in side.query(
            "SELECT idempotency_key, EXTRACT(EPOCH FROM created_at)::float8, "
            "EXTRACT(EPOCH FROM sent_at)::float8 FROM postlane_delivery_rows "
            "WHERE lane = 'interactive'")}

    stats = read_record_file(str(record))
    assert stats.duplicates == 0 and stats.duplicates_suppressed == 0
    assert stats.accepted == states["sent"], "every accepted send was acknowledged as sent"

    latencies = {key: sent - created for key, (created, sent) in timing.items()}
    worst = max(latencies.values())
    rows = record_rows(record)
    bulk_times = sorted(r.at for r in rows if r.key.startswith("welcome:"))
    at_provider = {r.key: r.at for r in rows if r.key.startswith("reset:")}
    assert set(at_provider) == set(keys)
    for key in keys:
        created, _ = timing[key]
        ahead = BULK - sum(1 for t in bulk_times if t < created)
        overtaken = sum(1 for t in bulk_times if created <= t < at_provider[key])
        # It did not wait for the backlog ahead of it: only the sends within its latency.
        assert ahead >= 1000, f"{key}: only {ahead} bulk messages were still queued"
        assert overtaken <= 2 * CEILING, f"{key} waited behind {overtaken} bulk sends"

    window_start = min(created for created, _ in timing.values())
    window_end = max(at_provider.values())
    bulk_in_window = sum(1 for t in bulk_times if window_start <= t <= window_end)
    bulk_rate = bulk_in_window / (window_end - window_start)
    busiest = max_in_window(stats.send_times)
    FIGURES[f"interactive under a {BULK} bulk backlog at {CEILING}/s"] = (
        f"max latency {worst:.3f}s, mean {sum(latencies.values()) / len(latencies):.3f}s "
        f"over {INTERACTIVE} messages; bulk {bulk_rate:.0f}/s meanwhile; busiest 1 s window "
        f"{busiest}; stopped in {stop_s:.2f}s"
    )
    assert worst <= 2.0, f"an interactive message waited {worst:.2f}s: {latencies}"
    assert bulk_rate >= BULK_SHARE * CEILING, f"bulk lane sent only {bulk_rate:.0f}/s"
    assert busiest <= CEILING
