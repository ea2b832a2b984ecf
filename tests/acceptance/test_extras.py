"""The package is lean and honest: every import is declared, optional ones are extras, and
a missing extra is an error that names it.

The "missing" cases run in a subprocess whose import system refuses the extras' packages,
as a plain ``pip install postlane`` would: nothing is uninstalled from the test venv.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from postlane.errors import MissingExtra
from postlane.extras import EXTRAS, requires

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "postlane"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
OPTIONAL = {module for modules in EXTRAS.values() for module in modules}


def _name(requirement: str) -> str:
    """The normalised distribution name of a requirement string."""
    return re.sub(r"[-_.]+", "-", re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0]).lower()


def _imports(path: Path) -> set[str]:
    """Top-level modules ``path`` imports at run time (not under ``if TYPE_CHECKING``)."""
    tree = ast.parse(path.read_text(), str(path))
    skipped = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
               and ast.unparse(block.test) == "TYPE_CHECKING"
               for child in block.body for node in ast.walk(child)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"postlane"}


def _third_party_imports() -> dict[str, set[str]]:
    by_module: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        for module in _imports(path):
            by_module.setdefault(module, set()).add(str(path.relative_to(ROOT)))
    return by_module


def test_every_third_party_import_is_declared_in_the_core_or_its_extra() -> None:
    """cryptography was imported (SES webhooks) but declared nowhere: POST /v1/webhooks/ses
    answered 500 on a plain install."""
    distributions = importlib.metadata.packages_distributions()
    core = {_name(r) for r in PYPROJECT["dependencies"]}
    extras = {extra: {_name(r) for r in reqs}
              for extra, reqs in PYPROJECT["optional-dependencies"].items()}
    undeclared = []
    for module, users in sorted(_third_party_imports().items()):
        names = {_name(d) for d in distributions.get(module, [module])}
        if names & core:
            assert module not in OPTIONAL, f"{module} is core but listed in postlane.extras"
            continue
        owners = [extra for extra, modules in EXTRAS.items() if module in modules]
        if not owners or not names & extras[owners[0]]:
            undeclared.append(f"{module} ({', '.join(sorted(users))})")
    assert not undeclared, f"imported but not declared in pyproject: {undeclared}"


def test_the_extras_table_names_the_pyproject_extras_and_all_and_test_include_them() -> None:
    declared = PYPROJECT["optional-dependencies"]
    assert set(EXTRAS) == set(declared) - {"all", "test"}
    (everything,) = declared["all"]
    assert set(everything[everything.index("[") + 1:everything.index("]")].split(",")) == \
        set(EXTRAS)
    assert "postlane[all]" in declared["test"]


def test_requires_names_the_extra_and_leaves_other_import_errors_alone() -> None:
    expected = r"the SES provider needs `pip install 'postlane\[ses\]'` \(boto3 is not installed\)"
    with pytest.raises(MissingExtra, match=expected), requires("ses", "the SES provider"):
        raise ModuleNotFoundError("No module named 'boto3'", name="boto3")
    # A missing core package, or a bug in Postlane, is not a missing extra.
    with pytest.raises(ModuleNotFoundError) as caught, requires("ses", "the SES provider"):
        raise ModuleNotFoundError("No module named 'httpx'", name="httpx")
    assert not isinstance(caught.value, MissingExtra)


# -- a plain install, simulated: the extras' packages cannot be imported ------------------
_WITHOUT_EXTRAS = """
import importlib.abc, json, sys
BLOCKED = {blocked!r}

class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, _NotInstalled())
"""


def _core_closure() -> set[str]:
    """The distributions a plain install brings: the core and what they require."""
    found: set[str] = set()
    todo = [Requirement(r) for r in PYPROJECT["dependencies"]]
    while todo:
        requirement = todo.pop()
        name = _name(requirement.name)
        if name in found or (requirement.marker and not requirement.marker.evaluate(
                {"extra": ""})):
            continue
        found.add(name)
        todo.extend(Requirement(r) for r in importlib.metadata.requires(name) or [])
    return found


def _not_in_a_plain_install() -> list[str]:
    """The extras' modules, less those a core dependency brings anyway (typer needs
    pydantic, for one)."""
    core = _core_closure()
    distributions = importlib.metadata.packages_distributions()
    return sorted(module for module in OPTIONAL
                  if not {_name(d) for d in distributions.get(module, [])} & core)


def _run_without_extras(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = _WITHOUT_EXTRAS.format(blocked=_not_in_a_plain_install()) + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, check=False)


def test_enqueue_through_sqlite3_loads_no_optional_package(tmp_path: Path) -> None:
    run = _run_without_extras("""
        import sqlite3, postlane
        from postlane.store import open_store
        import asyncio

        async def migrate():
            async with open_store("sqlite:///app.db") as store:
                await store.migrate()
        asyncio.run(migrate())
        heavy = {"psycopg", "boto3", "fastapi", "redis", "aiosmtplib", "httpx", "jinja2",
                 "rich", "typer", "prometheus_client"}
        before = sorted(heavy & {m.split(".")[0] for m in sys.modules})
        conn = sqlite3.connect("app.db")
        with conn:
            result = postlane.enqueue(conn, postlane.Message(
                key="welcome:1", to="ada@example.com", subject="Hi", text="Hello"))
        after = sorted(heavy & {m.split(".")[0] for m in sys.modules})
        print(json.dumps({"created": result.created, "before": before, "after": after}))
    """, tmp_path)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == {"created": True, "before": [], "after": []}


FEATURES = {
    "postgres": "from postlane.store import open_store; open_store('postgresql://h/db')",
    "redis": "from postlane.limiter import open_limiter; open_limiter('redis://h:6379/0', "
             "rate=1)",
    "smtp": "from postlane.providers.registry import open_provider; "
            "open_provider('smtp://127.0.0.1:25')",
    "ses": "from postlane.providers.registry import open_provider; "
           "open_provider('ses://eu-west-1')",
    "server": "from postlane.api import create_app",
}


@pytest.mark.parametrize("extra", sorted(FEATURES))
def test_a_feature_without_its_extra_says_which_extra_to_install(
        extra: str, tmp_path: Path) -> None:
    run = _run_without_extras(f"""
        from postlane.errors import MissingExtra
        try:
            {FEATURES[extra]}
        except MissingExtra as exc:
            print(json.dumps({{"extra": exc.extra, "message": str(exc)}}))
    """, tmp_path)
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout)
    assert found["extra"] == extra
    assert f"pip install 'postlane[{extra}]'" in found["message"]


def test_the_cli_and_demo_run_without_any_extra(tmp_path: Path) -> None:
    run = _run_without_extras("""
        sys.argv = ["postlane", "demo", "--bulk", "40", "--interactive", "2", "--json"]
        from postlane.cli.main import main
        try:
            main()
        except SystemExit as exc:
            assert not exc.code, exc.code
    """, tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(run.stdout.splitlines()[-1])["ok"] is True


@pytest.mark.parametrize(("args", "extra"), [
    (["worker", "--provider", "ses://eu-west-1"], "ses"),
    (["--db", "postgresql://127.0.0.1/app", "status"], "postgres"),
    (["serve"], "server"),
])
def test_the_cli_names_the_missing_extra_in_one_line(
        args: list[str], extra: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    run = _run_without_extras(f"""
        sys.argv = ["postlane", *{args!r}]
        from postlane.cli.main import main
        main()
    """, tmp_path)
    assert run.returncode == 1
    assert run.stderr.strip().startswith("error: ")
    assert f"needs `pip install 'postlane[{extra}]'`" in run.stderr
    assert "Traceback" not in run.stderr
