"""The asyncpg form of the outbox's statements: ``%(name)s`` / ``%s`` parameters as ``$n``."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from postlane.store.postgres._drivers import INSERT_UNNEST, numbered
from postlane.store.postgres._producing import HELD_BY_KEYS, INSERT_ONE


def test_named_parameters_are_numbered_once_each() -> None:
    assert numbered("SELECT %(a)s, %(b)s, %(a)s") == ("SELECT $1, $2, $1", ("a", "b"))
    assert numbered(HELD_BY_KEYS)[0].endswith("idempotency_key = ANY($1)")


def test_the_outbox_statements_keep_no_psycopg_placeholder() -> None:
    for sql in (INSERT_ONE, INSERT_UNNEST, HELD_BY_KEYS):
        statement, names = numbered(sql)
        assert "%" not in statement
        assert len(names) == len(set(names))
        assert f"${len(names)}" in statement and f"${len(names) + 1}" not in statement


@given(st.lists(st.sampled_from(["key", "lane", "to", "x_1"]), min_size=1, max_size=8))
def test_each_name_keeps_its_number(names: list[str]) -> None:
    statement, order = numbered(", ".join(f"%({n})s" for n in names))
    assert list(order) == list(dict.fromkeys(names))
    assert statement == ", ".join(f"${order.index(n) + 1}" for n in names)
