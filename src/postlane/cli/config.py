"""``postlane.toml``: defaults for the global options and a table per command.

Every key is checked against the command tree before anything runs: a typo such as
``rat = "200/s"`` in ``[worker]`` would otherwise be ignored, and the worker would run with
no ceiling at all. An unknown key is refused, naming it and the closest known one.
"""

from __future__ import annotations

import difflib
import tomllib
from pathlib import Path
from typing import Any

import typer

_NOT_IN_FILE = frozenset({"config", "help"})
"""Root options that make no sense inside the file they would name."""


def load_config(path: Path | None, root: Any = None) -> dict[str, Any]:
    """Read the TOML configuration; command-line options and the environment win over it.

    With ``root`` (the Click command tree; Typer vendors its own Click, hence ``Any``),
    keys that name no option or command are refused.
    """
    if path is None:
        path = Path("postlane.toml")
        if not path.exists():
            return {}
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise typer.BadParameter(f"configuration file {path} does not exist",
                                 param_hint="--config") from None
    except tomllib.TOMLDecodeError as exc:
        raise typer.BadParameter(f"{path}: {exc}", param_hint="--config") from None
    settings = _normalise(data)
    if root is not None:
        problem = unknown_key(settings, root)
        if problem:
            raise typer.BadParameter(f"{path}: {problem}", param_hint="--config")
    return settings


def _normalise(data: dict[str, Any]) -> dict[str, Any]:
    """Option names may be written as in the CLI (batch-size) or as Python (batch_size)."""
    return {key.replace("-", "_") if not isinstance(value, dict) else key:
            _normalise(value) if isinstance(value, dict) else value
            for key, value in data.items()}


def unknown_key(settings: dict[str, Any], command: Any,
                table: tuple[str, ...] = ()) -> str | None:
    """The first key of ``settings`` that names neither an option of ``command`` nor one of
    its subcommands (as a table), said with the closest known name; None when all are known.
    """
    options = {p.name for p in command.params
               if p.param_type_name == "option" and p.name and p.name not in _NOT_IN_FILE}
    subcommands: dict[str, Any] = getattr(command, "commands", {})
    where = f"[{'.'.join(table)}]" if table else "the top level"
    for key, value in settings.items():
        if isinstance(value, dict) and key in subcommands:
            problem = unknown_key(value, subcommands[key], (*table, key))
            if problem:
                return problem
            continue
        if key in options and not isinstance(value, dict):
            continue
        if key in options:
            return f"{key!r} in {where} is an option: give it a value, not a table"
        kind = "table" if isinstance(value, dict) else "key"
        known = sorted(set(subcommands) if kind == "table" else options) \
            or sorted(options | set(subcommands))
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.5)
        hint = (f"did you mean {close[0]!r}?" if close
                else f"known: {', '.join(known) or 'none'}")
        return f"unknown {kind} {key!r} in {where} ({hint})"
    return None


__all__ = ["load_config", "unknown_key"]
