"""Human rates (``200/s``, ``12000/m``) as the worker, ``postlane check`` and the config read them.

Below both the command line and the library (``check.py``), so neither imports the other.
"""

from __future__ import annotations

import re

from postlane.errors import ConfigurationError

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:/\s*(s|sec|m|min|h))?\s*$")
_PER = {None: 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_rate(text: str) -> float:
    """``200/s``, ``12000/m``, ``200`` -> sends per second."""
    match = _RATE.match(text)
    if not match or float(match[1]) <= 0:
        raise ConfigurationError(f"not a rate: {text!r} (expected e.g. 200/s or 12000/m)")
    return float(match[1]) / _PER[match[2]]


__all__ = ["parse_rate"]
