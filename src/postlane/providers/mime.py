"""The wire form of an email delivery, shared by the adapters that send MIME (SMTP, SES).

What every attempt of one delivery sends is the same bytes except for nothing that matters:
the ``Message-ID`` is derived from the idempotency key (``<sha256(key)[:32]@sender-domain>``),
the ``Date`` is the delivery's creation time, and the key itself travels in
``X-Postlane-Key`` so the receiving side (a sink, a mailbox, a bounce) can be joined back.

Headers are checked again here, before anything is sent: a CR or LF in a header value would
let a caller inject headers or a second message, and it is refused as a permanent outcome.
"""

from __future__ import annotations

import hashlib
from email.message import EmailMessage
from email.policy import SMTP
from email.utils import format_datetime

from postlane.core.message import Delivery
from postlane.core.validation import check_address, check_header
from postlane.errors import InvalidHeader, InvalidMessage, MissingSender

KEY_HEADER = "X-Postlane-Key"

_STRUCTURAL = frozenset({
    "mime-version", "content-type", "content-transfer-encoding", KEY_HEADER.lower(),
})
"""Headers the caller cannot set: they would break the MIME structure or the key."""


def key_digest(key: str) -> str:
    """The hex SHA-256 of an idempotency key: a stable, charset-safe stand-in for the key."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def message_id(key: str, sender: str | None = None) -> str:
    """``<sha256(key)[:32]@domain>``: the same for every attempt and replay of a key."""
    domain = sender.rpartition("@")[2] if sender and "@" in sender else "postlane"
    return f"<{key_digest(key)[:32]}@{domain}>"


def sender_of(delivery: Delivery, default: str | None) -> str:
    sender = delivery.sender or default
    if not sender:
        raise MissingSender("no sender: give the message a sender or the provider URL "
                            "a from= option", field="sender")
    return sender


def check_delivery(delivery: Delivery, sender: str) -> None:
    """Refuse what would corrupt the wire format: raises ``InvalidMessage`` (never sends)."""
    check_address(delivery.recipient, field="to")
    check_address(sender, field="sender")
    if "\r" in delivery.subject or "\n" in delivery.subject:
        raise InvalidHeader("subject contains CR or LF", field="subject")
    for name, value in delivery.headers.items():
        check_header(name, value)
        if name.lower() in _STRUCTURAL:
            raise InvalidHeader(f"header {name!r} is set by Postlane and cannot be given",
                                field="headers")
    if delivery.text is None and delivery.html is None:
        raise InvalidMessage("an email needs a text or an html body", field="text")


def build_email(delivery: Delivery, sender: str) -> EmailMessage:
    """The message as it goes on the wire; ``bytes(...)`` via ``as_bytes()`` uses CRLF.

    The caller's own headers replace the defaults of the same name (a caller may set its
    own ``Message-ID``); ``X-Postlane-Key`` and the MIME structure are always Postlane's.
    """
    check_delivery(delivery, sender)
    msg = EmailMessage(policy=SMTP)
    msg["From"] = sender
    msg["To"] = delivery.recipient
    msg["Subject"] = delivery.subject
    msg["Date"] = format_datetime(delivery.created_at)
    msg["Message-ID"] = message_id(delivery.key, sender)
    msg[KEY_HEADER] = delivery.key
    for name, value in delivery.headers.items():
        if name in msg:
            msg.replace_header(name, value)
        else:
            msg[name] = value
    if delivery.text is not None:
        msg.set_content(delivery.text)
        if delivery.html is not None:
            msg.add_alternative(delivery.html, subtype="html")
    else:
        msg.set_content(delivery.html or "", subtype="html")
    return msg
