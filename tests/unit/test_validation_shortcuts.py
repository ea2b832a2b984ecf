"""The common-case shortcuts in ``core.validation`` decide exactly as the full checks do:
the same acceptance, the same exception and text, for anything thrown at them."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from postlane.core import validation

_CHARS = st.sampled_from([*"abcXYZ019-._@+'!#~\"[]: \t\n\0ü", "\ud800", "é", "\u2028"])
_ADDRESSES = st.one_of(
    st.text(_CHARS, max_size=30),
    st.builds(lambda local, domain, tld: f"{local}@{domain}.{tld}",
              st.text(_CHARS, max_size=70), st.text(st.sampled_from(list("ab0-._")), max_size=70),
              st.text(st.sampled_from(list("ab0-9")), max_size=66)),
)
_VALUES = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(),
                    st.text(_CHARS, max_size=5), st.lists(st.integers(), max_size=2),
                    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))


def outcome(check: Callable[..., Any], *args: Any) -> tuple[str, str] | None:
    try:
        check(*args)
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return None


@settings(max_examples=3000, deadline=None)
@given(_ADDRESSES)
def test_the_plain_address_match_decides_as_the_full_walk(address: str) -> None:
    fast = outcome(validation.check_address, address)
    with patch.object(validation, "_PLAIN_ADDRESS", re.compile(r"(?!)")):
        assert outcome(validation.check_address, address) == fast


@pytest.mark.parametrize("address", [
    "a" * n + "@" + label for n in (63, 64, 65)
    for label in ("b" * 63 + ".com", "b" * 64 + ".com", ("b" * 63 + ".") * 3 + "c" * 61,
                  ("b" * 63 + ".") * 3 + "c" * 62, "example.123", "example.1a")])
def test_the_plain_address_match_at_the_length_limits(
        address: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fast = outcome(validation.check_address, address)
    monkeypatch.setattr(validation, "_PLAIN_ADDRESS", re.compile(r"(?!)"))
    assert outcome(validation.check_address, address) == fast


@settings(max_examples=3000, deadline=None)
@given(st.dictionaries(st.one_of(st.text(_CHARS, max_size=4), st.integers()), _VALUES,
                       max_size=4))
def test_flat_metadata_is_checked_as_the_walk_checks_it(metadata: dict[Any, Any]) -> None:
    fast = outcome(validation.check_metadata, metadata)
    with patch.object(validation, "_flat_and_plain", lambda _: False):
        assert outcome(validation.check_metadata, metadata) == fast


@settings(max_examples=3000, deadline=None)
@given(st.text(_CHARS, max_size=10))
def test_ascii_text_is_judged_as_the_search_judges_it(text: str) -> None:
    found = validation._UNSTORABLE.search(text)
    expected = None if found is None else (
        "contains a NUL character" if found.group() == "\0"
        else "is not valid Unicode (a lone surrogate)")
    assert validation.text_problem(text) == expected
