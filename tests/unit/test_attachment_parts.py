"""Attachments without sockets: what enqueue refuses, and each JSON adapter's documented form
(Postmark ``Attachments``, Resend ``attachments``, the generic adapter's), decoded back to the
same bytes. MIME over SMTP and SES is in tests/integration/test_attachments.py. Also: a
``Reply-To`` goes with its addresses converted like the message's own."""

from __future__ import annotations

import base64
import json
from email import message_from_bytes
from email.policy import default
from typing import Any

import httpx
import pytest

from postlane.core.attachments import (
    Attachment,
    AttachmentLimits,
    calendar_invite,
    check_attachments,
    inline,
)
from postlane.core.message import Message
from postlane.core.validation import Limits, validate
from postlane.errors import ContentTooLarge, InvalidAddress, InvalidAttachment
from postlane.providers.http import JsonHttpProvider, generic_payload
from postlane.providers.mime import build_email, wire_reply_to
from postlane.providers.postmark import PostmarkProvider, postmark_payload
from postlane.providers.resend import ResendProvider, resend_payload
from postlane.providers.sandbox_server import received_parts
from tests.factories import delivery

PDF = b"%PDF-1.4\n\x00\xff\xfe" * 100
PNG = b"\x89PNG\r\n\x1a\n\x00"
ICS = "BEGIN:VCALENDAR\r\nMETHOD:CANCEL\r\nBEGIN:VEVENT\r\nUID:1\r\nEND:VEVENT\r\nEND:VCALENDAR\r\n"
HTML = '<img src="cid:logo">'
PARTS = (Attachment("receipt.pdf", PDF, "application/pdf"), inline("logo", PNG, "image/png"),
         calendar_invite(ICS))


# -- what enqueue refuses --------------------------------------------------------------------
@pytest.mark.parametrize(("part", "html", "why"), [
    (Attachment("", PDF), None, "filename"),
    (Attachment("../etc/passwd", PDF), None, "without a path"),
    (Attachment("a\r\nBcc: x@y.z", PDF), None, "line breaks"),
    (Attachment("a.pdf", PDF, "application/pdf\r\nX: y"), None, "type/subtype"),
    (Attachment("a.pdf", PDF, "pdf"), None, "type/subtype"),
    (Attachment("a.pdf", "text", "text/plain"), None, "must be bytes"),  # type: ignore[arg-type]
    (Attachment("a.pdf", PDF, kind="embedded"), None, "kind"),
    (Attachment("logo.png", PNG, "image/png", "inline"), HTML, "needs a content_id"),
    (inline("logo", PNG, "image/png"), "<p>none</p>", "never names cid:logo"),
    (inline("lo go", PNG, "image/png"), "cid:lo go", "content_id"),
    (Attachment("a.pdf", PDF, content_id="x"), None, "only an inline part"),
    (calendar_invite("BEGIN:VCALENDAR\r\nEND:VCALENDAR\r\n"), None, "METHOD:REQUEST"),
    (Attachment("i.ics", ICS.encode(), "text/calendar; method=REQUEST", "calendar"), None,
     "method= must be CANCEL"),
    (Attachment("i.ics", b"METHOD:REQUEST\r\n\xff", "text/calendar; method=REQUEST",
                "calendar"), None, "UTF-8"),
])
def test_a_malformed_part_is_refused_naming_what_is_wrong(
        part: Attachment, html: str | None, why: str) -> None:
    with pytest.raises(InvalidAttachment, match=why) as raised:
        check_attachments([part], html)
    assert raised.value.field == "attachments"


def test_limits_per_part_per_message_and_count() -> None:
    two = (Attachment("a.pdf", PDF), Attachment("b.pdf", PDF))
    check_attachments(two, None, AttachmentLimits(len(PDF), 2 * len(PDF), 2))
    with pytest.raises(ContentTooLarge, match=r"attachments\[1\] \(b.pdf\) is 1200 bytes"):
        check_attachments((Attachment("a.pdf", b""), two[1]), None,
                          AttachmentLimits(max_attachment_bytes=len(PDF) - 1))
    with pytest.raises(ContentTooLarge, match="total 2400 bytes, over the per-message limit"):
        check_attachments(two, None, AttachmentLimits(max_total_bytes=2 * len(PDF) - 1))
    with pytest.raises(InvalidAttachment, match="over the limit of 1"):
        check_attachments(two, None, AttachmentLimits(max_count=1))
    with pytest.raises(InvalidAttachment, match="at most one calendar"):
        check_attachments((calendar_invite(ICS), calendar_invite(ICS)), None)
    with pytest.raises(InvalidAttachment, match="used twice"):
        check_attachments((inline("logo", PNG, "image/png"), inline("logo", PNG, "image/png")),
                          HTML)


def test_validate_checks_parts_and_only_emails_carry_them() -> None:
    ok = Message(key="k", to="a@example.com", html=HTML, attachments=PARTS)
    validate(ok)
    with pytest.raises(ContentTooLarge):
        validate(ok, Limits(attachments=AttachmentLimits(max_total_bytes=10)))
    with pytest.raises(InvalidAttachment, match="only an email"):
        validate(Message(key="k", to="+4915112345678", text="hi", channel="sms",
                         attachments=PARTS[:1]))


def test_a_calendar_invite_reads_its_method_from_the_content() -> None:
    invite = calendar_invite(ICS)
    assert invite.method == "CANCEL" and invite.kind == "calendar"
    assert invite.content_type == "text/calendar; method=CANCEL; charset=UTF-8"


