"""``postlane check``: every misconfiguration it promises to find is found, in plain words,
with exit status 1; a healthy deployment passes with 0. Real PostgreSQL and Redis; the CLI
runs in-process (typer's runner) from an empty working directory and a clean environment."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from typer.testing import CliRunner

from postlane.check import (
    Finding,
    check_lane_shares,
    check_provider,
    check_retry_budgets,
    expected_retry_budget_s,
    human,
    lane_configs,
    worst_retry_budget_s,
)
from postlane.cli.main import app
from postlane.core.lanes import DEFAULT_LANES, LaneConfig
from postlane.core.message import Delivery
from postlane.core.outcomes import Outcome
from postlane.core.policy import RetryPolicy
from postlane.providers.base import Provider
from postlane.providers.registry import open_provider
from postlane.store.migrations import load

REDIS_URL = os.environ.get("POSTLANE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


# -- helpers -----------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No POSTLANE_* from the caller's shell, no stray postlane.toml."""
    for name in list(os.environ):
        if name.startswith("POSTLANE_") and not name.startswith("POSTLANE_TEST_"):
            monkeypatch.delenv(name)
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    monkeypatch.chdir(workdir)


@pytest.fixture
def redis_url() -> str:
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2, socket_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.fail(f"Redis is required at {REDIS_URL} ({exc}); `.ci/run` starts it",
                    pytrace=False)
    finally:
        client.close()
    return REDIS_URL


@pytest.fixture
def migrated_pg(fresh_pg_url: str) -> Iterator[str]:
    result = CliRunner().invoke(app, ["--db", fresh_pg_url, "migrate"])
    assert result.exit_code == 0, result.output
    yield fresh_pg_url


def closed_port() -> int:
    """A local TCP port nobody listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_check(db: str, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(app, ["--db", db, "check", *args, "--json"], env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, json.loads(result.stdout)


def by_check(report: dict[str, Any], check: str) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["check"] == check]


def failures(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["status"] == "fail"]


def healthy_args(tmp_path: Path, redis_url: str) -> list[str]:
    return ["--provider", f"record://{tmp_path / 'sends.db'}", "--rate", "60/s",
            "--limiter", redis_url, "--lanes", "interactive=70,bulk=30",
            "--unsubscribe-url", "https://mail.example.com"]


@pytest.fixture(autouse=True)
def unsubscribe_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """A healthy deployment signs its bulk lane's unsubscribe links (docs/deliverability.md)."""
    monkeypatch.setenv("POSTLANE_UNSUBSCRIBE_SECRET", "0123456789abcdef0123456789abcdef")
    monkeypatch.delenv("POSTLANE_UNSUBSCRIBE_URL", raising=False)


# -- the healthy deployment --------------------------------------------------------------
def test_healthy_postgres_deployment_passes(migrated_pg: str, redis_url: str,
                                            tmp_path: Path) -> None:
    code, report = run_check(migrated_pg, *healthy_args(tmp_path, redis_url))
    assert code == 0, report
    assert report["ok"] is True
    assert {f["status"] for f in report["findings"]} == {"ok"}, report
    checks = {f["check"] for f in report["findings"]}
    assert checks == {"database", "migrations", "limiter", "provider", "rate", "lanes",
                      "retry budget", "unsubscribe"}
    assert "no probe available" in by_check(report, "provider")[0]["message"]
    assert "ready for traffic" in report["summary"]

    # The plain-words form says the same, one line per finding.
    plain = CliRunner().invoke(app, ["--db", migrated_pg, "check",
                                     *healthy_args(tmp_path, redis_url)])
    assert plain.exit_code == 0, plain.output
    assert "FAIL" not in plain.stdout and "all checks passed" in plain.stdout


