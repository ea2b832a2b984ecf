"""The operator's command line, end to end on SQLite (the embedded default): each command is
a real ``postlane`` process, checked by exit status, output and what it wrote."""

from __future__ import annotations

import json
import socket

from conftest import SideDB

from postlane.store.migrations import load

from .conftest import Launcher


def test_cli_end_to_end_on_sqlite(sqlite_url: str, launcher: Launcher) -> None:
    db = sqlite_url
    labels = [m.label for m in load("sqlite")]

    # Nothing works on an unmigrated database, and the message says what to do.
    early = launcher.cli(db, "status", "--json")
    assert early.returncode == 1
    assert "run `postlane migrate`" in early.stderr

    # migrate: applies everything once, then is a no-op.
    assert launcher.cli_ok(db, "migrate").strip() == f"applied: {', '.join(labels)}"
    assert launcher.cli_ok(db, "migrate").strip() == "schema is up to date"
    with SideDB(db) as side:
        versions = [row[0] for row in side.query(
            "SELECT version FROM postlane_migrations ORDER BY version")]
        assert versions == [m.version for m in load("sqlite")]

    # enqueue --json: one object; the same key again is the same delivery.
    first = json.loads(launcher.cli_ok(
        db, "enqueue", "--to", "ada@example.com", "--key", "reset:token-1",
        "--subject", "Reset your password", "--text", "Follow the link.", "--json"))
    assert {"id", "key", "state", "lane"} <= set(first)
    assert first["key"] == "reset:token-1"
    assert first["state"] == "pending"
    assert first["lane"] == "interactive"
    assert first["created"] is True
    again = json.loads(launcher.cli_ok(
        db, "enqueue", "--to", "ada@example.com", "--key", "reset:token-1",
        "--subject", "Reset your password", "--text", "Follow the link.", "--json"))
    assert again["id"] == first["id"]
    assert again["created"] is False
    # The same key for other content is refused: a key names one message.
    other = launcher.cli(db, "enqueue", "--to", "ada@example.com", "--key", "reset:token-1",
                         "--text", "Follow the link.", "--json")
    assert other.returncode == 1 and "other content" in other.stderr
    bulk = json.loads(launcher.cli_ok(
        db, "enqueue", "--to", "bob@example.com", "--key", "welcome:42:import-1",
        "--lane", "bulk", "--text", "Welcome aboard.", "--json"))
    assert bulk["lane"] == "bulk" and bulk["id"] != first["id"]

    # A bad address: non-zero, a specific message naming the field, nothing written.
    with SideDB(db) as side:
        before = (side.count("postlane_deliveries"), side.count("postlane_events"))
        bad = launcher.cli(db, "enqueue", "--to", "ada@@example.com", "--key", "reset:token-2",
                           "--text", "Follow the link.", "--json")
        assert bad.returncode != 0
        assert "to: local part is not valid" in bad.stderr
        assert bad.stdout == ""
        no_domain = launcher.cli(db, "enqueue", "--to", "ada", "--key", "reset:token-3",
                                 "--text", "Follow the link.")
        assert no_domain.returncode != 0
        assert "to: address has no local part and domain" in no_domain.stderr
        assert (side.count("postlane_deliveries"), side.count("postlane_events")) == before
        assert side.count("postlane_delivery_rows", "idempotency_key LIKE 'reset:token-_'") == 1

    # status --json: the documented keys.
    status = json.loads(launcher.cli_ok(db, "status", "--json"))
    assert {"lanes", "states", "attempts", "dead_letters", "paused_lanes"} <= set(status)
    for lane in ("interactive", "bulk"):
        assert set(status["lanes"][lane]) == {"depth", "oldest_age_s"}
        assert status["lanes"][lane]["depth"] == 1
        assert status["lanes"][lane]["oldest_age_s"] >= 0
    assert status["states"]["pending"] == 2
    assert status["states"]["sent"] == 0
    assert status["attempts"] == {"1": 2}
    assert status["paused_lanes"] == []

    # pause / resume a lane, visible to status.
    assert "paused" in launcher.cli_ok(db, "pause", "bulk")
    assert json.loads(launcher.cli_ok(db, "status", "--json"))["paused_lanes"] == ["bulk"]
    assert "resumed" in launcher.cli_ok(db, "resume", "bulk")
    assert json.loads(launcher.cli_ok(db, "status", "--json"))["paused_lanes"] == []
    unknown = launcher.cli(db, "pause", "marketing")
    assert unknown.returncode != 0
    assert "unknown lane 'marketing'" in unknown.stderr


def test_a_drain_against_a_provider_that_stays_down_gives_up(sqlite_url: str,
                                                             launcher: Launcher) -> None:
    """`worker --drain` does not run forever: past --drain-timeout it stops gracefully, exits
    3 and says what still waits; the delivery is left pending for the next run."""
    db = sqlite_url
    launcher.cli_ok(db, "migrate")
    launcher.cli_ok(db, "enqueue", "--to", "ada@example.com", "--key", "reset:down-1",
                    "--text", "Follow the link.", "--from", "app@example.org")
    with socket.socket() as sock:  # a port nobody listens on: the provider is down
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = launcher.cli(db, "worker", "--provider", f"http://127.0.0.1:{port}/send",
                          "--drain", "--drain-timeout", "2s", timeout=60)
    assert result.returncode == 3, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert "gave up draining after 2 s: 1 delivery still waiting" in result.stderr
    status = json.loads(launcher.cli_ok(db, "status", "--json"))
    assert status["states"].get("pending") == 1 and not status["states"].get("sending")
