"""Poison deliveries without a database: the time checks at enqueue, the column-by-column
read of a row that failed to read, and the worker's decision for it (issue 19)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from postlane import DeadReason, InvalidMessage, InvalidTime, Message, State
from postlane.core.message import UnreadableDelivery
from postlane.core.validation import (
    EARLIEST_TIME,
    LATEST_TIME,
    check_span,
    check_time,
    check_times,
    validate,
)
from postlane.store.base import DELIVERY_COLUMNS
from postlane.store.unreadable import EPOCH, read_columns
from postlane.worker.poison import unreadable_decision
from tests.factories import delivery

ISSUE_EXPIRY = datetime.fromisoformat("9999-12-31T23:59:59-05:00")


def message(**overrides: Any) -> Message:
    return Message(**{"key": "reset:1", "to": "ada@example.com", "text": "t", **overrides})


# -- times at enqueue ----------------------------------------------------------------------
def test_the_issues_expiry_is_refused_naming_the_field_and_the_range() -> None:
    with pytest.raises(InvalidTime) as info:
        validate(message(expires_at=ISSUE_EXPIRY))
    assert info.value.field == "expires_at"
    assert isinstance(info.value, InvalidMessage)
    assert str(info.value) == (
        "expires_at 9999-12-31T23:59:59-05:00 is out of range: a time must fall between "
        "0001-01-02 and 9999-12-30 (UTC)")


@pytest.mark.parametrize(("when", "accepted"), [
    (EARLIEST_TIME, True),
    (EARLIEST_TIME - timedelta(microseconds=1), False),
    (LATEST_TIME - timedelta(microseconds=1), True),
    (LATEST_TIME, False),
    # in range as written, out of it in UTC, and the other way round
    (datetime(9999, 12, 30, 23, 0, tzinfo=timezone(timedelta(hours=-5))), False),
    (datetime(9999, 12, 31, 4, 0, tzinfo=timezone(timedelta(hours=5))), True),
    (datetime(1, 1, 1, 0, 0, tzinfo=timezone(timedelta(hours=1))), False),  # year 0 in UTC
    (datetime.max.replace(tzinfo=UTC), False),
])
def test_times_are_checked_in_utc_at_both_ends(when: datetime, accepted: bool) -> None:
    if accepted:
        check_time(when, field="expires_at")
    else:
        with pytest.raises(InvalidTime, match="out of range"):
            check_time(when, field="expires_at")


@pytest.mark.parametrize("value", [datetime(2030, 1, 1), "2030-01-01T00:00:00Z", 1893456000])
def test_a_naive_time_or_not_a_time_is_refused(value: object) -> None:
    with pytest.raises(InvalidTime, match=r"timezone-aware|must be a datetime") as info:
        check_time(value, field="expires_at")
    assert info.value.field == "expires_at"


@given(st.datetimes(min_value=datetime.min, max_value=datetime.max,
                    timezones=st.builds(lambda m: timezone(timedelta(minutes=m)),
                                        st.integers(-1439, 1439))))
def test_an_accepted_time_survives_the_sqlite_encoding_and_iso_text(when: datetime) -> None:
    """SQLite keeps epoch seconds in a REAL; dead-letter snapshots keep ISO text."""
    try:
        check_time(when, field="expires_at")
    except InvalidTime:
        return
    back = datetime.fromtimestamp(when.timestamp(), UTC)
    assert abs(back - when) < timedelta(milliseconds=1)
    assert datetime.fromisoformat(back.isoformat()) == back


def test_spans_must_end_before_the_last_time() -> None:
    now = datetime(2030, 1, 1, tzinfo=UTC)
    room = LATEST_TIME - now
    check_span(room - timedelta(microseconds=1), field="delay", zero_ok=True, now=now)
    for span in (room, timedelta.max):
        with pytest.raises(InvalidTime, match="out of range") as info:
            check_span(span, field="delay", zero_ok=True, now=now)
        assert info.value.field == "delay"
    check_span(timedelta(0), field="delay", zero_ok=True, now=now)
    with pytest.raises(InvalidTime, match="expires_in must be positive"):
        check_span(timedelta(0), field="expires_in", zero_ok=False, now=now)
    with pytest.raises(InvalidTime, match="must be a timedelta"):
        check_span(90, field="delay", zero_ok=True, now=now)


def test_every_time_of_a_message_is_checked() -> None:
    check_times(message(expires_in=timedelta(minutes=15), delay=timedelta(0)))
    for field in ("expires_in", "delay"):
        with pytest.raises(InvalidTime) as info:
            validate(message(**{field: timedelta(days=9_000_000)}))
        assert info.value.field == field


# -- a row read column by column -----------------------------------------------------------
def row(**changes: Any) -> dict[str, Any]:
    """A SQLite-shaped row: epoch seconds and JSON text."""
    values: dict[str, Any] = dict.fromkeys(DELIVERY_COLUMNS)
    values.update(id=3, idempotency_key="poison:1", lane="bulk", channel="email",
                  recipient="ada@example.com", subject="s", text_body="t", headers="{}",
                  metadata='{"user": 1}', state="sending", attempts=2, claims=4,
                  run_at=1.9e9, created_at=1.9e9, updated_at=1.9e9)
    values.update(changes)
    return values


DECODERS: dict[str, Any] = {
    "run_at": lambda v: datetime.fromtimestamp(v, UTC),
    "created_at": lambda v: datetime.fromtimestamp(v, UTC),
    "updated_at": lambda v: datetime.fromtimestamp(v, UTC),
    "expires_at": lambda v: None if v is None else datetime.fromtimestamp(v, UTC),
    "headers": json.loads, "metadata": json.loads, "state": State,
}


def test_a_row_is_read_column_by_column_with_each_error_verbatim() -> None:
    d = read_columns(row(expires_at=2.6e11, headers='{"X-A": 5}', created_at="soon"),
                     DECODERS, ValueError("first"))
    assert isinstance(d, UnreadableDelivery)
    assert (d.id, d.key, d.lane, d.claims, d.attempts, d.state) == (
        3, "poison:1", "bulk", 4, 2, State.SENDING)
    assert d.metadata == {"user": 1} and d.run_at == datetime.fromtimestamp(1.9e9, UTC)
    assert (d.expires_at, d.headers, d.created_at) == (None, {}, EPOCH)  # placeholders
    with pytest.raises(ValueError) as year:
        datetime.fromtimestamp(2.6e11, UTC)
    with pytest.raises(TypeError) as text:
        datetime.fromtimestamp("soon", UTC)  # type: ignore[arg-type]
    assert d.unreadable == (  # in the order of the columns
        "headers: ValueError: header 'X-A' is not text: 5; "
        f"expires_at: ValueError: {year.value}; "
        f"created_at: TypeError: {text.value}")


def test_a_column_the_engine_could_not_fetch_is_named_and_the_whole_error_kept() -> None:
    d = read_columns(row(expires_at=LookupError("too large")), DECODERS, ValueError("first"))
    assert d.unreadable == "expires_at: LookupError: too large"
    whole = read_columns(row(), DECODERS, ValueError("the row as a whole"))
    assert whole.unreadable == "ValueError: the row as a whole"


# -- the worker's decision -------------------------------------------------------------------
def test_an_unreadable_delivery_is_a_handler_error_dead_letter_with_the_error() -> None:
    assert unreadable_decision(delivery()) is None
    d = read_columns(row(metadata="[1"), DECODERS, ValueError("first"))
    decision = unreadable_decision(d)
    assert decision is not None
    assert decision.state is State.DEAD and decision.dead_reason == DeadReason.HANDLER_ERROR
    assert decision.detail["outcome"] == "handler_error" and decision.detail["attempt"] == 3
    assert decision.detail["traceback"] == (
        f"the stored delivery cannot be read: {d.unreadable}")
    assert d.unreadable.startswith("metadata: JSONDecodeError: ")
