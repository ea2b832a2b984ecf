"""Django's email backend on the outbox: ``send_mail`` writes deliveries, a worker sends them.

The deliveries are written through Django's own connection (``POSTLANE["DATABASE"]``), in
an ``atomic`` block of their own: inside the caller's ``transaction.atomic()`` that is a
savepoint of the caller's transaction (the email commits, or rolls back, with the business
write; a refused email leaves the caller's transaction usable), outside one it commits at
once. An ``EmailMessage`` becomes one delivery per recipient, see ``deliveries``.

Attachments come along (``parts``): ``attach(filename, content, mimetype)``, ``attach_file``,
a ``MIMEBase`` part given to ``attach`` (one with a ``Content-ID`` header is an inline part
the HTML names as ``cid:``), and a ``text/calendar`` alternative of an
``EmailMultiAlternatives`` (an invite).
"""

from __future__ import annotations

import mimetypes
import uuid
from collections.abc import Sequence
from email.mime.base import MIMEBase
from email.utils import parseaddr
from functools import partial
from typing import Any

from django.core.mail.backends.base import BaseEmailBackend
from django.core.mail.message import EmailMessage

from postlane.core.attachments import CALENDAR, INLINE, Attachment, calendar_invite
from postlane.core.message import Message
from postlane.core.validation import validate
from postlane.django.conf import PostlaneSettings, postlane_settings
from postlane.errors import InvalidKey, InvalidMessage
from postlane.outbox import enqueue_many

KEY_HEADER = "Idempotency-Key"
# Headers that would contradict the delivery's own recipient (each delivery has one).
_RECIPIENT_HEADERS = {"to", "cc", "bcc"}

outbox: list[Message] = []
"""The messages this process enqueued through the backend whose transaction committed
(a new key only), oldest first: the equivalent of ``django.core.mail.outbox`` for tests.
Clear it between tests (the ``postlane.testing`` plugin's fixtures do)."""


class EmailBackend(BaseEmailBackend):  # type: ignore[misc]
    """``EMAIL_BACKEND = "postlane.django.EmailBackend"``.

    ``fail_silently`` drops an email Postlane refuses (a bad address, an attachment) and
    sends the others; database errors are raised whatever it says.
    """

    def send_messages(self, email_messages: Sequence[EmailMessage]) -> int:
        from django.db import connections, transaction

        conf = postlane_settings()
        sent = 0
        with transaction.atomic(using=conf.database):
            conn = connections[conf.database]
            batch: list[Message] = []
            for email in email_messages:
                try:
                    batch.extend(deliveries(email, conf, conn))
                except InvalidMessage:
                    if not self.fail_silently:
                        raise
                    continue
                sent += 1
            results = enqueue_many(conn, batch, limits=conf.limits)
            created = [m for m, r in zip(batch, results, strict=True) if r.created]
            transaction.on_commit(partial(outbox.extend, created), using=conf.database)
        return sent


def deliveries(email: EmailMessage, conf: PostlaneSettings, conn: Any) -> list[Message]:
    """One validated ``Message`` per recipient of ``email`` (``to``, then ``cc``, then
    ``bcc``): each recipient gets a copy addressed to them alone, sent, retried and
    dead-lettered on its own (no recipient sees the others; there is no Cc line).

    The key is ``email.postlane_key`` or the ``Idempotency-Key`` header (removed from the
    headers sent); with several recipients the n-th's key is ``<key>:<n>`` (from 0). An
    email without a key gets a random one: a retried request then sends twice
    (``POSTLANE["REQUIRE_KEY"] = True`` makes a missing key an error instead).
    """
    headers = {str(k): str(v) for k, v in email.extra_headers.items()}
    header_key = _pop_header(headers, KEY_HEADER)
    key = getattr(email, "postlane_key", None) or header_key
    if not key:
        if conf.require_key:
            raise InvalidKey("this email has no idempotency key: set message.postlane_key or "
                             f"the {KEY_HEADER} header (POSTLANE['REQUIRE_KEY'] is on)",
                             field="key")
        key = f"django:{uuid.uuid4().hex}"
    sender = _address(_pop_header(headers, "From") or email.from_email or "") or None
    for name in list(headers):
        if name.lower() in _RECIPIENT_HEADERS:
            raise InvalidMessage(f"header {name!r}: give recipients as to, cc or bcc (each "
                                 "gets a delivery of their own)", field="headers")
    if email.reply_to:
        headers["Reply-To"] = ", ".join(email.reply_to)
    text, html = _bodies(email)
    recipients = [_address(r) for r in (*email.to, *email.cc, *email.bcc)]
    if not recipients:
        raise InvalidMessage("the email has no recipients", field="to")
    fields: dict[str, Any] = {
        "lane": getattr(email, "postlane_lane", None) or conf.lane,
        "sender": sender, "headers": headers,
        "metadata": dict(getattr(email, "postlane_metadata", None) or {}),
        "expires_at": getattr(email, "postlane_expires_at", None),
        "expires_in": getattr(email, "postlane_expires_in", None),
        "delay": getattr(email, "postlane_delay", None),
        "attachments": parts(email),
    }
    template = getattr(email, "postlane_template", None)
    out = []
    for n, to in enumerate(recipients):
        k = key if len(recipients) == 1 else f"{key}:{n}"
        if template:
            from postlane.templates import render_message_in_transaction

            message = render_message_in_transaction(
                conn, template, getattr(email, "postlane_variables", None) or {}, key=k,
                to=to, version=getattr(email, "postlane_template_version", None), **fields)
        else:
            message = Message(key=k, to=to, subject=email.subject, text=text, html=html,
                              **fields)
        validate(message, conf.limits)
        out.append(message)
    return out


