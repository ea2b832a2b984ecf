"""Both engines read a delivery row by position: ``DELIVERY_COLUMNS`` must stay in
``Delivery``'s field order, and the message columns (migration 0007) among them."""

from __future__ import annotations

from dataclasses import fields

from postlane.core.message import Delivery
from postlane.store.base import DELIVERY_COLUMNS, MESSAGE_COLUMNS, qualified_columns

RENAMED = {"idempotency_key": "key", "text_body": "text", "html_body": "html"}


def test_delivery_columns_are_in_the_records_field_order() -> None:
    # Keyword-only fields (attachments, unsubscribe) are not columns: loaded or set apart.
    positional = [f.name for f in fields(Delivery) if not f.kw_only]
    assert [RENAMED.get(c, c) for c in DELIVERY_COLUMNS] == positional


def test_message_columns_are_read_from_the_message_side_of_a_join() -> None:
    assert MESSAGE_COLUMNS - {"producer", "request_hash"} <= set(DELIVERY_COLUMNS)
    select = qualified_columns("c", "m").split(", ")
    assert select[:5] == ["c.id", "m.idempotency_key", "c.lane", "c.channel", "m.recipient"]
    assert {s.split(".")[1] for s in select if s.startswith("m.")} == (
        MESSAGE_COLUMNS - {"producer", "request_hash"})


def test_a_delivery_built_from_a_row_equals_the_dataclass_built_one() -> None:
    from datetime import UTC, datetime

    from postlane.core.message import delivery_of_row
    from postlane.core.states import State

    now = datetime.now(UTC)
    values = [7, "k", "bulk", "email", "a@example.com", None, "s", "t", None, {"X-A": "1"},
              {"u": 1}, None, None, None, State.SENDING, 0, 1, now, None, "w", now, None,
              None, None, None, now, now, None, None]
    for hints in ((), (False, True), (True, None)):
        names = ("may_be_suppressed", "has_attachments")[:len(hints)]
        built = delivery_of_row(values, *hints)
        expected = Delivery(*values, **dict(zip(names, hints, strict=True)))
        # Every field, the ones left out of == included.
        assert [getattr(built, f.name) for f in fields(Delivery)] == [
            getattr(expected, f.name) for f in fields(Delivery)]
