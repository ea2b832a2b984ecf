"""Duration options: every one on the command line goes through ``parse_duration`` here.

One Typer conversion hook (``parser=``) for all of them, so a value that is not a duration --
typed on the command line, set in the environment or written in the configuration file's
table for the command (where TOML may give a bare number) -- ends as one ``Invalid value for
'--valid-for': not a duration: ...`` error with exit status 2, never a traceback; and the
command receives a ``timedelta``, never a string to parse again.

    lease: Annotated[timedelta, duration_option(help="...")] = "30s"
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import typer

from postlane.core.durations import parse_duration


def duration(value: object) -> timedelta:
    """The ``parser=`` of every duration option (a ``timedelta`` passes through)."""
    if isinstance(value, timedelta):
        return value
    try:
        return parse_duration(str(value))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def positive_duration(value: object) -> timedelta:
    """For what cannot be zero: a lease, a timeout, a grace period."""
    parsed = duration(value)
    if parsed.total_seconds() <= 0:
        raise typer.BadParameter(f"must be longer than zero (got {value!r})")
    return parsed


def lane_durations(value: object) -> str:
    """The ``parser=`` of a per-lane duration option: ``interactive=3s,bulk=20s``, or one
    duration for every lane. Each duration is checked here (exit 2 with the reason); the
    lane names are checked against the configured lanes when the worker applies them."""
    text = str(value).strip()
    for part in text.split(",") if "=" in text else [text]:
        positive_duration(part.partition("=")[2] if "=" in part else part)
    return text


def lane_durations_option(**options: Any) -> Any:
    """``typer.Option`` for a duration per lane (``lane_durations``)."""
    options.setdefault("metavar", "LANE=DURATION,...")
    return typer.Option(parser=lane_durations, **options)


def duration_option(*, positive: bool = False, **options: Any) -> Any:
    """``typer.Option`` for a duration (``90s``, ``15m``, ``2h``, ``1d``; a bare number is
    seconds); ``options`` are ``typer.Option``'s own (help, envvar, ...)."""
    options.setdefault("metavar", "DURATION")
    return typer.Option(parser=positive_duration if positive else duration, **options)


__all__ = ["duration", "duration_option", "lane_durations", "lane_durations_option",
           "positive_duration"]
