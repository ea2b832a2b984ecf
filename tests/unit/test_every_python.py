"""The list of timing and failure tests that ``scripts/check`` runs on every Python."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import EVERY_PYTHON

TESTS = Path(__file__).resolve().parents[1]


def test_every_listed_file_exists() -> None:
    """A renamed file would silently drop out of the 3.12 and 3.13 runs."""
    assert [name for name in EVERY_PYTHON if not (TESTS / name).is_file()] == []


def test_the_list_covers_the_deadline_and_the_misbehaving_servers() -> None:
    assert {"unit/test_attempt.py", "integration/test_worker_phases.py"} <= set(EVERY_PYTHON)
