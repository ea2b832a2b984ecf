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

On a bulk lane the worker hands the delivery its one-click unsubscribe pair
(``Delivery.unsubscribe``, ``core.unsubscribe``): ``List-Unsubscribe`` and
``List-Unsubscribe-Post``. They go on the wire here and, for the JSON APIs, through
``wire_headers``; callers cannot give them (``RESERVED_HEADERS``).

International content (``docs/content.md``): subjects and header values in any script go as
RFC 2047 encoded words and bodies as quoted-printable or base64, so the message is 7-bit
and any server takes it; addresses go with their domains in A-labels. A Unicode local part
has no 7-bit form: only ``build_email(..., utf8=True)`` carries it, as an RFC 6532 message
(UTF-8 headers, 8-bit bodies) for an SMTP server that offers SMTPUTF8; otherwise the build
is refused with ``InvalidAddress`` naming the transport. ``Reply-To`` is an address header:
its addresses go like the others (A-labels; a Unicode local part only over UTF-8).

Attachments (``docs/content.md``): the bodies stay a ``multipart/alternative``; a calendar
invite joins them as a third alternative (``text/calendar; method=REQUEST``, the form mail
clients offer to accept); inline parts wrap the HTML in ``multipart/related`` with their
``Content-ID``; files make the whole ``multipart/mixed`` with ``Content-Disposition:
attachment``. Every part's bytes go base64 (a calendar as text, quoted-printable or 8-bit),
so what a receiver decodes is exactly what was enqueued.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from email.headerregistry import Address
from email.message import EmailMessage
from email.policy import SMTP, SMTPUTF8
from email.utils import format_datetime, getaddresses
from typing import Any

from postlane.core.addresses import ascii_domain, wire_address
from postlane.core.attachments import ATTACHMENT, CALENDAR, INLINE, Attachment
from postlane.core.fallback import METADATA_KEY as FALLBACK_METADATA_KEY
from postlane.core.message import Delivery
from postlane.core.validation import check_address, check_header, check_subject
from postlane.errors import InvalidMessage, MissingSender

KEY_HEADER = "X-Postlane-Key"
SEVEN_BIT = SMTP.clone(cte_type="7bit", refold_source="none")
"""Every byte 7-bit: no server extension (8BITMIME, SMTPUTF8) needed to carry it.

``refold_source="none"`` concerns only headers set raw (``set_raw``): the unsubscribe pair,
whose URLs are longer than a line. Refolded by the email package, a word longer than a
line becomes RFC 2047 encoded words, which no mail client reads as a URL; set raw, it goes
as given, one URL per line (well under SMTP's 998)."""
UTF8 = SMTPUTF8.clone(refold_source="none")
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


def unsubscribe_headers(delivery: Delivery) -> dict[str, str]:
    """The one-click unsubscribe pair the worker attached, or nothing (not a bulk lane)."""
    return delivery.unsubscribe.headers() if delivery.unsubscribe is not None else {}


def wire_headers(delivery: Delivery, *, utf8: bool = False,
                 transport: str = NO_UTF8) -> dict[str, str]:
    """The headers a JSON API sends beside the message's fields: the caller's (as
    ``caller_headers`` converts them), the key, and the unsubscribe pair (the MIME adapters
    write the same ones in ``build_email``)."""
    return {**caller_headers(delivery.headers, utf8=utf8, transport=transport),
            KEY_HEADER: delivery.key, **unsubscribe_headers(delivery)}


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


def wire_reply_to(value: str, *, utf8: bool, transport: str) -> str:
    """A ``Reply-To`` value with each address as the transport sends it (domains in A-labels;
    a Unicode local part only when ``utf8``), display names kept as given. A value that does
    not parse as addresses goes as given (the email library judges it, as before)."""
    pairs = getaddresses([value])
    try:
        for _, address in pairs:
            check_address(address, field="reply_to")
    except InvalidMessage:
        return value
    parts = []
    for name, address in pairs:
        wire = wire_address(address, field="reply_to", utf8=utf8, transport=transport)
        parts.append(str(Address(display_name=name, addr_spec=wire)) if name else wire)
    return ", ".join(parts)


