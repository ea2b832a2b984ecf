"""Human rates (``200/s``, ``12000/m``) and daily quotas (``50000/d``) as the worker,
``postlane check`` and the config read them.

Below both the command line and the library (``check.py``), so neither imports the other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from postlane.errors import ConfigurationError

DEFAULT_HEADROOM = 0.02
"""Fraction of a rate ceiling kept free for jitter at the provider (``--headroom``): the
worker, its CLI and ``postlane check`` read it here."""

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:/\s*(s|sec|m|min|h|d|day))?\s*$")
_PER = {None: 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0,
        "d": 86400.0, "day": 86400.0}
_DAILY = ("d", "day")


def parse_rate(text: str) -> float:
    """``200/s``, ``12000/m``, ``200`` -> sends per second."""
    match = _RATE.match(text)
    if not match or float(match[1]) <= 0:
        raise ConfigurationError(f"not a rate: {text!r} (expected e.g. 200/s or 12000/m)")
    return float(match[1]) / _PER[match[2]]


@dataclass(frozen=True, slots=True)
class Limits:
    """What ``--rate`` asks for: a per-second ceiling, a daily quota, or the provider's own."""

    per_second: float | None = None
    per_day: int | None = None
    auto: bool = False


def parse_limits(text: str) -> Limits:
    """``200/s``, ``50000/d``, ``14/s,50000/d`` or ``auto`` -> the limits to enforce.

    A ``/d`` (``/day``) part is a quota over any 24 hours, not a rate of quota/86400 per
    second: it may be used in bursts (see postlane.limiter.base). At most one of each kind.
    """
    parts = [part.strip() for part in text.split(",")]
    if [part.lower() for part in parts] == ["auto"]:
        return Limits(auto=True)
    per_second: float | None = None
    per_day: int | None = None
    for part in parts:
        match = _RATE.match(part)
        if part.lower() == "auto":
            raise ConfigurationError(f"--rate {text!r}: auto reads every limit from the "
                                     "provider; give it alone")
        rate = parse_rate(part)
        if match is not None and match[2] in _DAILY:
            if per_day is not None or not float(match[1]).is_integer():
                raise ConfigurationError(f"--rate {text!r}: one daily quota, a whole number "
                                         "of sends (e.g. 50000/d)")
            per_day = int(float(match[1]))
        elif per_second is not None:
            raise ConfigurationError(f"--rate {text!r}: one per-second ceiling and at most "
                                     "one daily quota (e.g. 14/s,50000/d)")
        else:
            per_second = rate
    if per_day is not None and per_day < 2:
        raise ConfigurationError(f"--rate {text!r}: a daily quota needs at least 2 sends")
    return Limits(per_second, per_day)


__all__ = ["Limits", "parse_limits", "parse_rate"]
