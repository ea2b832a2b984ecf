"""The ownership rule of ``core.producers`` without a database."""

from __future__ import annotations

from typing import Any

import pytest

from postlane.core.message import Message
from postlane.core.producers import Held, conflict_reason, first_by_key, same_content
from postlane.errors import KeyConflict


def held(producer: str | None = None, **overrides: Any) -> Held:
    fields: dict[str, Any] = {
        "id": 7, "key": "k", "producer": producer, "channel": "email",
        "recipient": "ada@example.com", "sender": None, "subject": "Hi", "text": "body",
        "html": None, "headers": {}, "template_id": None, "template_version": None}
    return Held(**{**fields, **overrides})


def message(**overrides: Any) -> Message:
    fields: dict[str, Any] = {"key": "k", "to": "ada@example.com", "subject": "Hi",
                              "text": "body"}
    return Message(**{**fields, **overrides})


@pytest.mark.parametrize(("mine", "theirs", "allowed"), [
    (None, None, True),
    ("apikey:1", "apikey:1", True),
    (None, "apikey:1", False),
    ("apikey:1", None, False),
    ("apikey:2", "apikey:1", False),
    ("import:a", "import:b", False),
    ("apikey:1", "apikey:?", False),  # written by the API before producers were recorded
])
def test_only_the_same_producer_may_have_a_key(mine: str | None, theirs: str | None,
                                               allowed: bool) -> None:
    assert (conflict_reason(message(), mine, held(theirs)) is None) is allowed


def test_an_import_may_resume_what_it_wrote_before_producers_were_recorded() -> None:
    legacy = held(None, import_id="imp-1")  # no producer: written before migration 0006
    assert conflict_reason(message(), "import:imp-1", legacy) is None
    assert conflict_reason(message(), "import:imp-2", legacy) is not None
    assert conflict_reason(message(), "apikey:1", legacy) is not None
    assert conflict_reason(message(), "import:imp-1", held(None)) is not None


def test_a_new_template_version_is_the_same_message_but_not_a_new_recipient() -> None:
    v1 = held(template_id="welcome", template_version=1, subject="Hello v1")
    assert same_content(message(template_id="welcome", template_version=2,
                                subject="Hello v2"), v1)
    assert not same_content(message(template_id="welcome", template_version=2,
                                    to="eve@example.com"), v1)
    assert not same_content(message(template_id="welcome", template_version=1,
                                    subject="Hello v2"), v1)
    assert not same_content(message(template_id="other", template_version=1), v1)


def test_content_but_not_lane_metadata_or_timing_counts() -> None:
    assert same_content(message(lane="bulk", metadata={"a": 1}, import_id="x"), held())
    for changed in ({"to": "eve@example.com"}, {"subject": "Ho"}, {"text": "other"},
                    {"html": "<p>"}, {"sender": "x@example.com"}, {"headers": {"X-A": "1"}},
                    {"channel": "sms"}):
        assert not same_content(message(**changed), held()), changed


def test_a_batch_may_repeat_a_key_only_with_the_same_content() -> None:
    first = first_by_key([message(), message(lane="bulk"), message(key="j")])
    assert list(first) == ["k", "j"]
    with pytest.raises(KeyConflict) as refused:
        first_by_key([message(), message(key="j"), message(to="eve@example.com")])
    assert refused.value.conflicts[0][:2] == ("k", 0)
