"""``--rate`` as the worker and ``postlane check`` read it: per-second ceilings, daily quotas,
both, or ``auto``."""

from __future__ import annotations

import pytest

from postlane.core.rates import Limits, parse_limits, parse_rate
from postlane.errors import ConfigurationError


@pytest.mark.parametrize(("text", "per_second"), [
    ("200", 200.0), ("200/s", 200.0), (" 12000 / m ", 200.0), ("720000/h", 200.0),
    ("86400/d", 1.0), ("86400/day", 1.0), ("0.5/sec", 0.5),
])
def test_parse_rate_reads_every_unit_as_sends_per_second(text: str, per_second: float) -> None:
    assert parse_rate(text) == pytest.approx(per_second)


@pytest.mark.parametrize("text", ["", "0/s", "-1/s", "200/w", "fast", "200/s,50000/d"])
def test_parse_rate_refuses_what_is_not_one_positive_rate(text: str) -> None:
    with pytest.raises(ConfigurationError, match="not a rate"):
        parse_rate(text)


@pytest.mark.parametrize(("text", "limits"), [
    ("200/s", Limits(per_second=200.0)),
    ("12000/m", Limits(per_second=200.0)),
    ("50000/d", Limits(per_day=50000)),
    ("50000/day", Limits(per_day=50000)),
    ("14/s,50000/d", Limits(per_second=14.0, per_day=50000)),
    (" 50000/d , 14/s ", Limits(per_second=14.0, per_day=50000)),
    ("auto", Limits(auto=True)),
    (" AUTO ", Limits(auto=True)),
])
def test_parse_limits(text: str, limits: Limits) -> None:
    assert parse_limits(text) == limits


def test_a_daily_quota_is_a_count_not_a_per_second_rate() -> None:
    """50000/d alone is a quota over any 24 hours (bursts allowed), not 0.58 sends a second."""
    assert parse_limits("50000/d").per_second is None


@pytest.mark.parametrize(("text", "says"), [
    ("14/s,20/s", "one per-second ceiling"),
    ("50000/d,60000/d", "one daily quota"),
    ("1.5/d", "whole number"),
    ("1/d", "at least 2"),
    ("auto,14/s", "give it alone"),
    ("14/s,", "not a rate"),
    ("0/d", "not a rate"),
])
def test_parse_limits_refuses_with_a_specific_error(text: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        parse_limits(text)
