"""The suite's own layout: tests/unit and tests/integration are not packages (rootdir imports),
so two test modules there with one basename collide when the whole suite is collected,
although each runs alone."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_plain_test_modules_share_a_name() -> None:
    plain = [p for p in TESTS.rglob("test_*.py") if not (p.parent / "__init__.py").exists()]
    names = Counter(p.name for p in plain)
    assert [name for name, n in names.items() if n > 1] == []
