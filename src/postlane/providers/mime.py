"""The wire form of an email delivery, shared by the adapters that send MIME (SMTP, SES).

What every attempt of one delivery sends is the same bytes except for nothing that matters:
the ``Message-ID`` is derived from the idempotency key (``<sha256(key)[:32]@sender-domain>``),
the ``Date`` is the delivery's creation time, and the key itself travels in
``X-Postlane-Key`` so the receiving side (a sink, a mailbox, a bounce) can be joined back.

Headers are checked again here, before anything is sent, with the rules of enqueue
(``postlane.core.validation``): a line break in a header value would let a caller inject
headers or a second message, and a header Postlane sets (the MIME structure, the Message-ID,
``X-Postlane-*``) or a ``Message`` field owns (To, Cc, Bcc, From, Sender, Subject) cannot be
given. A row that fails is refused as a permanent outcome.
"""

from __future__ import annotations

import hashlib
from email.message import EmailMessage
from email.policy import SMTP
from email.utils import format_datetime

from postlane.core.message import Delivery
from postlane.core.validation import check_address, check_header, check_subject
from postlane.errors import InvalidMessage, MissingSender

KEY_HEADER = "X-Postlane-Key"


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
    check_subject(delivery.subject)
    for name, value in delivery.headers.items():
        check_header(name, value)
    if delivery.text is None and delivery.html is None:
        raise InvalidMessage("an email needs a text or an html body", field="text")


def build_email(delivery: Delivery, sender: str) -> EmailMessage:
    """The message as it goes on the wire; ``bytes(...)`` via ``as_bytes()`` uses CRLF.

    The caller's headers come after Postlane's; ``check_delivery`` has made sure that none
    of them names a header Postlane sets or a field owns.
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
        if name in msg:  # Date: the caller's replaces the default
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
