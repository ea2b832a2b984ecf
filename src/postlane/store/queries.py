"""Each engine's queries, as named entries in one ``.sql`` file per engine
(``sql/<engine>/queries.sql``), so a reader finds every statement an engine runs in one place
and compares the dialects side by side.

An entry starts with a line ``-- name: <name>`` and runs to the next one. Where a dialect must
differ from the other engine's, a comment in the entry says why. Fragments shared by the
state machine (``store.machine``) are written ``{{fragment}}`` and filled in at load time, so
the terminal states, for one, are spelled once, in ``core.states``; an unknown fragment or a
repeated name is an error when the engine loads, not when the query first runs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from importlib import resources

from postlane.store import machine

_NAME = re.compile(r"^-- name: ([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
_FRAGMENT = re.compile(r"\{\{([a-z_]+)\}\}")


def parse(text: str, fragments: Mapping[str, str], *, source: str = "queries.sql"
          ) -> dict[str, str]:
    """The entries of one queries file, by name, with their fragments filled in."""
    parts = _NAME.split(text)
    if parts[0].strip() and not all(
        line.startswith("--") or not line.strip() for line in parts[0].splitlines()
    ):
        raise ValueError(f"{source}: text before the first `-- name:` line")
    found: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in found:
            raise ValueError(f"{source}: query {name!r} is defined twice")

        def fill(match: re.Match[str], name: str = name) -> str:
            try:
                return fragments[match[1]]
            except KeyError:
                raise ValueError(
                    f"{source}: query {name!r} uses unknown fragment {{{{{match[1]}}}}}"
                ) from None

        found[name] = _FRAGMENT.sub(fill, body).strip() + "\n"
    return found


@cache
def load(engine: str) -> dict[str, str]:
    """The named queries of ``engine`` ("postgres" or "sqlite")."""
    text = resources.files("postlane.store").joinpath("sql", engine, "queries.sql")
    return parse(text.read_text("utf-8"), machine.sql_fragments(engine),
                 source=f"sql/{engine}/queries.sql")