# -- the JSON adapters, each its documented way ----------------------------------------------
def _decoded(items: list[dict[str, Any]], content: str) -> list[bytes]:
    return [base64.b64decode(item[content], validate=True) for item in items]


def test_postmark_sends_name_base64_content_type_and_a_cid_for_inline_parts() -> None:
    body = postmark_payload(delivery(html=HTML, attachments=PARTS), None)
    items = body["Attachments"]
    assert [(i["Name"], i["ContentType"], i.get("ContentID")) for i in items] == [
        ("receipt.pdf", "application/pdf", None), ("logo", "image/png", "cid:logo"),
        ("invite.ics", "text/calendar; method=CANCEL; charset=UTF-8", None)]
    assert _decoded(items, "Content") == [PDF, PNG, ICS.encode()]


def test_resend_sends_filename_base64_content_type_and_content_id() -> None:
    body = resend_payload(delivery(html=HTML, attachments=PARTS), None)
    items = body["attachments"]
    assert [(i["filename"], i["content_type"], i.get("content_id")) for i in items] == [
        ("receipt.pdf", "application/pdf", None), ("logo", "image/png", "logo"),
        ("invite.ics", "text/calendar; method=CANCEL; charset=UTF-8", None)]
    assert _decoded(items, "content") == [PDF, PNG, ICS.encode()]


def test_the_generic_adapter_documents_kind_and_base64_content() -> None:
    body = generic_payload(delivery(html=HTML, attachments=PARTS), None)
    items = body["attachments"]
    assert [(i["filename"], i["kind"], i["content_id"]) for i in items] == [
        ("receipt.pdf", "attachment", None), ("logo", "inline", "logo"),
        ("invite.ics", "calendar", None)]
    assert _decoded(items, "content") == [PDF, PNG, ICS.encode()]
    assert "attachments" not in generic_payload(delivery(), None)
    assert [p["size"] for p in received_parts(items)] == [len(PDF), len(PNG), len(ICS)]


@pytest.mark.parametrize("make", [
    lambda t: PostmarkProvider(None, transport=t),
    lambda t: ResendProvider(None, transport=t),
    lambda t: JsonHttpProvider("http://api.test/send", transport=t),
])
async def test_the_request_on_the_wire_decodes_to_the_same_bytes(make: Any) -> None:
    seen: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json={"MessageID": "m", "id": "m", "ErrorCode": 0})

    provider = make(httpx.MockTransport(handler))
    try:
        await provider.send(delivery(html=HTML, attachments=PARTS))
    finally:
        await provider.close()
    (body,) = seen
    items = body.get("Attachments") or body["attachments"]
    assert _decoded(items, "Content" if "Attachments" in body else "content") == [
        PDF, PNG, ICS.encode()]


# -- Reply-To goes like the other addresses --------------------------------------------------
def test_reply_to_addresses_go_with_a_labels_and_names_kept() -> None:
    value = "Служба поддержки <help@пример.рф>, team@bücher.de"
    assert wire_reply_to(value, utf8=False, transport="t") == (
        "Служба поддержки <help@xn--e1afmkfd.xn--p1ai>, team@xn--bcher-kva.de")
    raw = build_email(delivery(headers={"Reply-To": value}), "app@example.org").as_bytes()
    assert raw.isascii()
    parsed = message_from_bytes(raw, policy=default)
    assert [a.addr_spec for a in parsed["Reply-To"].addresses] == [
        "help@xn--e1afmkfd.xn--p1ai", "team@xn--bcher-kva.de"]
    assert parsed["Reply-To"].addresses[0].display_name == "Служба поддержки"
    for body in (postmark_payload(delivery(headers={"Reply-To": value}), None),
                 resend_payload(delivery(headers={"Reply-To": value}), None)):
        assert "xn--e1afmkfd.xn--p1ai" in json.dumps(body)
        assert "пример.рф" not in json.dumps(body, ensure_ascii=False)


def test_a_unicode_local_part_in_reply_to_is_refused_where_the_transport_cannot_carry_it() -> None:
    with pytest.raises(InvalidAddress, match="reply_to: the local part is not ASCII"):
        wire_reply_to("анна@пример.рф", utf8=False, transport="this transport cannot")
    assert wire_reply_to("анна@пример.рф", utf8=True, transport="t") == (
        "анна@xn--e1afmkfd.xn--p1ai")


def test_the_demo_receipt_carries_a_well_formed_pdf() -> None:
    """The cross-reference table a PDF reader starts from points at each object."""
    import re

    from postlane.demo import receipt, receipt_pdf

    pdf = receipt_pdf("4202", "19.90 EUR")
    assert pdf.startswith(b"%PDF-1.4\n") and pdf.endswith(b"%%EOF\n")
    start = int(re.findall(rb"startxref\n(\d+)", pdf)[-1])
    assert pdf[start:].startswith(b"xref\n0 6\n")
    offsets = [int(o) for o in re.findall(rb"(\d{10}) 00000 n \n", pdf)]
    assert len(offsets) == 5
    for number, offset in enumerate(offsets, start=1):
        assert pdf[offset:].startswith(f"{number} 0 obj\n".encode())
    length = int(re.findall(rb"/Length (\d+)", pdf)[0])
    stream = pdf.split(b"stream\n", 1)[1].split(b"\nendstream", 1)[0]
    assert len(stream) == length and b"(Receipt 4202)" in stream
    message = receipt("receipt:2", "user2@example.com", order="4202")
    validate(message)
    (part,) = message.attachments
    assert (part.filename, part.content_type, part.content) == (
        "receipt-4202.pdf", "application/pdf", receipt_pdf("4202", "19.90 EUR"))
