"""Opaque keyset cursors for the API's lists.

A cursor names where the previous page ended (the last id it showed), nothing more: the
filters come with every request, so a cursor cannot widen a selection. It is opaque to
clients (base64 of a small JSON object, versioned) so that the key can change.
"""

from __future__ import annotations

import base64
import binascii
import json

from postlane.api.problems import ProblemError

_VERSION = 1


def encode_cursor(last_id: int) -> str:
    raw = json.dumps({"v": _VERSION, "before": last_id}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> int | None:
    """The id the next page starts below; None for the first page. 422 for a cursor this
    server did not make."""
    if cursor is None:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = json.loads(raw)
        before = data["before"]
        valid = data.get("v") == _VERSION and type(before) is int and 1 <= before < 2**63
    except (binascii.Error, ValueError, TypeError, KeyError, AttributeError):
        valid = False
    if not valid:
        raise ProblemError(422, "invalid-request", "Invalid request",
                           "cursor is not one this server returned (use next_cursor as is)",
                           field="cursor")
    return int(before)
