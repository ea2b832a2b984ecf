"""Attachments, inline parts and calendar invites: the bytes a message carries beside its bodies.

Three kinds of part, one value (``Attachment``):

- ``attachment``: a file the recipient saves (``Content-Disposition: attachment``): a receipt's
  PDF, an invoice;
- ``inline``: a part the HTML shows in place, referenced as ``<img src="cid:logo">`` by its
  ``content_id`` (logos, QR codes);
- ``calendar``: a ``text/calendar`` invite (``METHOD:REQUEST`` or ``METHOD:CANCEL``) that mail
  clients offer to accept or decline; over MIME it goes as an alternative of the bodies, the
  form Outlook and Gmail recognise.

The content is stored with the delivery at enqueue (``postlane_attachments``, keyed by
delivery id) and read back only when the message is built to send, so every retry and replay
sends the same bytes. Limits (``AttachmentLimits``) are checked at enqueue, with an error that
names the part and the limit; the providers' own limits are documented in ``docs/content.md``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from postlane.errors import ContentTooLarge, InvalidAttachment

ATTACHMENT = "attachment"
INLINE = "inline"
CALENDAR = "calendar"
KINDS = (ATTACHMENT, INLINE, CALENDAR)
CALENDAR_METHODS = ("REQUEST", "CANCEL")

MB = 1024 * 1024
DEFAULT_MAX_ATTACHMENT_BYTES = 10 * MB
DEFAULT_MAX_ATTACHMENTS_BYTES = 10 * MB
"""Postmark's limit for a whole message (10 MB), the smallest of the documented ones: a
deployment on SES or Resend (40 MB raw, about 29 MB of files once base64 grows them by a
third) may raise it."""
MAX_ATTACHMENTS = 100

# RFC 2045 token / type "/" subtype, with parameters; a line break would inject headers.
_TYPE = re.compile(r"^[A-Za-z0-9!#$&^_.+-]+/[A-Za-z0-9!#$&^_.+-]+(\s*;\s*[^\r\n;]+)*$")
# RFC 5322 id-left: dot-atom text, without the angle brackets and without "@" parts.
_CONTENT_ID = re.compile(r"^[A-Za-z0-9!#$%&'*+/=?^_`{|}~.@-]{1,127}$")
_BAD_FILENAME = re.compile(r"[\x00-\x1f\x7f/\\\ud800-\udfff]")
_METHOD = re.compile(rb"^METHOD:([A-Za-z-]+)\r?$", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Attachment:
    """One part beside the bodies. ``content`` is the bytes exactly as they will arrive."""

    filename: str
    content: bytes
    content_type: str = "application/octet-stream"
    kind: str = ATTACHMENT
    """``attachment``, ``inline`` (needs ``content_id``) or ``calendar``."""
    content_id: str | None = None
    """For an inline part: the id the HTML names as ``cid:<content_id>``."""

    @property
    def size(self) -> int:
        return len(self.content)

    @property
    def method(self) -> str | None:
        """A calendar part's iTIP method (``REQUEST``, ``CANCEL``), from its content."""
        found = _METHOD.search(self.content) if self.kind == CALENDAR else None
        return found[1].decode("ascii").upper() if found else None

    def describe(self) -> dict[str, object]:
        """Name, type, kind and size: what a preview, a sandbox or a log may show."""
        return {"filename": self.filename, "content_type": self.content_type,
                "kind": self.kind, "content_id": self.content_id, "size": self.size}


def attachment(filename: str, content: bytes,
               content_type: str = "application/octet-stream") -> Attachment:
    return Attachment(filename, content, content_type)


def inline(content_id: str, content: bytes, content_type: str,
           filename: str | None = None) -> Attachment:
    """A part the HTML shows as ``<img src="cid:{content_id}">``."""
    return Attachment(filename or content_id, content, content_type, INLINE, content_id)


def calendar_invite(ics: str | bytes, filename: str = "invite.ics") -> Attachment:
    """A ``text/calendar`` invite; its method (REQUEST or CANCEL) is read from the content's
    ``METHOD:`` line, which iTIP requires and which must agree with the MIME parameter."""
    content = ics.encode("utf-8") if isinstance(ics, str) else ics
    found = _METHOD.search(content)
    method = found[1].decode("ascii").upper() if found else "REQUEST"
    return Attachment(filename, content, f"text/calendar; method={method}; charset=UTF-8",
                      CALENDAR)