def caller_headers(headers: Mapping[str, str], *, utf8: bool,
                   transport: str = NO_UTF8) -> dict[str, str]:
    """The caller's headers as they go on the wire: address headers (``Reply-To``) converted
    like the message's own addresses, every other value as given."""
    return {name: wire_reply_to(value, utf8=utf8, transport=transport)
            if name.lower() == "reply-to" else value for name, value in headers.items()}


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
    msg = EmailMessage(policy=UTF8 if utf8 else SEVEN_BIT)
    msg["From"] = wire_address(sender, field="sender", utf8=utf8, transport=transport)
    msg["To"] = wire_address(delivery.recipient, field="to", utf8=utf8, transport=transport)
    msg["Subject"] = delivery.subject
    msg["Date"] = format_datetime(delivery.created_at)
    msg["Message-ID"] = message_id(delivery.key, sender)
    msg[KEY_HEADER] = delivery.key
    for name, value in unsubscribe_headers(delivery).items():
        msg.set_raw(name, value.replace(", <", ",\n <"))  # one URL per line, unencoded
    for name, value in caller_headers(delivery.headers, utf8=utf8, transport=transport).items():
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
    if delivery.attachments:
        add_parts(msg, delivery.attachments)
        for part in msg.walk():  # the email package stamps one on every part it adds
            if part is not msg:
                del part["MIME-Version"]
    _stable_boundaries(msg, delivery)
    return msg


def _stable_boundaries(msg: EmailMessage, delivery: Delivery) -> None:
    """Boundaries derived from the key, so every attempt and replay sends the same bytes
    (the email package draws random ones). Parts are base64 or quoted-printable, where the
    boundary's ``=_`` cannot occur; the text bodies are searched for it all the same."""
    bodies = (delivery.text or "") + (delivery.html or "")
    stem = f"=_postlane_{key_digest(delivery.key)[:24]}"
    for n, part in enumerate(p for p in msg.walk() if p.is_multipart()):
        boundary = f"{stem}_{n}"
        if boundary not in bodies:
            part.set_boundary(boundary)


def json_attachments(parts: tuple[Attachment, ...]) -> list[dict[str, str | None]]:
    """The parts as the JSON APIs take them: content in base64 (standard alphabet)."""
    return [{"filename": p.filename, "content_type": p.content_type, "kind": p.kind,
             "content_id": p.content_id, "content": base64.b64encode(p.content).decode("ascii")}
            for p in parts]


def _type(part: Attachment) -> tuple[str, str, dict[str, str]]:
    """``maintype``, ``subtype`` and the parameters of a part's content type (a calendar's
    charset aside: the email package sets it when it encodes the text)."""
    kind, *params = (p.strip() for p in part.content_type.split(";"))
    maintype, _, subtype = kind.lower().partition("/")
    parameters = {}
    for param in params:
        name, _, value = param.partition("=")
        if part.kind != CALENDAR or name.strip().lower() != "charset":
            parameters[name.strip().lower()] = value.strip().strip('"')
    return maintype, subtype, parameters


def add_parts(msg: EmailMessage, parts: tuple[Attachment, ...]) -> None:
    """Add a delivery's parts to its built bodies (see the module's docstring for where
    each kind goes)."""
    for part in parts:
        if part.kind == CALENDAR:
            _, subtype, params = _type(part)
            msg.add_alternative(part.content.decode("utf-8"), subtype=subtype, params=params)
    inline = [p for p in parts if p.kind == INLINE]
    if inline:
        html = msg.get_body(preferencelist=("html",))
        if not isinstance(html, EmailMessage):
            raise InvalidMessage("inline parts need an html body that names them",
                                 field="attachments")
        for part in inline:
            maintype, subtype, params = _type(part)
            html.add_related(part.content, maintype, subtype, disposition="inline",
                             filename=part.filename, cid=f"<{part.content_id}>",
                             params=params)
    for part in parts:
        if part.kind == ATTACHMENT:
            maintype, subtype, params = _type(part)
            msg.add_attachment(part.content, maintype, subtype, filename=part.filename,
                               params=params)
