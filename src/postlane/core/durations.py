"""Human durations (``15m``, ``2h``, ``90s``, ``1d``) as used on the command line."""

from __future__ import annotations

import re
from datetime import timedelta

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")


def parse_duration(text: str) -> timedelta:
    """Parse ``15m`` / ``2h`` / ``30`` (seconds). Raises ``ValueError`` with the bad text."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"not a duration: {text!r} (expected e.g. 90s, 15m, 2h, 1d)")
    value, unit = match.groups()
    try:
        return timedelta(seconds=float(value) * _UNITS[unit or "s"])
    except OverflowError:  # past timedelta's 999,999,999 days
        raise ValueError(f"duration too long: {text!r}") from None
