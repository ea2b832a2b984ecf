"""``postlane demo``, the README's first command: it succeeds, its live view has no ERROR
lines for the dead letters it makes on purpose (its summary counts them), and the commands
it suggests next run, as printed, in the shell that ran it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.acceptance.conftest import POSTLANE_BIN


def test_the_demo_succeeds_quietly_and_its_next_commands_run(tmp_path: Path) -> None:
    # As after the README's first command: a relative path to the venv's postlane, which
    # is not on PATH.
    venv = POSTLANE_BIN.parent.parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("POSTLANE_")}
    env["PATH"] = "/usr/bin:/bin"
    env["TMPDIR"] = str(tmp_path)
    run = subprocess.run(
        [f"{venv.name}/bin/postlane", "demo", "--bulk", "300", "--interactive", "6"],
        cwd=venv.parent, env=env, capture_output=True, text=True, timeout=120, check=False)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert "ALERT" not in output and "ERROR" not in output, output
    assert "dead letters: 7 (permanent=7)" in output  # 5 digests, 2 resets to bounce-*
    # A digest's one-click unsubscribe pair, as the sandbox received it (docs/deliverability.md)
    assert "List-Unsubscribe: <http://127.0.0.1:8080/unsubscribe/" in output
    assert "List-Unsubscribe-Post: List-Unsubscribe=One-Click" in output

    suggested = output.split("next, try:\n", 1)[1].strip().splitlines()
    assert len(suggested) == 3
    for line in suggested:
        assert line.strip().startswith(f"{venv.name}/bin/postlane --db sqlite:///"), line
    ran = [subprocess.run(["bash", "-c", line.strip()], cwd=venv.parent, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
           for line in suggested]
    for line, result in zip(suggested, ran, strict=True):
        assert result.returncode == 0, f"{line}\n{result.stdout}{result.stderr}"
    status, timeline, dead_letters = (r.stdout for r in ran)
    assert "dead letters: permanent=7" in status
    assert "enqueued" in timeline
    assert "dead letters (7)" in dead_letters