def _pop_header(headers: dict[str, str], name: str) -> str | None:
    """Remove ``name`` (any case) from ``headers``; its value, if it was there."""
    for existing in list(headers):
        if existing.lower() == name.lower():
            return headers.pop(existing)
    return None


def _address(value: str) -> str:
    """``"Ada <ada@example.com>"`` -> ``ada@example.com``: Postlane addresses deliveries by
    the bare address (a display name is dropped)."""
    return parseaddr(value)[1] or value


def _bodies(email: EmailMessage) -> tuple[str | None, str | None]:
    """(text, html) of ``email``: its body by ``content_subtype``, and an HTML alternative
    (``EmailMultiAlternatives.attach_alternative(html, "text/html")``)."""
    text: str | None = email.body or None
    html: str | None = None
    if email.content_subtype == "html":
        text, html = None, email.body
    for alternative in getattr(email, "alternatives", None) or ():
        content, mimetype = alternative[0], alternative[1]
        if str(mimetype).startswith("text/calendar"):
            continue  # an invite: one of the parts
        if mimetype != "text/html" or html is not None:
            raise InvalidMessage(f"an alternative of type {mimetype} is not supported (one "
                                 "text/html alternative and a text/calendar invite are)",
                                 field="alternatives")
        html = content.decode() if isinstance(content, bytes) else str(content)
    return text, html


def parts(email: EmailMessage) -> tuple[Attachment, ...]:
    """``email``'s attachments, inline parts and invite as Postlane parts (checked by
    ``validate`` with the rest of the message)."""
    found: list[Attachment] = []
    for alternative in getattr(email, "alternatives", None) or ():
        content, mimetype = alternative[0], str(alternative[1])
        if mimetype.startswith("text/calendar"):
            data = content if isinstance(content, bytes) else str(content).encode("utf-8")
            invite = calendar_invite(data)
            found.append(Attachment(invite.filename, data, mimetype, CALENDAR)
                         if _param(mimetype, "method") else invite)
    for item in email.attachments:
        if isinstance(item, MIMEBase):
            found.append(_mime_part(item))
            continue
        filename, content, mimetype = item[0], item[1], item[2]
        mimetype = mimetype or mimetypes.guess_type(filename or "")[0] or (
            "text/plain" if isinstance(content, str) else "application/octet-stream")
        data = content.encode("utf-8") if isinstance(content, str) else bytes(content)
        found.append(Attachment(filename or "attachment", data, mimetype))
    return tuple(found)


def _mime_part(part: MIMEBase) -> Attachment:
    """A ``MIMEBase`` given to ``attach``: with a ``Content-ID``, an inline part."""
    content_id = part.get("Content-ID")
    data = part.get_payload(decode=True)
    if not isinstance(data, bytes):
        raise InvalidMessage("an attached MIME part must not be multipart", field="attachments")
    filename = part.get_filename() or (content_id or "").strip("<>") or "attachment"
    if content_id:
        return Attachment(filename, data, part.get_content_type(), INLINE,
                          content_id.strip().strip("<>"))
    return Attachment(filename, data, part.get_content_type())


def _param(mimetype: str, name: str) -> str | None:
    for param in mimetype.split(";")[1:]:
        key, _, value = param.partition("=")
        if key.strip().lower() == name:
            return value.strip().strip('"')
    return None