def test_worker_settings_come_from_the_environment_and_the_config_file(
    migrated_pg: str, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What `postlane worker` would read is what `postlane check` reads."""
    Path("postlane.toml").write_text(
        f'db = "{migrated_pg}"\n'
        "[worker]\n"
        f'provider = "record://{tmp_path / "sends.db"}"\n'
        'rate = "60/s"\n'
        f'limiter = "{redis_url}"\n'
        'lanes = "interactive=80,bulk=30"\n'
    )
    result = CliRunner().invoke(app, ["check", "--json"])
    report = json.loads(result.stdout)
    assert result.exit_code == 1
    assert [f["check"] for f in failures(report)] == ["lanes"]
    assert "110 %" in failures(report)[0]["message"]

    # The environment wins over the file, as it does for the worker.
    monkeypatch.setenv("POSTLANE_LANES", "interactive=60,bulk=40")
    result = CliRunner().invoke(app, ["check", "--json"])
    assert result.exit_code == 0, result.stdout
    assert "interactive=60" in by_check(json.loads(result.stdout), "lanes")[0]["message"]


# -- each promised detection -------------------------------------------------------------
def test_unreachable_database(redis_url: str, tmp_path: Path) -> None:
    port = closed_port()
    code, report = run_check(f"postgresql://postgres@127.0.0.1:{port}/postlane",
                             *healthy_args(tmp_path, redis_url))
    assert code == 1
    [database] = by_check(report, "database")
    assert database["status"] == "fail"
    assert f"cannot reach PostgreSQL at 127.0.0.1:{port}/postlane" in database["message"]
    assert "pg_hba.conf" in database["hint"]
    assert by_check(report, "migrations") == []  # nothing to say about a schema not reached
    # The other checks still ran.
    assert by_check(report, "limiter")[0]["status"] == "ok"


def test_unusable_database_url(tmp_path: Path, redis_url: str) -> None:
    code, report = run_check("mysql://db/app", *healthy_args(tmp_path, redis_url))
    assert code == 1
    assert "unsupported database URL scheme 'mysql'" in by_check(report, "database")[0]["message"]


def test_unmigrated_database_names_the_pending_migrations(
    fresh_pg_url: str, redis_url: str, tmp_path: Path,
) -> None:
    code, report = run_check(fresh_pg_url, *healthy_args(tmp_path, redis_url))
    assert code == 1
    assert by_check(report, "database")[0]["status"] == "ok"
    [migrations] = by_check(report, "migrations")
    assert migrations["status"] == "fail"
    for migration in load("postgres"):
        assert migration.label in migrations["message"]
    assert migrations["hint"].endswith(f"postlane --db '{fresh_pg_url}' migrate")
    # Nothing was written by the check: the database is as empty as before.
    with psycopg.connect(fresh_pg_url) as conn:
        assert conn.execute("SELECT to_regclass('postlane_migrations')").fetchone() == (None,)

    # Half-migrated: only what is missing is named.
    with psycopg.connect(fresh_pg_url, autocommit=True) as conn:
        first = load("postgres")[0]
        conn.execute(first.sql.encode())
        conn.execute("CREATE TABLE IF NOT EXISTS postlane_migrations (version INTEGER PRIMARY "
                     "KEY, name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())")
        conn.execute("INSERT INTO postlane_migrations (version, name) VALUES (%s, %s)",
                     (first.version, first.name))
    code, report = run_check(fresh_pg_url, *healthy_args(tmp_path, redis_url))
    assert code == 1
    [migrations] = by_check(report, "migrations")
    assert first.label not in migrations["message"]
    assert all(m.label in migrations["message"] for m in load("postgres")[1:])


def test_unreachable_redis(migrated_pg: str, tmp_path: Path) -> None:
    port = closed_port()
    code, report = run_check(migrated_pg, "--provider", f"record://{tmp_path / 's.db'}",
                             "--rate", "60/s", "--limiter", f"redis://127.0.0.1:{port}/0")
    assert code == 1
    [limiter] = by_check(report, "limiter")
    assert limiter["status"] == "fail"
    assert f"cannot reach the limiter's Redis at redis://127.0.0.1:{port}/0" in limiter["message"]
    assert [f["check"] for f in failures(report)] == ["limiter"]


def test_limiter_without_a_rate(migrated_pg: str, redis_url: str, tmp_path: Path) -> None:
    code, report = run_check(migrated_pg, "--provider", f"record://{tmp_path / 's.db'}",
                             "--limiter", redis_url)
    assert code == 1
    assert "--rate is not" in failures(report)[0]["message"]


def test_bad_provider_url(migrated_pg: str, redis_url: str, tmp_path: Path) -> None:
    code, report = run_check(migrated_pg, "--provider", "carrier-pigeon://coop", "--rate",
                             "60/s", "--limiter", redis_url)
    assert code == 1
    [provider] = by_check(report, "provider")
    assert provider["status"] == "fail"
    assert "unknown provider URL 'carrier-pigeon://coop'" in provider["message"]

    # A URL the registry understands, whose adapter cannot open.
    code, report = run_check(migrated_pg, "--provider",
                             f"record://{tmp_path / 'missing-dir' / 'sends.db'}",
                             "--rate", "60/s", "--limiter", redis_url)
    assert code == 1
    assert "unable to open database file" in by_check(report, "provider")[0]["message"]

    # No provider at all.
    code, report = run_check(migrated_pg, "--rate", "60/s", "--limiter", redis_url)
    assert code == 1
    assert by_check(report, "provider")[0]["message"] == "no provider is configured"


def test_lane_shares_not_adding_up(migrated_pg: str, redis_url: str, tmp_path: Path) -> None:
    args = healthy_args(tmp_path, redis_url)[:-2]
    code, report = run_check(migrated_pg, *args, "--lanes", "interactive=70,bulk=20")
    assert code == 1
    [lanes] = failures(report)
    assert lanes["check"] == "lanes"
    assert "add up to 90 %, not 100 %" in lanes["message"]

    code, report = run_check(migrated_pg, *args, "--lanes", "interactive=seventy,bulk=30")
    assert code == 1
    assert any("'interactive=seventy' is not NAME=PERCENT" in f["message"]
               for f in failures(report))


def test_retry_budget_outliving_the_expiry(migrated_pg: str, redis_url: str,
                                          tmp_path: Path) -> None:
    # Interactive: 6 attempts from a 250 ms base, about 8 s of backoff; a 10 s token cannot
    # hold that.
    code, report = run_check(migrated_pg, *healthy_args(tmp_path, redis_url),
                             "--lane-expiry", "interactive=10s")
    assert code == 1
    [budget] = failures(report)
    assert budget["check"] == "retry budget"
    assert budget["message"].startswith("lane interactive: 6 attempts wait about 8 s")
    assert "more than two-thirds of its 10 s expiry (7 s)" in budget["message"]
    assert "lengthen its expiry to at least 12 s" in budget["hint"]

    # The lane's backoff as the worker gets it: from a 1 s base (capped at the lane's 30 s),
    # about 30 s; a 20 s token cannot hold that either, while the default base fits it.
    code, report = run_check(migrated_pg, *healthy_args(tmp_path, redis_url),
                             "--lane-expiry", "interactive=20s", "--retry-base", "interactive=1s")
    assert code == 1
    [budget] = failures(report)
    assert budget["message"].startswith("lane interactive: 6 attempts wait about 30 s")
    assert "more than two-thirds of its 20 s expiry (13 s)" in budget["message"]
    assert "lengthen its expiry to at least 45 s" in budget["hint"]
    code, report = run_check(migrated_pg, *healthy_args(tmp_path, redis_url),
                             "--lane-expiry", "interactive=20s")
    assert code == 0, failures(report)

    code, report = run_check(migrated_pg, *healthy_args(tmp_path, redis_url),
                             "--lane-expiry", "interactive=1m,bulk=3m10s")
    assert code == 1
    assert any("not a duration" in f["message"] for f in failures(report))


def test_retry_budget_through_lane_configs() -> None:
    """The seed's example: a reset link valid 15 minutes; 12 attempts outlive it."""
    reset = LaneConfig("interactive", 1.0, max_attempts=12, default_expiry=timedelta(minutes=15))
    # Full jitter waits half of min(cap, base * 2**k) on average after attempt k.
    assert expected_retry_budget_s(reset) == pytest.approx(
        sum(0.5 * min(300.0, 2.0 ** k) for k in range(1, 12)))
    assert worst_retry_budget_s(reset) == pytest.approx(
        sum(min(300.0, 2.0 ** k) for k in range(1, 12)))
    [finding] = check_retry_budgets([reset])
    assert finding.failed, finding
    assert "11 min 45 s" in finding.message and "15 min expiry (10 min)" in finding.message

    fine = LaneConfig("interactive", 1.0, max_attempts=6, default_expiry=timedelta(minutes=15))
    assert not check_retry_budgets([fine])[0].failed
    forever = LaneConfig("bulk", 1.0, max_attempts=8)
    assert check_retry_budgets([forever])[0].status == "ok"
    # A slower policy makes the same lane fail.
    assert check_retry_budgets([fine], RetryPolicy(base_s=60.0))[0].failed
    # The shipped defaults pass.
    assert not any(f.failed for f in check_retry_budgets(DEFAULT_LANES))
    # The lane's own fraction is the limit: 11 min 45 s fits in 80 % of 15 min (12 min).
    [roomy] = check_retry_budgets([replace(reset, retry_budget=0.8)])
    assert not roomy.failed and "within 80% of its 15 min expiry" in roomy.message, roomy
    # ... and --retry-budget reaches it through the lanes the worker would run.
    lanes, findings = lane_configs("interactive=100", retry_budget="interactive=0.8")
    assert findings == [] and lanes[0].retry_budget == 0.8
    lanes, findings = lane_configs("interactive=100", retry_budget="interactive=3")
    assert findings and "retry_budget" in findings[0].message


def test_lanes_through_lane_configs() -> None:
    assert check_lane_shares(DEFAULT_LANES).status == "ok"
    assert check_lane_shares([LaneConfig("a", 0.5), LaneConfig("a", 0.5)]).failed
    assert check_lane_shares([LaneConfig("a", 0.5), LaneConfig("b", 0.6)]).failed
    assert "concurrency 1 is below" in check_lane_shares(DEFAULT_LANES, concurrency=1).message
    lanes, findings = lane_configs("interactive=70,bulk=30", "bulk=1h")
    assert findings == []
    assert [lane.default_expiry for lane in lanes] == [timedelta(minutes=15), timedelta(hours=1)]
    _, findings = lane_configs(None, "urgent=1m")
    assert findings and "does not name a configured lane" in findings[0].message


def test_rate_must_be_positive(migrated_pg: str, redis_url: str, tmp_path: Path) -> None:
    for bad in ("0/s", "-5/s", "fast"):
        args = [a if a != "60/s" else bad for a in healthy_args(tmp_path, redis_url)]
        code, report = run_check(migrated_pg, *args)
        assert code == 1, bad
        [rate] = by_check(report, "rate")
        assert rate["status"] == "fail"
        assert f"the rate {bad!r} is not a positive number" in rate["message"]
    code, report = run_check(migrated_pg, *healthy_args(tmp_path, redis_url), "--headroom", "0.7")
    assert code == 1
    assert "--headroom 0.7 is outside" in failures(report)[0]["message"]


def test_sqlite_missing_then_migrated(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'app.db'}"
    args = ["--provider", "noop://", "--rate", "10/s"]
    code, report = run_check(db, *args)
    assert code == 1
    assert "does not exist" in by_check(report, "database")[0]["message"]
    assert not (tmp_path / "app.db").exists(), "the check must not create the database"

    assert CliRunner().invoke(app, ["--db", db, "migrate"]).exit_code == 0
    code, report = run_check(db, *args)
    assert code == 0, report
    warnings = [f["message"] for f in report["findings"] if f["status"] == "warn"]
    assert any("one host only" in w for w in warnings)
    assert any("in-process limiter" in w for w in warnings)


# -- the provider probe capability -------------------------------------------------------
class _Plain(Provider):
    name = "plain"

    def __init__(self) -> None:
        self.opened = self.closed = 0

    async def open(self) -> None:
        self.opened += 1

    async def close(self) -> None:
        self.closed += 1

    async def send(self, delivery: Delivery) -> Outcome:  # pragma: no cover - never called
        raise AssertionError("a check must not send")


class _Probed(_Plain):
    name = "probed"

    def __init__(self, answer: str | None) -> None:
        super().__init__()
        self.answer = answer
        self.probed = 0

    async def check(self) -> str | None:
        assert self.opened == 1 and self.closed == 0, "probe runs between open and close"
        self.probed += 1
        return self.answer


class _Broken(_Plain):
    async def open(self) -> None:
        raise ConnectionRefusedError("connect to mail.example.com:587 refused")


async def test_provider_probe_is_called_when_present() -> None:
    good = _Probed(None)
    [finding] = await check_provider(good)
    assert finding == Finding("provider", "ok", "provider probed (account 'probed') accepted "
                                                "the credentials (no message sent)")
    assert (good.opened, good.probed, good.closed) == (1, 1, 1)

    bad = _Probed("535 5.7.8 authentication failed for ops@example.com")
    [finding] = await check_provider(bad)
    assert finding.failed and "535 5.7.8 authentication failed" in finding.message
    assert bad.closed == 1

    plain = _Plain()
    [finding] = await check_provider(plain)
    assert finding.status == "ok" and "no probe available" in finding.message
    assert (plain.opened, plain.closed) == (1, 1)

    [finding] = await check_provider(_Broken())
    assert finding.failed
    assert "ConnectionRefusedError: connect to mail.example.com:587 refused" in finding.message


def test_human_durations() -> None:
    assert [human(s) for s in (0, 31, 60, 62, 705, 3600, 7620, 86400)] == [
        "0 s", "31 s", "1 min", "1 min 2 s", "11 min 45 s", "1 h", "2 h 7 min", "24 h"]


def test_an_api_host_checks_only_what_it_uses(migrated_pg: str) -> None:
    """`postlane serve` needs the database and the lane names, not the provider's secrets."""
    code, report = run_check(migrated_pg, "--skip", "provider,limiter", "--skip", "rate")
    assert code == 0, report
    assert {f["check"] for f in report["findings"]} == {"database", "migrations", "lanes",
                                                         "retry budget", "unsubscribe"}
    result = CliRunner().invoke(app, ["--db", migrated_pg, "check", "--skip", "network"])
    assert result.exit_code == 2
    assert "unknown check 'network'" in result.output


# -- the provider's sender and endpoint ---------------------------------------------------
@pytest.mark.parametrize("url", [
    "http://127.0.0.1:{port}/send", "resend://:key@?base_url=http://127.0.0.1:{port}",
    "postmark://:token@?base_url=http://127.0.0.1:{port}",
    "smtp://127.0.0.1:{port}", "ses://testing:secret@eu-west-1?endpoint_url=http://127.0.0.1:{port}",
])
def test_a_provider_without_a_sender_fails(migrated_pg: str, url: str) -> None:
    """No from= on the provider URL: every message without its own sender would stop the
    account, so the check fails with one clear line (and names the fix)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        code, report = run_check(migrated_pg, "--provider", url.format(port=port),
                                 "--skip", "limiter,rate,lanes")
    assert code == 1
    [sender] = [f for f in failures(report) if "no sender" in f["message"]]
    assert "names no from= address" in sender["message"] and "from=" in sender["hint"]
    plain = CliRunner().invoke(app, ["--db", migrated_pg, "check", "--provider",
                                     url.format(port=closed_port()), "--skip",
                                     "limiter,rate,lanes"])
    assert plain.exit_code == 1
    assert sum("has no sender" in line for line in plain.stdout.splitlines()) == 1


def test_a_provider_with_a_sender_and_an_answering_endpoint_passes(migrated_pg: str) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        code, report = run_check(migrated_pg, "--provider",
                                 f"http://127.0.0.1:{port}/send?from=ops@example.org",
                                 "--skip", "limiter,rate,lanes")
    assert code == 0, report
    [provider] = by_check(report, "provider")
    assert f"answers at 127.0.0.1:{port}" in provider["message"]


def test_an_endpoint_that_refuses_fails(migrated_pg: str) -> None:
    port = closed_port()
    result = CliRunner().invoke(app, ["--db", migrated_pg, "check", "--provider",
                                      f"http://127.0.0.1:{port}/send?from=ops@example.org",
                                      "--skip", "limiter,rate,lanes"])
    assert result.exit_code == 1
    [line] = [x for x in result.stdout.splitlines() if x.startswith("FAIL")]
    assert f"nothing answers at 127.0.0.1:{port}: connection refused" in line


async def test_an_endpoint_that_does_not_answer_fails_with_a_connect_timeout() -> None:
    """A listener whose accept queue is full drops further SYNs, as a firewall would: the
    connection neither completes nor is refused."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fillers = []
        try:
            for _ in range(4):  # fill the accept queue (its size is backlog + 1 on Linux)
                filler = socket.socket()
                filler.setblocking(False)
                filler.connect_ex(("127.0.0.1", port))
                fillers.append(filler)
            provider = open_provider(f"resend://:key@?base_url=http://127.0.0.1:{port}"
                                     "&from=ops@example.org")
            [finding] = await check_provider(provider, timeout_s=0.5)
        finally:
            for filler in fillers:
                filler.close()
    assert finding.failed
    assert f"nothing answers at 127.0.0.1:{port}: no connection within 0.5 s" in (
        finding.message)
    assert "connect timeout" in finding.message


def test_bulk_lanes_without_signed_unsubscribe_links_are_named(
        migrated_pg: str, monkeypatch: pytest.MonkeyPatch) -> None:
    skip = ["--skip", "provider,limiter,rate"]
    code, report = run_check(migrated_pg, *skip)
    [finding] = by_check(report, "unsubscribe")
    assert code == 0 and finding["status"] == "warn"
    assert "bulk lane(s) bulk would send without List-Unsubscribe" in finding["message"]
    _, report = run_check(migrated_pg, *skip, "--bulk-lanes", "")
    assert by_check(report, "unsubscribe")[0]["status"] == "ok"
    monkeypatch.setenv("POSTLANE_UNSUBSCRIBE_SECRET", "short")
    code, report = run_check(migrated_pg, *skip, "--unsubscribe-url", "https://m.example.com")
    [finding] = by_check(report, "unsubscribe")
    assert code == 1 and finding["status"] == "fail" and "16 bytes" in finding["message"]
    monkeypatch.setenv("POSTLANE_UNSUBSCRIBE_SECRET", "0123456789abcdef0123456789abcdef")
    code, report = run_check(migrated_pg, *skip, "--unsubscribe-url", "http://m.example.com")
    assert code == 1 and "https" in by_check(report, "unsubscribe")[0]["message"]
