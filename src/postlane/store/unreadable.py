"""Rows that cannot be read back: one bad row must not fail the rows read with it.

Both engines read a delivery row in one go on the hot path. When that fails (a time past
year 9999 written by an older Postlane or by hand, headers that are not a JSON object of
text), the engine reads that row column by column and hands over an
``UnreadableDelivery``: the columns that could be read, placeholders for the others, and
each error verbatim. A claim then returns its good rows as usual and the worker
dead-letters the bad one (``handler_error``) instead of failing, and re-claiming, the batch
forever; a read shows the row instead of failing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields as dataclass_fields
from datetime import UTC, datetime
from typing import Any

from postlane.core.message import Delivery, UnreadableDelivery
from postlane.core.states import State
from postlane.store.base import DELIVERY_COLUMNS

# In DELIVERY_COLUMNS' order; the keyword-only fields (attachments: never a column) apart.
_FIELDS = [f.name for f in dataclass_fields(Delivery) if not f.kw_only]
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_PLACEHOLDERS: dict[str, Any] = {
    "run_at": EPOCH, "created_at": EPOCH, "updated_at": EPOCH, "headers": {}, "metadata": {},
    "state": State.SENDING, "attempts": 0, "claims": 0, "idempotency_key": "", "lane": "",
    "channel": "", "recipient": "", "subject": "",
}
"""For a column that could not be read; a column not named here reads as None."""


def check_headers(headers: object) -> None:
    """Raise ``ValueError`` unless ``headers`` is an object of text, as MIME building and
    the API's models take for granted."""
    if type(headers) is not dict:
        raise ValueError(f"not a JSON object: {headers!r:.100}")
    for name, value in headers.items():
        if type(value) is not str:
            raise ValueError(f"header {name!r} is not text: {value!r:.100}")


def check_metadata(metadata: object) -> None:
    if type(metadata) is not dict:
        raise ValueError(f"not a JSON object: {metadata!r:.100}")


def describe(exc: BaseException) -> str:
    """An error as it is kept: its type and its message, verbatim."""
    return f"{type(exc).__name__}: {exc}"


_CHECKS: dict[str, Callable[[Any], None]] = {"headers": check_headers,
                                             "metadata": check_metadata}


def read_columns(
    values: Mapping[str, Any], decoders: Mapping[str, Callable[[Any], Any]],
    error: BaseException,
) -> UnreadableDelivery:
    """The row's columns (by name, as in ``DELIVERY_COLUMNS``) read one at a time, after
    reading the whole row failed with ``error``: each column ``decoders`` names goes
    through its decoder, and a value that is an exception is the engine's failure to fetch
    that column. Each column that fails is named, with its error, in ``unreadable`` and
    holds its placeholder."""
    fields: list[Any] = []
    errors: list[str] = []
    for column in DELIVERY_COLUMNS:
        value = values.get(column)
        decode = decoders.get(column)
        check = _CHECKS.get(column)
        try:
            if isinstance(value, BaseException):
                raise value
            if decode is not None:
                value = decode(value)
            if check is not None:
                check(value)
            fields.append(value)
        except Exception as exc:
            errors.append(f"{column}: {describe(exc)}")
            fields.append(_PLACEHOLDERS.get(column))
    return UnreadableDelivery(**dict(zip(_FIELDS, fields, strict=True)),
                              unreadable="; ".join(errors) or describe(error))
