"""``postlane worker``'s per-lane durations: what cannot apply to the configured lanes is a
clean usage error (exit 2, the reason), before anything opens."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from postlane.cli.main import app


@pytest.mark.parametrize(("argv", "reason"), [
    (["--retry-base", "digest=1s"], "'digest=1s' does not name a configured lane"),
    (["--lanes", "interactive=50,bulk=25,digest=25", "--retry-base", "reports=1s"],
     "does not name a configured lane (interactive, bulk, digest)"),
    (["--retry-cap", "interactive=100ms"], "retry cap 0.1s is below its retry base 0.25s"),
    (["--attempt-timeout", "interactive=0s"], "must be longer than zero"),
    (["--attempt-timeout", "interactive=3s,bulk=soon"], "not a duration: 'soon'"),
])
def test_a_lane_duration_that_cannot_apply_is_a_usage_error(
    argv: list[str], reason: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # no stray postlane.toml
    result = CliRunner().invoke(app, ["--db", f"sqlite:///{tmp_path}/none.db", "worker",
                                      "--provider", "noop://", *argv])
    output = " ".join(result.output.replace("│", " ").split())
    assert result.exit_code == 2, output
    assert reason in output
    assert not (tmp_path / "none.db").exists()  # refused before anything opened
