"""The command line's own shape: help that says everything, a configuration file that refuses
what it does not know, and a library that never imports its shell."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from postlane.cli.config import unknown_key
from postlane.cli.main import app

SRC = Path(__file__).resolve().parents[2] / "src" / "postlane"
runner = CliRunner()


def walk(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from walk(sub, (*path, name))


COMMANDS = list(walk(typer.main.get_command(app)))


def squash(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=lambda p: " ".join(p) or "root")
def test_every_bracketed_part_of_a_help_text_reaches_the_reader(path: tuple[str, ...]) -> None:
    """Rich used to read ``[default: interactive=70,bulk=30]`` as markup and drop it."""
    command = dict(COMMANDS)[path]
    result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    shown = squash(result.output)
    texts = [command.help or ""] + [getattr(p, "help", None) or "" for p in command.params]
    bracketed = [part for text in texts for part in re.findall(r"\[[^\]]*\]", squash(text))]
    for part in bracketed:
        assert part in shown, f"{part!r} is missing from `postlane {' '.join(path)} --help`"
    if path == ("worker",):
        assert bracketed and "[default: interactive=70,bulk=30]" in shown


OTHER_SHELLS = ("django/management/commands",)
"""Shells over the CLI itself (``manage.py postlane_worker`` runs ``postlane worker``)."""


def test_the_library_never_imports_the_command_line() -> None:
    """Shells import down, never across: nothing outside cli/ reaches into it."""
    offenders = []
    for file in SRC.rglob("*.py"):
        where = file.relative_to(SRC).as_posix()
        if where.startswith("cli/") or where.startswith(OTHER_SHELLS):
            continue
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{file.relative_to(SRC)}: {n}" for n in names
                          if n == "postlane.cli" or n.startswith("postlane.cli.")]
    assert offenders == []


def test_commands_import_the_shell_helpers_not_the_module_that_registers_them() -> None:
    offenders = []
    for file in (SRC / "cli").glob("*.py"):
        if file.name == "main.py":
            continue
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "postlane.cli.main":
                offenders.append(file.name)
    assert offenders == []


ROOT = typer.main.get_command(app)


@pytest.mark.parametrize(("settings", "problem"), [
    ({"worker": {"rat": "200/s"}}, "unknown key 'rat' in [worker] (did you mean 'rate'?)"),
    ({"wrker": {"rate": "200/s"}}, "unknown table 'wrker' in the top level (did you mean "
                                   "'worker'?)"),
    ({"dlq": {"list": {"limt": 3}}}, "unknown key 'limt' in [dlq.list] (did you mean "
                                     "'limit'?)"),
    ({"db_url": "sqlite:///x.db"}, "unknown key 'db_url' in the top level (did you mean "
                                   "'db'?)"),
    ({"worker": {"rate": {"x": 1}}}, "'rate' in [worker] is an option: give it a value"),
    ({"config": "other.toml"}, "unknown key 'config' in the top level"),
])
def test_an_unknown_key_is_named_with_its_closest_match(settings: dict[str, Any],
                                                        problem: str) -> None:
    found = unknown_key(settings, ROOT)
    assert found is not None and found.startswith(problem)


def test_known_keys_pass() -> None:
    settings = {"db": "sqlite:///x.db", "log_format": "json",
                "worker": {"rate": "200/s", "batch_size": 10, "lanes": "interactive=70,bulk=30"},
                "dlq": {"list": {"limit": 3}}, "check": {"skip": ["provider"]}}
    assert unknown_key(settings, ROOT) is None


def test_a_typo_in_the_file_stops_the_command_before_it_runs(tmp_path: Path) -> None:
    config = tmp_path / "postlane.toml"
    config.write_text('db = "sqlite:///never.db"\n[worker]\nrat = "200/s"\n', encoding="utf-8")
    result = runner.invoke(app, ["--config", str(config), "status"])
    assert result.exit_code == 2
    assert "unknown key 'rat' in [worker] (did you mean 'rate'?)" in squash(result.output)
    assert not (tmp_path / "never.db").exists()


def test_option_names_may_be_written_as_on_the_command_line(tmp_path: Path) -> None:
    config = tmp_path / "postlane.toml"
    config.write_text('log-format = "json"\n[worker]\nbatch-size = 5\nattempt-timeout = "3s"\n',
                      encoding="utf-8")
    result = runner.invoke(app, ["--config", str(config), "worker", "--help"])
    assert result.exit_code == 0, result.output


def test_an_unknown_log_format_is_refused() -> None:
    result = runner.invoke(app, ["--log-format", "xml", "status"])
    assert result.exit_code == 2 and "'xml' is not one of text, json" in squash(result.output)


def test_ids_read_as_words_not_a_python_list() -> None:
    from postlane.cli.shell import ids

    assert ids([]) == "none"
    assert ids([4, 5, 9]) == "4, 5, 9"
    assert ids(list(range(1, 26))) == ", ".join(map(str, range(1, 21))) + " and 5 more"
