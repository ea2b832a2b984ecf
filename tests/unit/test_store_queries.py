"""The named-query files: each engine's loads, and a mistake in one fails at load time."""

from __future__ import annotations

import pytest

from postlane.core.states import TERMINAL_STATES
from postlane.store import machine, queries


@pytest.mark.parametrize("engine", ["postgres", "sqlite"])
def test_each_engine_loads_its_queries(engine: str) -> None:
    loaded = queries.load(engine)
    assert loaded and all(sql.strip() for sql in loaded.values())
    assert not any("{{" in sql for sql in loaded.values())


def test_fragments_are_filled_and_terminal_states_come_from_core() -> None:
    found = queries.parse("-- name: done\nSELECT 1 WHERE state IN {{terminal}}\n",
                          machine.sql_fragments("postgres"))
    for state in TERMINAL_STATES:
        assert f"'{state.value}'" in found["done"]


@pytest.mark.parametrize(("text", "error"), [
    ("-- name: a\nSELECT 1\n-- name: a\nSELECT 2\n", "defined twice"),
    ("-- name: a\nSELECT {{nope}}\n", "unknown fragment"),
    ("SELECT 1\n-- name: a\nSELECT 2\n", "before the first"),
])
def test_a_bad_queries_file_is_refused_with_the_reason(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        queries.parse(text, machine.sql_fragments("sqlite"))


def test_rescue_goes_to_ambiguous_only_once_started() -> None:
    assert machine.rescue_target(True).value == "ambiguous"
    assert machine.rescue_target(False).value == "pending"
    assert machine.rescue_detail("w", True, 2)["outcome"] == "ambiguous"
    assert "outcome" not in machine.rescue_detail("w", False, 0)
