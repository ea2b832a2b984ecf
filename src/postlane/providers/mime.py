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

International content (``docs/content.md``): subjects and header values in any script go as
RFC 2047 encoded words and bodies as quoted-printable or base64, so the message is 7-bit
and any server takes it; addresses go with their domains in A-labels. A Unicode local part
has no 7-bit form: only ``build_email(..., utf8=True)`` carries it, as an RFC 6532 message
(UTF-8 headers, 8-bit bodies) for an SMTP server that offers SMTPUTF8; otherwise the build
is refused with ``InvalidAddress`` naming the transport.
"""

from __future__ import annotations

import hashlib
from email.message import EmailMessage
from email.policy import SMTP, SMTPUTF8
from email.utils import format_datetime
from typing import Any

from postlane.core.addresses import ascii_domain, wire_address
from postlane.core.fallback import METADATA_KEY as FALLBACK_METADATA_KEY
from postlane.core.message import Delivery
from postlane.core.validation import check_address, check_header, check_subject
from postlane.errors import InvalidMessage, MissingSender

KEY_HEADER = "X-Postlane-Key"
SEVEN_BIT = SMTP.clone(cte_type="7bit")
"""Every byte 7-bit: no server extension (8BITMIME, SMTPUTF8) needed to carry it."""
NO_UTF8 = "this transport cannot carry it"


def key_digest(key: str) -> str:
    """The hex SHA-256 of an idempotency key: a stable, charset-safe stand-in for the key."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def message_id(key: str, sender: str | None = None) -> str:
    """``<sha256(key)[:32]@domain>``: the same for every attempt and replay of a key, over
    every transport (an internationalized domain goes in A-labels)."""
    domain = sender.rpartition("@")[2] if sender and "@" in sender else "postlane"
    if not domain.isascii():
        try:
            domain = ascii_domain(domain, field="sender")
        except InvalidMessage:
            domain = "postlane"
    return f"<{key_digest(key)[:32]}@{domain}>"


def sender_of(delivery: Delivery, default: str | None) -> str:
    sender = delivery.sender or default
    if not sender:
        raise MissingSender("no sender: give the message a sender or the provider URL "
                            "a from= option", field="sender")
    return sender


def provider_metadata(delivery: Delivery) -> dict[str, Any]:
    """The metadata an email provider may see: the caller's, less the SMS fallback (a phone
    number and a text meant for the SMS provider only, ``core.fallback``)."""
    return {k: v for k, v in delivery.metadata.items() if k != FALLBACK_METADATA_KEY}


def check_delivery(delivery: Delivery, sender: str) -> None:
    """Refuse what would corrupt the wire format: raises ``InvalidMessage`` (never sends)."""
    check_address(delivery.recipient, field="to")
    check_address(sender, field="sender")
    check_subject(delivery.subject)
    for name, value in delivery.headers.items():
        check_header(name, value)
    if delivery.text is None and delivery.html is None:
        raise InvalidMessage("an email needs a text or an html body", field="text")


def build_email(delivery: Delivery, sender: str, *, utf8: bool = False,
                transport: str = NO_UTF8) -> EmailMessage:
    """The message as it goes on the wire; ``bytes(...)`` via ``as_bytes()`` uses CRLF.

    ``utf8``: the transport carries RFC 6532 messages (SMTP with SMTPUTF8): headers go as
    UTF-8, bodies as 8-bit. Otherwise everything is 7-bit, and an address with a Unicode
    local part is refused (``InvalidAddress``), with ``transport`` saying why it cannot go.

    The caller's headers come after Postlane's; ``check_delivery`` has made sure that none
    of them names a header Postlane sets or a field owns.
    """
    check_delivery(delivery, sender)
    msg = EmailMessage(policy=SMTPUTF8 if utf8 else SEVEN_BIT)
    msg["From"] = wire_address(sender, field="sender", utf8=utf8, transport=transport)
    msg["To"] = wire_address(delivery.recipient, field="to", utf8=utf8, transport=transport)
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
