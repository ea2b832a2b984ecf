"""``postlane worker --provider ... --fallback ...`` and the same in ``postlane.toml``: a real
worker process whose primary is down drains everything through the fallback (a record://
file, which keeps what reached it), once per key."""

from __future__ import annotations

import json

from conftest import SideDB

from postlane.providers.testing import read_record_file

from .conftest import Launcher


def _enqueue(launcher: Launcher, db: str, n: int) -> None:
    for i in range(n):
        launcher.cli_ok(db, "enqueue", "--to", f"user{i}@example.com", "--key", f"reset:{i}",
                        "--text", "Follow the link.")


def test_worker_fails_over_from_the_command_line(sqlite_url: str, launcher: Launcher) -> None:
    db = sqlite_url
    launcher.cli_ok(db, "migrate")
    _enqueue(launcher, db, 12)
    sent = launcher.workdir / "fallback.db"
    result = launcher.cli(db, "worker", "--provider", "sandbox://?error_rate=1&account=primary",
                          "--fallback", f"record://{sent}", "--fallback-rate", "100/s",
                          "--drain", "--drain-timeout", "60s", timeout=90)
    assert result.returncode == 0, (result.stdout, result.stderr)
    status = json.loads(launcher.cli_ok(db, "status", "--json"))
    assert {k: v for k, v in status["states"].items() if v} == {"sent": 12}
    assert sorted(read_record_file(str(sent)).keys) == sorted(f"reset:{i}" for i in range(12))
    with SideDB(db) as side:
        providers = {row[0] for row in side.query(
            "SELECT json_extract(data, '$.provider') FROM postlane_events WHERE kind = 'sent'")}
        assert providers == {"record"}
        assert side.count("postlane_events", "kind = 'retry_scheduled'") >= 1


def test_fallbacks_in_postlane_toml(sqlite_url: str, launcher: Launcher) -> None:
    db = sqlite_url
    launcher.cli_ok(db, "migrate")
    _enqueue(launcher, db, 12)
    sent = launcher.workdir / "fallback.db"
    (launcher.workdir / "postlane.toml").write_text(
        "[worker]\n"
        'provider = "sandbox://?error_rate=1&account=primary"\n'
        f'fallback = ["record://{sent}"]\n'
        'fallback-rate = ["100/s"]\n')
    result = launcher.cli(db, "worker", "--drain", "--drain-timeout", "60s", timeout=90)
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert len(read_record_file(str(sent)).keys) == 12


def test_bad_fallback_settings_are_refused(sqlite_url: str, launcher: Launcher) -> None:
    db = sqlite_url
    launcher.cli_ok(db, "migrate")
    two_rates = launcher.cli(db, "worker", "--provider", "noop://", "--fallback", "sandbox://",
                             "--fallback-rate", "1/s", "--fallback-rate", "2/s")
    assert two_rates.returncode != 0 and "2 --fallback-rate for 1 --fallback" in two_rates.stderr
    same = launcher.cli(db, "worker", "--provider", "sandbox://", "--fallback", "sandbox://",
                        "--drain")
    assert same.returncode != 0 and "the same provider account twice" in same.stderr
