"""Attachments, inline parts and calendar invites, end to end (docs/content.md).

Stored with the delivery at enqueue on both engines (the store and the outbox's drivers),
read back by the worker when it builds the message, sent over a real SMTP server on loopback
(aiosmtpd) and SES (moto), and parsed back: every part's bytes equal what was enqueued, on the
first attempt, on a retry and after a dead-letter replay. Limits refuse at enqueue, nothing
stored; pruning a delivery takes its parts.
"""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import timedelta
from email import message_from_bytes
from email.message import EmailMessage
from email.policy import default
from typing import Any

import psycopg
import pytest
from aiosmtpd.smtp import SMTP as SMTPServer
from aiosmtpd.smtp import Envelope
from conftest import msg

import postlane
from postlane.core.attachments import (
    Attachment,
    AttachmentLimits,
    calendar_invite,
    inline,
)
from postlane.core.outcomes import OutcomeClass
from postlane.core.policy import RetryPolicy
from postlane.core.states import State
from postlane.core.validation import Limits
from postlane.dead_letters import replay_one
from postlane.errors import ContentTooLarge, InvalidAttachment
from postlane.providers.sandbox import SandboxProvider
from postlane.providers.smtp import SMTPProvider
from postlane.store import Store
from postlane.worker import Worker, WorkerConfig
from tests.factories import delivery
from tests.integration.test_provider_ses import (  # noqa: F401 (fixtures)
    moto,
    moto_url,
    sent_messages,
    ses,
    ses_url,
)
from tests.integration.test_provider_smtp import Handler, smtp_server

PDF = (b"%PDF-1.4\n1 0 obj<</Type/Catalog>>endobj\n\x00\x01\xfe\xff\r\n\r\n%%EOF\n"
       + bytes(range(256)) * 40)
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(255, -1, -1)) * 3
ICS = ("BEGIN:VCALENDAR\r\nVERSION:2.0\r\nPRODID:-//Postlane//tests//EN\r\nMETHOD:REQUEST\r\n"
       "BEGIN:VEVENT\r\nUID:order-42@example.org\r\nDTSTART:20270115T090000Z\r\n"
       "SUMMARY:Réunion — 会議\r\nEND:VEVENT\r\nEND:VCALENDAR\r\n")
HTML = '<p>Your receipt</p><img src="cid:logo@example.org" alt="logo">'


def parts() -> tuple[Attachment, ...]:
    return (
        Attachment("reçu 42.pdf", PDF, "application/pdf"),
        inline("logo@example.org", PNG, "image/png", "logo.png"),
        calendar_invite(ICS),
        Attachment("rows.csv", b"a,b\r\n1,2\n\x00", "text/csv; charset=utf-8"),
    )


def receipt(key: str = "receipt:42", **overrides: Any) -> postlane.Message:
    fields: dict[str, Any] = {"sender": "shop@example.org", "html": HTML,
                              "attachments": parts(), **overrides}
    return msg(key, **fields)


def assert_parts_arrived(raw: bytes) -> None:
    """What the server received parses back to the same parts, byte for byte."""
    parsed = message_from_bytes(raw, policy=default)
    assert isinstance(parsed, EmailMessage)
    assert parsed.get_content_type() == "multipart/mixed"
    files = {p.get_filename(): p for p in parsed.iter_attachments()}
    assert set(files) == {"reçu 42.pdf", "rows.csv"}
    assert files["reçu 42.pdf"].get_payload(decode=True) == PDF
    assert files["reçu 42.pdf"].get_content_type() == "application/pdf"
    assert files["reçu 42.pdf"].get_content_disposition() == "attachment"
    assert files["rows.csv"].get_payload(decode=True) == b"a,b\r\n1,2\n\x00"
    assert files["rows.csv"].get_content_type() == "text/csv"
    assert files["rows.csv"].get_param("charset") == "utf-8"
    by_type = {p.get_content_type(): p for p in parsed.walk()}
    logo = by_type["image/png"]
    assert logo["Content-ID"] == "<logo@example.org>"
    assert logo.get_content_disposition() == "inline"
    assert logo.get_payload(decode=True) == PNG
    related = by_type["multipart/related"]
    assert [p.get_content_type() for p in related.iter_parts()] == ["text/html", "image/png"]
    invite = by_type["text/calendar"]
    assert invite.get_param("method") == "REQUEST"
    assert invite.get_content().replace("\r\n", "\n") == ICS.replace("\r\n", "\n")
    alternative = by_type["multipart/alternative"]
    assert [p.get_content_type() for p in alternative.iter_parts()] == [
        "text/plain", "multipart/related", "text/calendar"]


