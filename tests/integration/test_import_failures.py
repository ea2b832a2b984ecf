"""An import run that stops on its file is recorded as failed, with why, on both engines;
the next run of the same import clears it."""

from __future__ import annotations

from pathlib import Path

import pytest

from postlane.errors import ImportRejected
from postlane.imports import import_csv, import_status
from postlane.store.base import Store
from postlane.templates import add_template


async def test_a_bad_header_is_a_failed_run_until_a_good_one(store: Store,
                                                             tmp_path: Path) -> None:
    await add_template(store, "welcome", subject="Hi {{ name }}", text="Hello")
    path = tmp_path / "users.csv"
    path.write_text("user_id,mail,name\n1,a@example.com,A\n", encoding="utf-8")
    with pytest.raises(ImportRejected, match="email"):
        await import_csv(store, path, template="welcome", import_id="nov")
    status = await import_status(store, "nov")
    assert status is not None and status.failed is not None and "email" in status.failed
    assert status.record is not None and status.record.finished_at is not None
    assert status.as_json()["failed"] == status.failed

    path.write_text("user_id,email,name\n1,a@example.com,A\n", encoding="utf-8")
    report = await import_csv(store, path, template="welcome", import_id="nov")
    assert report.rows_created == 1
    status = await import_status(store, "nov")
    assert status is not None and status.failed is None


async def test_a_failure_is_kept_per_import(store: Store, tmp_path: Path) -> None:
    await add_template(store, "welcome", subject="Hi", text="Hello")
    bad, good = tmp_path / "bad.csv", tmp_path / "good.csv"
    bad.write_text("user_id,email,user_id\n", encoding="utf-8")
    good.write_text("user_id,email\n1,a@example.com\n", encoding="utf-8")
    with pytest.raises(ImportRejected, match="repeats"):
        await import_csv(store, bad, template="welcome", import_id="one")
    await import_csv(store, good, template="welcome", import_id="two")
    one, two = await import_status(store, "one"), await import_status(store, "two")
    assert one is not None and one.failed is not None and "repeats" in one.failed
    assert two is not None and two.failed is None
