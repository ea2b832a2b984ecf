from __future__ import annotations

from datetime import timedelta

import pytest

from postlane.core.durations import parse_duration


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", timedelta(seconds=90)),
        ("15m", timedelta(minutes=15)),
        ("2h", timedelta(hours=2)),
        ("1d", timedelta(days=1)),
        ("250ms", timedelta(milliseconds=250)),
        ("30", timedelta(seconds=30)),  # a bare number is seconds
        ("1.5h", timedelta(minutes=90)),
        ("0", timedelta(0)),
        ("  15 m  ", timedelta(minutes=15)),
    ],
)
def test_parse_duration(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


def test_ms_is_not_minutes() -> None:
    # "ms" must win over "m" + garbage: 500ms is half a second, not 500 minutes.
    assert parse_duration("500ms") == timedelta(seconds=0.5)


@pytest.mark.parametrize(
    "text", ["", "  ", "m", "15x", "-5m", "5 minutes", "1h30m", "1e3", "15M", ".5s", "h2"]
)
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration") as info:
        parse_duration(text)
    assert repr(text) in str(info.value)  # the message names the bad text


def test_a_duration_past_what_timedelta_holds_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="too long"):
        parse_duration("99999999999d")