@dataclass(frozen=True, slots=True)
class AttachmentLimits:
    """Sizes checked at enqueue: each part, and all parts of one message together."""

    max_attachment_bytes: int = DEFAULT_MAX_ATTACHMENT_BYTES
    max_total_bytes: int = DEFAULT_MAX_ATTACHMENTS_BYTES
    max_count: int = MAX_ATTACHMENTS


def check_attachment(part: Attachment, index: int) -> None:
    """Raise ``InvalidAttachment`` for a part that could not be sent as given."""
    where = f"attachments[{index}]"
    if not isinstance(part, Attachment):
        raise InvalidAttachment(f"{where}: not an Attachment ({type(part).__name__})",
                                field="attachments")
    if not isinstance(part.content, bytes):
        raise InvalidAttachment(f"{where}: content must be bytes, not "
                                f"{type(part.content).__name__}", field="attachments")
    if not part.filename or _BAD_FILENAME.search(part.filename):
        raise InvalidAttachment(f"{where}: the filename must be a name without a path, control "
                                "characters, line breaks or lone surrogates",
                                field="attachments")
    if len(part.filename) > 255:
        raise InvalidAttachment(f"{where}: the filename is longer than 255 characters",
                                field="attachments")
    if not _TYPE.match(part.content_type):
        raise InvalidAttachment(f"{where} ({part.filename}): content type "
                                f"{part.content_type!r} is not 'type/subtype'",
                                field="attachments")
    if part.kind not in KINDS:
        raise InvalidAttachment(f"{where} ({part.filename}): kind {part.kind!r} is not one of "
                                f"{', '.join(KINDS)}", field="attachments")
    if part.kind == INLINE and not (part.content_id and _CONTENT_ID.match(part.content_id)):
        raise InvalidAttachment(f"{where} ({part.filename}): an inline part needs a content_id "
                                "(ASCII letters, digits and .-_@, up to 127) for the HTML's "
                                "cid: reference", field="attachments")
    if part.kind != INLINE and part.content_id is not None:
        raise InvalidAttachment(f"{where} ({part.filename}): only an inline part has a "
                                "content_id", field="attachments")
    if part.kind == CALENDAR:
        _check_calendar(part, where)


def _check_calendar(part: Attachment, where: str) -> None:
    if not part.content_type.lower().startswith("text/calendar"):
        raise InvalidAttachment(f"{where}: a calendar part is text/calendar",
                                field="attachments")
    method = part.method
    if method not in CALENDAR_METHODS:
        raise InvalidAttachment(f"{where}: a calendar invite needs a METHOD:REQUEST or "
                                "METHOD:CANCEL line", field="attachments")
    declared = re.search(r"method=\"?([A-Za-z-]+)", part.content_type)
    if declared is None or declared[1].upper() != method:
        raise InvalidAttachment(f"{where}: the content type's method= must be {method}, as the "
                                "invite's METHOD line says", field="attachments")
    try:
        part.content.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidAttachment(f"{where}: a calendar invite must be UTF-8 text",
                                field="attachments") from None


def check_attachments(parts: Sequence[Attachment], html: str | None,
                      limits: AttachmentLimits = AttachmentLimits()) -> None:
    """Every part well formed, inline ids unique and referenced from the HTML, at most one
    invite, and the sizes within ``limits`` (``ContentTooLarge`` names which)."""
    if not parts:
        return
    if len(parts) > limits.max_count:
        raise InvalidAttachment(f"{len(parts)} attachments, over the limit of "
                                f"{limits.max_count}", field="attachments")
    seen_ids: set[str] = set()
    total = 0
    for index, part in enumerate(parts):
        check_attachment(part, index)
        if part.size > limits.max_attachment_bytes:
            raise ContentTooLarge(
                f"attachments[{index}] ({part.filename}) is {part.size} bytes, over the "
                f"per-attachment limit of {limits.max_attachment_bytes}", field="attachments")
        total += part.size
        if part.content_id is not None:
            if part.content_id in seen_ids:
                raise InvalidAttachment(f"content_id {part.content_id!r} is used twice",
                                        field="attachments")
            seen_ids.add(part.content_id)
            if html is None or f"cid:{part.content_id}" not in html:
                raise InvalidAttachment(
                    f"attachments[{index}] ({part.filename}) is inline but the HTML never "
                    f"names cid:{part.content_id}", field="attachments")
    if sum(1 for p in parts if p.kind == CALENDAR) > 1:
        raise InvalidAttachment("a message carries at most one calendar invite",
                                field="attachments")
    if total > limits.max_total_bytes:
        raise ContentTooLarge(f"attachments total {total} bytes, over the per-message limit of "
                              f"{limits.max_total_bytes}", field="attachments")
