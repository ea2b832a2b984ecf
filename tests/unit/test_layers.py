"""The layers import down, never across, read from the source's AST.

- Database drivers (psycopg, psycopg_pool, sqlite3) are the store's business: above it,
  errors arrive as ``postlane.errors.StoreError`` and its kin (see ``postlane.store.seam``).
- The store knows no provider and no provider knows the store.
- ``postlane.core`` is pure policy and values: it imports only itself and the errors.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "postlane"
DRIVERS = ("psycopg", "psycopg_pool", "sqlite3")

DRIVER_EXCEPTIONS = {
    "providers/testing.py":
        "RecordFileProvider keeps the provider's side of a test (what was sent, once per "
        "key) in a SQLite file of its own that several worker processes share; it is not "
        "Postlane's database and no store operation reads it",
}
"""Modules outside ``store/`` allowed to import a driver, and why."""


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) for every import in ``path``, at any depth (a function's lazy
    import counts), relative imports resolved against the package."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            yield node.lineno, module
            for alias in node.names:  # ``from postlane import store``
                yield node.lineno, f"{module}.{alias.name}"


def _modules(under: str = "") -> list[Path]:
    return sorted((PACKAGE / under).rglob("*.py"))


def _name(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _is(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_only_the_store_imports_a_database_driver() -> None:
    offenders = [
        f"{_name(path)}:{line} imports {module}"
        for path in _modules() if not _name(path).startswith("store/")
        and _name(path) not in DRIVER_EXCEPTIONS
        for line, module in _imports(path) if _is(module, *DRIVERS)
    ]
    assert offenders == [], "translate driver errors in the store instead (store.seam)"


def test_the_documented_driver_exceptions_still_need_to_be() -> None:
    """An exception whose module no longer imports a driver is removed from the list."""
    for name in DRIVER_EXCEPTIONS:
        assert any(_is(module, *DRIVERS) for _, module in _imports(PACKAGE / name)), name


@pytest.mark.parametrize("under, forbidden", [
    ("providers", ("postlane.store",)),
    ("store", ("postlane.providers",)),
    ("core", ("postlane.store", "postlane.worker", "postlane.api", "postlane.cli",
              "postlane.providers", "postlane.dashboard", "postlane.webhooks",
              "postlane.limiter", "postlane.django")),
])
def test_layers_import_down_never_across(under: str, forbidden: tuple[str, ...]) -> None:
    offenders = [f"{_name(path)}:{line} imports {module}"
                 for path in _modules(under)
                 for line, module in _imports(path) if _is(module, *forbidden)]
    assert offenders == []


def test_core_imports_only_core_and_the_errors() -> None:
    offenders = [f"{_name(path)}:{line} imports {module}"
                 for path in _modules("core")
                 for line, module in _imports(path)
                 if _is(module, "postlane")
                 and not _is(module, "postlane.core", "postlane.errors")]
    assert offenders == []


def test_the_walk_sees_what_it_must() -> None:
    """The checks above are only as good as the import walk: it finds a lazy import inside
    a function, and the store's own driver imports."""
    store_imports = {m for p in _modules("store") for _, m in _imports(p)}
    assert {"psycopg", "sqlite3", "psycopg_pool"} <= store_imports
    lazy = {m for _, m in _imports(PACKAGE / "store" / "probe.py")}
    assert "psycopg" in lazy  # imported inside probe_postgres, not at the top


@pytest.mark.parametrize("under", ["worker", "webhooks", "operations.py", "dead_letters.py",
                                   "metrics.py", "status.py", "templates.py"])
def test_consumers_name_their_roles_not_the_whole_store(under: str) -> None:
    """The worker takes ``WorkerStore`` (and ``FleetStore``), the webhook receiver
    ``ProviderEventStore``...: none of them imports the whole ``Store``."""
    paths = [PACKAGE / under] if under.endswith(".py") else _modules(under)
    offenders = [f"{_name(path)}:{line}" for path in paths
                 for line, module in _imports(path)
                 if module in ("postlane.store.Store", "postlane.store.base.Store")]
    assert offenders == []