# -- the store, both engines ----------------------------------------------------------------
async def test_parts_are_stored_with_the_delivery_and_read_back_by_id(store: Store) -> None:
    with_parts = await store.enqueue(receipt())
    plain = await store.enqueue(msg("plain:1"))
    again = await store.enqueue(receipt())  # a retry of the key writes nothing
    assert again.id == with_parts.id and not again.created
    found = await store.attachments_among([with_parts.id, plain.id])
    assert set(found) == {with_parts.id}
    assert found[with_parts.id] == parts()
    delivery_ = await store.get(with_parts.id)
    assert delivery_ is not None and delivery_.attachments == ()  # never read with the row


async def test_a_batch_stores_each_message_s_parts(store: Store) -> None:
    results = await store.enqueue_many([
        receipt("b:1"), msg("b:2"), receipt("b:3", attachments=parts()[:1]), receipt("b:1")])
    found = await store.attachments_among([r.id for r in results])
    assert found[results[0].id] == parts()
    assert results[1].id not in found
    assert found[results[2].id] == parts()[:1]
    assert results[3].id == results[0].id


@pytest.mark.parametrize("limits, why", [
    (AttachmentLimits(max_attachment_bytes=len(PDF) - 1), "per-attachment limit"),
    (AttachmentLimits(max_total_bytes=len(PDF) + 10), "per-message limit"),
])
async def test_over_a_size_limit_is_refused_at_enqueue_and_nothing_is_stored(
        store: Store, limits: AttachmentLimits, why: str) -> None:
    store.limits = Limits(attachments=limits)
    with pytest.raises(ContentTooLarge, match=why) as raised:
        await store.enqueue(receipt())
    assert raised.value.field == "attachments"
    assert await store.get("receipt:42") is None


async def test_an_inline_part_the_html_never_names_is_refused(store: Store) -> None:
    with pytest.raises(InvalidAttachment, match=r"never names cid:logo@example\.org"):
        await store.enqueue(receipt(html="<p>no image</p>"))
    assert await store.get("receipt:42") is None


async def test_pruning_a_delivery_takes_its_parts(store: Store) -> None:
    result = await store.enqueue(receipt())
    await store.cancel(result.id, "test")
    await asyncio.sleep(0.01)
    assert await store.prune(timedelta(0), timedelta(0)) == 1
    assert await store.attachments_among([result.id]) == {}


# -- the outbox's drivers -------------------------------------------------------------------
def test_the_outbox_stores_parts_in_the_caller_s_sqlite_transaction(sqlite_url: str) -> None:
    asyncio.run(_migrated(sqlite_url))
    path = sqlite_url[len("sqlite:///"):]
    conn = sqlite3.connect(path)
    try:
        result = postlane.enqueue(conn, receipt())
        conn.rollback()  # the caller's rollback takes the parts too
        (count,) = conn.execute("SELECT count(*) FROM postlane_attachments").fetchone()
        assert count == 0
        result = postlane.enqueue(conn, receipt())
        [many] = postlane.enqueue_many(conn, [receipt("m:1")])
        conn.commit()
    finally:
        conn.close()
    assert asyncio.run(_parts(sqlite_url, [result.id, many.id])) == {
        result.id: parts(), many.id: parts()}


@pytest.mark.parametrize("form", ["sync", "sync-many", "async", "async-many"])
def test_the_outbox_stores_parts_through_psycopg(pg_store_url: str, form: str) -> None:
    async def enqueue_async() -> int:
        async with await psycopg.AsyncConnection.connect(pg_store_url) as conn:
            if form == "async":
                result = await postlane.enqueue_async(conn, receipt())
            else:
                [result] = await postlane.enqueue_many_async(conn, [receipt()])
            await conn.commit()
        return result.id

    if form.startswith("sync"):
        with psycopg.connect(pg_store_url) as conn:
            result = (postlane.enqueue(conn, receipt()) if form == "sync"
                      else postlane.enqueue_many(conn, [receipt()])[0])
        id_ = result.id
    else:
        id_ = asyncio.run(enqueue_async())
    assert asyncio.run(_parts(pg_store_url, [id_])) == {id_: parts()}


