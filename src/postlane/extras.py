"""Optional dependencies: which extra installs which package, and the one guarded import.

A plain ``pip install postlane`` is enough to enqueue, run the CLI, the demo and a worker
on SQLite with the sandbox or an HTTP provider. Everything only some users need is an
extra, and every import of an extra's package goes through :func:`requires` so a missing
one says what to install instead of ``ModuleNotFoundError: No module named 'boto3'``::

    with requires("ses", "the SES provider"):
        import boto3
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from postlane.errors import MissingExtra

EXTRAS: dict[str, frozenset[str]] = {
    "postgres": frozenset({"psycopg", "psycopg_pool", "psycopg_binary"}),
    "redis": frozenset({"redis"}),
    "smtp": frozenset({"aiosmtplib"}),
    "ses": frozenset({"boto3", "botocore"}),
    "server": frozenset({"fastapi", "starlette", "pydantic", "uvicorn", "multipart",
                         "python_multipart", "cryptography"}),
    "sqlalchemy": frozenset({"sqlalchemy"}),
    "django": frozenset({"django"}),
    "psycopg2": frozenset({"psycopg2"}),
    "asyncpg": frozenset({"asyncpg"}),
    "aiosqlite": frozenset({"aiosqlite"}),
    "otel": frozenset({"opentelemetry"}),
    "testing": frozenset({"pytest"}),
}
"""extra -> the top-level modules it installs (the keys of pyproject's optional-dependencies;
tests/unit/test_dependencies.py checks the two agree)."""


@contextmanager
def requires(extra: str, feature: str) -> Iterator[None]:
    """Turn a missing package of ``extra`` imported in the block into :class:`MissingExtra`.

    Only the extra's own packages are translated: a missing module of anything else (a bug,
    a broken install of a core dependency) surfaces as the ``ImportError`` it is.
    """
    modules = EXTRAS[extra]
    try:
        yield
    except ImportError as exc:
        if isinstance(exc, MissingExtra) or (exc.name or "").split(".")[0] not in modules:
            raise
        raise MissingExtra(
            f"{feature} needs `pip install 'postlane[{extra}]'` ({exc.name} is not installed)",
            extra=extra,
        ) from exc
