"""Mail that comes back over SMTP: bounces, complaints and mailto unsubscribes, parsed with
the standard library's ``email`` package.

- A delivery status notification (RFC 3464: ``multipart/report;
  report-type=delivery-status``) names each recipient with an ``Action`` and a ``Status``:
  ``failed`` with a 5.x.x status is a hard bounce, except 5.2.2 (mailbox full) which,
  like a 4.x.x, is a soft bounce; ``delayed`` is ``deferred``; ``delivered``, ``relayed``
  and ``expanded`` are ``delivered``.
- A feedback report (RFC 5965 ARF: ``report-type=feedback-report``), as mailbox providers'
  feedback loops send them, is a complaint.
- Anything else whose subject is ``unsubscribe TOKEN`` with a token that verifies is the
  mailto form of ``List-Unsubscribe`` (``core.unsubscribe``).

The message it concerns is found by the ``Message-ID`` of the returned message (its
``message/rfc822`` or ``text/rfc822-headers`` part), which the SMTP adapter records as the
provider message id, else by the ``X-Postlane-Key`` header quoted with it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from email import message_from_bytes, policy
from email.message import Message
from email.parser import HeaderParser
from email.utils import getaddresses
from typing import Any

from postlane.core.deliverability import unsubscribe_event
from postlane.core.records import ProviderEvent
from postlane.core.unsubscribe import InvalidToken, token_in_subject, verify
from postlane.core.validation import json_problem

PROVIDER = "smtp"
KEY_HEADER = "X-Postlane-Key"
MAX_BYTES = 10 * 1024 * 1024
"""A bounce quotes the message it returns; some quote it whole, attachments included."""


def classify(action: str, status: str) -> str | None:
    """The normalised kind of one recipient's DSN fields (None: nothing to record)."""
    action = action.strip().lower()
    status = status.strip().split()[0] if status.strip() else ""
    if action == "failed":
        if status.startswith("4.") or status.startswith("5.2.2"):
            return "soft_bounced"
        return "bounced"
    if action == "delayed":
        return "deferred"
    if action in ("delivered", "relayed", "expanded"):
        return "delivered"
    return None


def parse_inbound(raw: bytes, unsubscribe_secrets: Sequence[bytes] = ()) -> list[ProviderEvent]:
    """The events in one inbound message (empty: not a report, not an unsubscribe). An event
    with text no database can keep (a NUL, a lone surrogate) is left out."""
    return [event for event in _events(raw, unsubscribe_secrets) if storable(event)]


def storable(event: ProviderEvent) -> bool:
    return json_problem({**event.data, "id": event.event_id, "to": event.recipient,
                         "message_id": event.provider_message_id,
                         "key": event.idempotency_key}) is None


def _events(raw: bytes, unsubscribe_secrets: Sequence[bytes]) -> list[ProviderEvent]:
    message = message_from_bytes(raw, policy=policy.compat32)
    report_id = _message_id(message) or f"sha256:{hashlib.sha256(raw).hexdigest()}"
    if message.get_content_type() == "multipart/report":
        report_type = str(message.get_param("report-type") or "").lower()
        original = _original_headers(message)
        if report_type == "delivery-status":
            return _dsn_events(message, report_id, original)
        if report_type == "feedback-report":
            return _feedback_events(message, report_id, original)
        return []
    token = token_in_subject(str(message.get("Subject", "")))
    if token and unsubscribe_secrets:
        try:
            claims = verify(unsubscribe_secrets, token)
        except InvalidToken:
            return []
        return [unsubscribe_event(claims, via="mailto")]
    return []


def _message_id(message: Message) -> str | None:
    value = str(message.get("Message-ID", "") or "").strip()
    if not value:
        return None
    return value if value.startswith("<") else f"<{value}>"


def _original_headers(report: Message) -> Message | None:
    """The headers of the returned message, from its ``message/rfc822`` (or
    ``message/rfc822-headers``, ``text/rfc822-headers``) part."""
    for part in report.walk():
        kind = part.get_content_type()
        if kind in ("message/rfc822", "message/global"):
            payload = part.get_payload()
            if isinstance(payload, list) and payload and isinstance(payload[0], Message):
                return payload[0]
        if kind in ("text/rfc822-headers", "message/rfc822-headers"):
            payload = part.get_payload(decode=True)
            if isinstance(payload, bytes):
                return HeaderParser().parsestr(payload.decode("utf-8", "replace"))
    return None


def _original_ids(original: Message | None) -> tuple[str | None, str | None]:
    if original is None:
        return None, None
    key = str(original.get(KEY_HEADER, "") or "").strip() or None
    return _message_id(original), key


def _address(field: str) -> str | None:
    """``rfc822; ada@example.com`` -> ``ada@example.com``."""
    kind, sep, value = field.partition(";")
    address = (value if sep else kind).strip().strip("<>").strip()
    return address.lower() or None


def _dsn_events(report: Message, report_id: str,
                original: Message | None) -> list[ProviderEvent]:
    message_id, key = _original_ids(original)
    events = []
    for part in report.walk():
        if part.get_content_type() not in ("message/delivery-status",
                                           "message/global-delivery-status"):
            continue
        blocks = part.get_payload()
        if not isinstance(blocks, list):
            continue
        for block in blocks[1:]:  # the first block is about the message, the rest per recipient
            if not isinstance(block, Message):
                continue
            recipient = _address(str(block.get("Final-Recipient", "")
                                     or block.get("Original-Recipient", "")))
            kind = classify(str(block.get("Action", "")), str(block.get("Status", "")))
            if recipient is None or kind is None:
                continue
            data: dict[str, Any] = {"action": str(block.get("Action", "")).strip().lower(),
                                    "status": str(block.get("Status", "")).strip()}
            diagnostic = str(block.get("Diagnostic-Code", "") or "").strip()
            if diagnostic:
                data["diagnostic"] = " ".join(diagnostic.split())[:500]
            events.append(ProviderEvent(PROVIDER, f"{report_id}:{recipient}", kind, message_id,
                                        recipient, data, idempotency_key=key))
    return events


def _feedback_events(report: Message, report_id: str,
                     original: Message | None) -> list[ProviderEvent]:
    message_id, key = _original_ids(original)
    recipient = None
    feedback_type = "abuse"
    for part in report.walk():
        if part.get_content_type() == "message/feedback-report":
            fields = _feedback_fields(part)
            feedback_type = fields.get("feedback-type", feedback_type).lower()
            recipient = _address(fields.get("original-rcpt-to", "")) or recipient
    if recipient is None and original is not None:
        found = getaddresses([str(original.get("To", ""))])
        recipient = found[0][1].lower() if found and found[0][1] else None
    return [ProviderEvent(PROVIDER, f"{report_id}:{recipient or ''}", "complained", message_id,
                          recipient, {"feedback_type": feedback_type}, idempotency_key=key)]


def _feedback_fields(part: Message) -> dict[str, str]:
    """The ``name: value`` fields of a ``message/feedback-report`` part, lower-case names."""
    payload = part.get_payload()
    if isinstance(payload, list):  # parsed as a message: its headers are the fields
        fields: dict[str, str] = {}
        for block in payload:
            if isinstance(block, Message):
                fields.update({k.lower(): str(v) for k, v in block.items()})
        return fields
    text = part.get_payload(decode=True)
    parsed = HeaderParser().parsestr(text.decode("utf-8", "replace")
                                     if isinstance(text, bytes) else str(payload))
    return {k.lower(): str(v) for k, v in parsed.items()}