@pytest.fixture
def pg_store_url(pg_url: str) -> str:
    asyncio.run(_migrated(pg_url))
    return pg_url


async def _migrated(url: str) -> None:
    async with postlane.open_store(url) as store:
        await store.migrate()


async def _parts(url: str, ids: list[int]) -> dict[int, tuple[Attachment, ...]]:
    async with postlane.open_store(url) as store:
        return await store.attachments_among(ids)


# -- the worker over SMTP, both engines -----------------------------------------------------
def _worker(store: Store, port: int) -> Worker:
    smtp = SMTPProvider.from_url(f"smtp://127.0.0.1:{port}")
    return Worker(store, smtp, config=WorkerConfig(
        drain=True, controls_interval_s=0.05, poll_interval_s=0.05,
        retry=RetryPolicy(base_s=0.01, cap_s=0.05)))


async def test_the_smtp_server_receives_the_same_parts_on_every_attempt(store: Store) -> None:
    """A first attempt refused as transient and the retry both carry the same bytes; what
    the server accepted parses back to the enqueued parts."""
    handler = Handler()
    seen: list[bytes] = []

    async def first_refused(server: SMTPServer, envelope: Envelope) -> str | None:
        seen.append(envelope.original_content or b"")
        return "451 4.3.0 try again later" if len(seen) == 1 else None

    handler.on_data = first_refused
    await store.enqueue(receipt())
    async with smtp_server(handler) as server:
        async with asyncio.timeout(60):
            await _worker(store, server.port).run()
    sent = await store.get("receipt:42")
    assert sent is not None and sent.state is State.SENT, sent
    assert len(seen) == 2 and seen[0] == seen[1]
    (envelope,) = handler.received
    assert_parts_arrived(envelope.original_content or b"")


async def test_a_dead_letter_keeps_its_parts_and_a_replay_sends_them(store: Store) -> None:
    handler = Handler()
    refuse = True

    async def refused(server: SMTPServer, envelope: Envelope) -> str | None:
        return "550 5.7.1 not now" if refuse else None

    handler.on_data = refused
    result = await store.enqueue(receipt())
    async with smtp_server(handler) as server:
        async with asyncio.timeout(30):
            await _worker(store, server.port).run()
        entry = await store.dead_letter(result.id)
        assert entry is not None and entry.reason == "permanent"
        assert (await store.attachments_among([result.id]))[result.id] == parts()
        refuse = False
        await replay_one(store, result.id, by="test")
        async with asyncio.timeout(30):
            await _worker(store, server.port).run()
    replayed = await store.get(result.id)
    assert replayed is not None and replayed.state is State.SENT
    (envelope,) = handler.received
    assert_parts_arrived(envelope.original_content or b"")


async def test_the_sandbox_records_names_types_and_sizes(store: Store) -> None:
    sandbox = SandboxProvider()
    await store.enqueue(receipt())
    worker = Worker(store, sandbox, config=WorkerConfig(
        drain=True, controls_interval_s=0.05, poll_interval_s=0.05))
    async with asyncio.timeout(30):
        await worker.run()
    assert sandbox.engine.attachments["receipt:42"] == [
        {"filename": "reçu 42.pdf", "content_type": "application/pdf", "kind": "attachment",
         "size": len(PDF)},
        {"filename": "logo.png", "content_type": "image/png", "kind": "inline",
         "size": len(PNG)},
        {"filename": "invite.ics", "content_type": "text/calendar; method=REQUEST; "
         "charset=UTF-8", "kind": "calendar", "size": len(ICS.encode())},
        {"filename": "rows.csv", "content_type": "text/csv; charset=utf-8",
         "kind": "attachment",
         "size": 10},
    ]


# -- SES (moto): raw MIME -------------------------------------------------------------------
async def test_ses_sends_the_parts_as_raw_mime(moto: str) -> None:
    async with ses(ses_url(moto)) as provider_:
        outcome = await provider_.send(delivery(
            sender="shop@example.org", html=HTML, attachments=parts()))
    assert outcome.kind is OutcomeClass.ACCEPTED, outcome.response
    (sent,) = sent_messages()
    raw = sent.raw_data.encode() if isinstance(sent.raw_data, str) else sent.raw_data
    assert_parts_arrived(raw)
