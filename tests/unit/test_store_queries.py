"""The named-query files: each engine's loads, and a mistake in one fails at load time."""

from __future__ import annotations

import ast
import re
from pathlib import Path

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


def _engine_sources(engine: str) -> list[ast.Module]:
    folder = Path(queries.__file__).parent / engine
    return [ast.parse(path.read_text("utf-8")) for path in sorted(folder.glob("*.py"))]


def _q_subscripts(trees: list[ast.Module]) -> list[ast.Subscript]:
    return [node for tree in trees for node in ast.walk(tree)
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
            and node.value.id == "Q"]


def _named_in_code(trees: list[ast.Module]) -> set[str]:
    """The names an engine's code takes from its queries as ``Q["name"]``."""
    return {node.slice.value for node in _q_subscripts(trees)
            if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)}


def _strings_in_code(trees: list[ast.Module]) -> set[str]:
    return {node.value for tree in trees for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)}


@pytest.mark.parametrize("engine", ["postgres", "sqlite"])
def test_every_query_the_engine_names_is_in_its_file(engine: str) -> None:
    named = _named_in_code(_engine_sources(engine))
    assert named, f"the {engine} engine names no query: has Q been renamed?"
    assert named <= queries.load(engine).keys(), sorted(named - queries.load(engine).keys())


def test_the_postgres_engine_names_every_query_literally() -> None:
    """Only literal names can be checked against the file (the SQLite engine picks some from
    a tuple of literals, which the next test still sees as used)."""
    computed = [ast.unparse(node) for node in _q_subscripts(_engine_sources("postgres"))
                if not isinstance(node.slice, ast.Constant)]
    assert not computed, computed


@pytest.mark.parametrize("engine", ["postgres", "sqlite"])
def test_every_entry_is_used_by_the_engine(engine: str) -> None:
    """An entry nobody runs is dead text. A name counts as used where it appears as a
    string in the engine's code (``Q["name"]``, or a literal ``Q[name]`` picks from)."""
    used = _strings_in_code(_engine_sources(engine))
    unused = sorted(queries.load(engine).keys() - used)
    assert not unused, unused


@pytest.mark.parametrize("engine", ["postgres", "sqlite"])
def test_no_comment_holds_a_marker_or_a_postgres_placeholder(engine: str) -> None:
    """The engines fill every ``__MARKER__``, comments included; psycopg reads a ``%``
    placeholder anywhere in the text, comments included."""
    for name, sql in queries.load(engine).items():
        for line in sql.splitlines():
            _, dash, comment = line.partition("--")
            assert not (dash and re.search(r"__[A-Z]+__", comment)), (name, line)
            assert not (dash and engine == "postgres" and "%" in comment), (name, line)


def test_the_clock_is_sqlites_alone_and_the_delivery_columns_are_store_bases() -> None:
    from postlane.store.base import DELIVERY_COLUMNS

    sqlite, postgres = machine.sql_fragments("sqlite"), machine.sql_fragments("postgres")
    assert "julianday('now')" in sqlite["now"] and "now" not in postgres
    assert sqlite["delivery_columns"] == postgres["delivery_columns"] == ", ".join(
        DELIVERY_COLUMNS)
    assert not any("__NOW__" in sql or "__DELIVERY_COLUMNS__" in sql
                   for sql in queries.load("sqlite").values())
