"""Schema migrations shipped inside the package: ``sql/<engine>/NNNN_name.sql``, applied in order.

Each engine records applied versions in ``postlane_migrations``; applying is idempotent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

MIGRATIONS_TABLE = "postlane_migrations"


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"


def load(engine: str) -> list[Migration]:
    """The migrations of ``engine`` ("postgres" or "sqlite"), oldest first."""
    folder = resources.files("postlane.store").joinpath("sql", engine)
    found = []
    for entry in folder.iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"{engine} migrations repeat a version number: {versions}")
    return found


def not_migrated() -> Exception:
    """The error for a statement that found no Postlane table: the database was never
    migrated (a driver's "no such table" says nothing about what to do)."""
    from postlane.errors import MigrationRequired

    return MigrationRequired(
        "this database has no Postlane tables; run `postlane --db URL migrate` first"
    )


def ensure_migrated(pending: list[str]) -> None:
    """Refuse to run against a schema that is behind this Postlane."""
    if pending:
        from postlane.errors import MigrationRequired

        raise MigrationRequired(
            f"database schema is not up to date ({', '.join(pending)} pending); "
            "run `postlane migrate`"
        )
