"""The asyncpg form of the outbox's statements: ``%(name)s`` / ``%s`` parameters as ``$n``."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from postlane.store.postgres._base import Q
from postlane.store.postgres._drivers import _UNNEST_COLUMNS, numbered
from postlane.store.postgres._producing import INSERT_ONE


def test_named_parameters_are_numbered_once_each() -> None:
    assert numbered("SELECT %(a)s, %(b)s, %(a)s") == ("SELECT $1, $2, $1", ("a", "b"))
    assert numbered(Q["held_by_keys"])[0].rstrip().endswith("idempotency_key = ANY($1)")


def test_the_outbox_statements_keep_no_psycopg_placeholder() -> None:
    for sql in (INSERT_ONE, Q["insert_unnest"], Q["held_by_keys"]):
        statement, names = numbered(sql)
        assert "%" not in statement
        assert len(names) == len(set(names))
        assert f"${len(names)}" in statement and f"${len(names) + 1}" not in statement


def test_the_unnest_arrays_bind_in_the_statements_order() -> None:
    assert numbered(Q["insert_unnest"])[1] == _UNNEST_COLUMNS


@given(st.lists(st.sampled_from(["key", "lane", "to", "x_1"]), min_size=1, max_size=8))
def test_each_name_keeps_its_number(names: list[str]) -> None:
    statement, order = numbered(", ".join(f"%({n})s" for n in names))
    assert list(order) == list(dict.fromkeys(names))
    assert statement == ", ".join(f"${order.index(n) + 1}" for n in names)
