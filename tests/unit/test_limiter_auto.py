"""``--rate auto``: the provider's account limits become the limiter's ceilings, at start and
on every refresh; a provider that cannot say is a clear error, not a worker with no ceiling."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from postlane.cli.main import app
from postlane.errors import ConfigurationError
from postlane.limiter import UNLIMITED_RATE, DailyQuota, MemoryLimiter
from postlane.limiter.auto import (
    AccountLimits,
    QuotaShape,
    apply_limits,
    ceilings_of,
    follow_limits,
)
from postlane.providers.registry import open_provider
from tests.unit.test_limiter_memory import FakeClock

SES_LIKE = AccountLimits(max_send_rate=14.0, max_24h_send=50_000, sent_last_24h=1234)


def test_headroom_lowers_the_rate_not_the_daily_count() -> None:
    rate, quota = ceilings_of(SES_LIKE, headroom=0.02, shape=QuotaShape(burst=0.1, reserve=0.3))
    assert rate == pytest.approx(14 * 0.98)
    assert quota == DailyQuota(50_000, burst=0.1, reserve=0.3)


def test_an_unlimited_side_is_left_out_and_no_limit_at_all_is_refused() -> None:
    assert ceilings_of(AccountLimits(14.0, None), headroom=0, shape=QuotaShape()) == (14.0, None)
    rate, quota = ceilings_of(AccountLimits(None, 200), headroom=0, shape=QuotaShape())
    assert rate is None and quota is not None and quota.quota == 200
    with pytest.raises(ConfigurationError, match="reports no limit"):
        ceilings_of(AccountLimits(None, None), headroom=0, shape=QuotaShape())


def test_a_bad_quota_shape_is_refused_at_once() -> None:
    with pytest.raises(ConfigurationError, match="quota burst"):
        QuotaShape(burst=1.5)
    with pytest.raises(ConfigurationError, match="quota reserve"):
        QuotaShape(reserve=-0.1)


async def test_refreshes_follow_the_account_and_a_failed_read_keeps_the_last_limits() -> None:
    limiter = MemoryLimiter(rate=1.0)
    answers: list[AccountLimits | Exception] = [
        SES_LIKE, ConnectionError("SES is down"), AccountLimits(None, 100_000), SES_LIKE,
    ]
    seen: list[tuple[float, DailyQuota | None]] = []
    waits: list[float] = []

    async def read() -> AccountLimits:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) > 1:
            seen.append((limiter.rate, limiter.quota))
        if not answers:
            raise SystemExit  # end the endless loop (not an Exception: not swallowed)

    with pytest.raises(SystemExit):
        await follow_limits(limiter, read, headroom=0.0, sleep=sleep, every_s=300)
    assert waits == [300] * 5
    assert seen == [
        (14.0, DailyQuota(50_000)),
        (14.0, DailyQuota(50_000)),  # SES was down: the last limits stay
        (UNLIMITED_RATE, DailyQuota(100_000)),
        (14.0, DailyQuota(50_000)),
    ]


async def test_apply_limits_keeps_the_burst() -> None:
    limiter = MemoryLimiter(rate=1.0, burst=3)
    await apply_limits(limiter, SES_LIKE, headroom=0.5, shape=QuotaShape())
    assert (limiter.rate, limiter.burst) == (7.0, 3)


async def test_what_the_account_sent_elsewhere_lowers_the_stock_never_raises_it() -> None:
    """A restarted in-process limiter would offer the full stock (12,500 of 50,000); SES says
    49,990 went out in the last 24 hours, so only 10 may go now."""
    clock = FakeClock()
    limiter = MemoryLimiter(rate=None, quota=DailyQuota(2), clock=clock)
    nearly_used = AccountLimits(max_send_rate=None, max_24h_send=50_000, sent_last_24h=49_990)
    await apply_limits(limiter, nearly_used, headroom=0, shape=QuotaShape())
    assert (await limiter.reserve(100, horizon_s=0.5)).granted == 10
    # A later read saying more is left does not hand back what this limiter counted.
    await apply_limits(limiter, SES_LIKE, headroom=0, shape=QuotaShape())
    assert (await limiter.reserve(100, horizon_s=0.5)).granted == 0
    # Nothing left at all: the next slot is one refill away, not now.
    limiter = MemoryLimiter(rate=None, quota=DailyQuota(50_000), clock=clock)
    used = AccountLimits(max_send_rate=None, max_24h_send=50_000, sent_last_24h=50_000)
    await apply_limits(limiter, used, headroom=0, shape=QuotaShape())
    denied = await limiter.reserve(1, horizon_s=0)
    assert denied.granted == 0
    assert denied.retry_in_s == pytest.approx(86_400 / 37_500, abs=1e-6)


async def test_providers_without_an_account_api_say_so() -> None:
    with pytest.raises(ConfigurationError, match="cannot report its account's limits"):
        await open_provider("noop://").account_limits()


def _unboxed(output: str) -> str:
    return " ".join(output.replace("│", " ").split())


@pytest.mark.parametrize(("argv", "says"), [
    (["--rate", "auto"], "the noop provider cannot report its account's limits"),
    (["--rate", "14/s,20/s"], "one per-second ceiling"),
    (["--rate", "auto,14/s"], "give it alone"),
    (["--rate", "50000/d", "--quota-burst", "1"], "quota burst must be a fraction"),
    (["--rate", "50000/d", "--quota-reserve", "1"], "quota reserve must be a fraction"),
])
def test_the_worker_refuses_bad_limits_before_it_starts(tmp_path: Path, argv: list[str],
                                                        says: str) -> None:
    result = CliRunner().invoke(app, ["--db", f"sqlite:///{tmp_path}/none.db", "worker",
                                      "--provider", "noop://", *argv])
    assert result.exit_code == 2, result.output
    assert says in _unboxed(result.output)
    assert not (tmp_path / "none.db").exists()  # refused before anything was opened
