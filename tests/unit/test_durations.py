from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from postlane.cli.durations import duration, lane_durations, positive_duration
from postlane.cli.main import app
from postlane.core.durations import parse_duration


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", timedelta(seconds=90)),
        ("15m", timedelta(minutes=15)),
        ("2h", timedelta(hours=2)),
        ("1d", timedelta(days=1)),
        ("250ms", timedelta(milliseconds=250)),
        ("30", timedelta(seconds=30)),  # a bare number is seconds
        ("1.5h", timedelta(minutes=90)),
        ("0", timedelta(0)),
        ("  15 m  ", timedelta(minutes=15)),
    ],
)
def test_parse_duration(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


def test_ms_is_not_minutes() -> None:
    # "ms" must win over "m" + garbage: 500ms is half a second, not 500 minutes.
    assert parse_duration("500ms") == timedelta(seconds=0.5)


@pytest.mark.parametrize(
    "text", ["", "  ", "m", "15x", "-5m", "5 minutes", "1h30m", "1e3", "15M", ".5s", "h2"]
)
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration") as info:
        parse_duration(text)
    assert repr(text) in str(info.value)  # the message names the bad text


def test_a_duration_past_what_timedelta_holds_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="too long"):
        parse_duration("99999999999d")


# -- every duration option of the CLI goes through the one parser ------------------------
def _commands() -> list[tuple[list[str], Any]]:
    """Every leaf command of ``postlane`` with its path of names (Typer's command tree)."""
    found: list[tuple[list[str], Any]] = []

    def walk(path: list[str], command: Any) -> None:
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                walk([*path, name], sub)
        else:
            found.append((path, command))

    walk([], typer.main.get_command(app))
    return found


def _is_option(param: Any) -> bool:
    return bool(param.param_type_name == "option")


def _duration_options() -> list[tuple[list[str], Any, Any]]:
    return [(path, command, param) for path, command in _commands()
            for param in command.params
            if _is_option(param) and param.type_descriptor.parameter_info.parser
            in (duration, positive_duration, lane_durations)]


def _required(command: Any, skip: Any) -> list[str]:
    """Placeholder values for what the command requires, so that parsing reaches ``skip``."""
    args: list[str] = []
    for param in command.params:
        if param is skip or not param.required:
            continue
        value = "1" if param.type_descriptor.annotation is int else "x"
        args += [param.opts[0], value] if _is_option(param) else [value]
    return args


def _unboxed(output: str) -> str:
    """The error text without rich's box and line wrapping."""
    return " ".join(output.replace("│", " ").split())


DURATION_WORDS = ("timeout", "interval", "since", "older_than", "valid_for", "expires",
                  "delay", "window", "lease", "grace", "latency", "retry_after")


def test_every_option_that_names_a_duration_uses_the_parser() -> None:
    options = {(tuple(path), param.name) for path, _, param in _duration_options()}
    assert (("worker",), "drain_timeout") in options
    assert (("dlq", "replay"), "valid_for") in options
    for path, command in _commands():
        for param in command.params:
            name = param.name or ""
            if (_is_option(param) and any(w in name for w in DURATION_WORDS)
                    and not name.endswith("_rate")):  # --timeout-rate is a share
                assert (tuple(path), param.name) in options, (path, param.name)


@pytest.mark.parametrize("garbage", ["garbage", "-5m", "1h30m"])
def test_no_duration_option_prints_a_traceback_for_garbage(
    garbage: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # no stray postlane.toml
    runner = CliRunner()
    for path, command, param in _duration_options():
        argv = [*path, *_required(command, param), param.opts[0], garbage]
        result = runner.invoke(app, ["--db", f"sqlite:///{tmp_path}/none.db", *argv])
        output = _unboxed(result.output)
        assert result.exit_code == 2, (argv, output)
        assert "Traceback" not in output and not isinstance(result.exception, ValueError)
        assert f"Invalid value for '{param.opts[0]}'" in output, (argv, output)
        assert "not a duration" in output, (argv, output)


def test_a_duration_in_the_configuration_file_goes_through_the_parser(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("postlane.toml").write_text('[worker]\nlease = "soon"\n')
    result = CliRunner().invoke(app, ["worker", "--provider", "noop://"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "not a duration: 'soon'" in _unboxed(result.output)


def test_zero_is_refused_where_a_duration_must_be_positive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["worker", "--provider", "noop://", "--lease", "0s"])
    assert result.exit_code == 2 and "must be longer than zero" in _unboxed(result.output)


@pytest.mark.parametrize(("value", "expected"), [
    ("15m", timedelta(minutes=15)), (30, timedelta(seconds=30)), (1.5, timedelta(seconds=1.5)),
    (timedelta(hours=2), timedelta(hours=2)),
])
def test_the_cli_parser_takes_what_toml_gives(value: object, expected: timedelta) -> None:
    assert duration(value) == expected
