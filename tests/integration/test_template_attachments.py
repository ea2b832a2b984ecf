"""Templates declare attachments, rendered per message from the same variables (both
engines): a static file read once, a callback producing each row's bytes. ``enqueue_template``
and the bulk import carry them; a callback failing on one row skips that row, naming it."""

from __future__ import annotations

import csv
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from postlane.errors import TemplateError
from postlane.imports import import_csv
from postlane.store import Store
from postlane.templates import (
    add_template,
    declare_attachments,
    enqueue_template,
    rendered,
    static_file,
)

LOGO = b"\x89PNG\r\n\x1a\n-logo-"


def receipt_pdf(variables: Mapping[str, Any]) -> bytes:
    if variables["name"] == "Boom":
        raise ValueError("no such order")
    return f"%PDF-1.4 receipt for {variables['name']}".encode()


@pytest.fixture
def declared(tmp_path: Path) -> Iterator[None]:
    logo = tmp_path / "logo.png"
    logo.write_bytes(LOGO)
    declare_attachments("receipt", static_file(logo, content_id="logo"),
                        rendered("receipt-{{ user_id }}.pdf", receipt_pdf, "application/pdf"))
    yield
    declare_attachments("receipt")


@pytest.fixture
async def tstore(store: Store, declared: None) -> AsyncIterator[Store]:
    await add_template(store, "receipt", subject="Your receipt, {{ name }}",
                       text="Thanks {{ name }}", html='<img src="cid:logo"> {{ name }}')
    yield store


async def parts_of(store: Store, key: str) -> list[tuple[str, str, str, bytes]]:
    found = await store.get(key)
    assert found is not None
    parts = (await store.attachments_among([found.id])).get(found.id, ())
    return [(p.filename, p.content_type, p.kind, p.content) for p in parts]


async def test_enqueue_template_renders_the_declared_parts(tstore: Store) -> None:
    await enqueue_template(tstore, "receipt", {"name": "Ada", "user_id": "7"},
                           key="receipt:7", to="ada@example.com")
    assert await parts_of(tstore, "receipt:7") == [
        ("logo.png", "image/png", "inline", LOGO),
        ("receipt-7.pdf", "application/pdf", "attachment", b"%PDF-1.4 receipt for Ada")]


async def test_a_failing_callback_is_a_template_error_and_nothing_is_written(
        tstore: Store) -> None:
    with pytest.raises(TemplateError, match=r"'receipt-\{\{ user_id \}\}.pdf': ValueError: "
                                            "no such order"):
        await enqueue_template(tstore, "receipt", {"name": "Boom", "user_id": "8"},
                               key="receipt:8", to="b@example.com")
    assert await tstore.get("receipt:8") is None


async def test_the_bulk_import_carries_each_row_s_parts(tstore: Store, tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["user_id", "email", "name"])
        writer.writerows([["1", "u1@example.com", "Ann"], ["2", "u2@example.com", "Boom"],
                          ["3", "u3@example.com", "Cy"]])
    report = await import_csv(tstore, path, template="receipt", import_id="imp-1")
    assert report.rows_created == 2 and report.rows_skipped == 1
    assert "no such order" in report.problems[0].reason
    for user, name in (("1", "Ann"), ("3", "Cy")):
        parts = await parts_of(tstore, f"receipt:{user}:imp-1")
        assert parts[1] == (f"receipt-{user}.pdf", "application/pdf", "attachment",
                            f"%PDF-1.4 receipt for {name}".encode())
        assert parts[0][3] == LOGO
