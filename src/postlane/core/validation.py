"""Checks a send intent must pass before anything is written.

Syntax only: no DNS, no mailbox probing. The point is to refuse what can never be sent
(or would corrupt the wire format) at enqueue, where the caller can still fix it, instead
of as a dead letter an hour later.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from postlane.core import fallback
from postlane.core.addresses import ascii_domain, unicode_local_problem
from postlane.core.attachments import AttachmentLimits, check_attachments
from postlane.core.message import EMAIL, Message
from postlane.core.redaction import mask_address as mask_address  # re-exported
from postlane.core.redaction import redact_address as redact_address  # re-exported
from postlane.core.redaction import redact_addresses as redact_addresses  # re-exported
from postlane.core.sms import DEFAULT_MAX_SEGMENTS, count_segments
from postlane.errors import (
    ContentTooLarge,
    InvalidAddress,
    InvalidAttachment,
    InvalidHeader,
    InvalidKey,
    InvalidMessage,
    InvalidMetadata,
    InvalidText,
    InvalidTime,
    UnknownLane,
)

MAX_KEY_LENGTH = 255
DEFAULT_MAX_CONTENT_BYTES = 1_000_000

# RFC 5322 dot-atom local part; domains as RFC 1035 labels, or an address literal.
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
_LOCAL = re.compile(rf"^{_ATEXT}+(?:\.{_ATEXT}+)*$")
_QUOTED_LOCAL = re.compile(r'^"(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\[\x20-\x7e])*"$')
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
_ADDRESS_LITERAL = re.compile(r"^\[(?:\d{1,3}(?:\.\d{1,3}){3}|IPv6:[0-9A-Fa-f:.]+)\]$")
_HEADER_NAME = re.compile(r"^[\x21-\x39\x3b-\x7e]+$")  # printable ASCII except ':'
_PHONE = re.compile(r"^\+[1-9]\d{6,14}$")  # E.164
# Checked once per message at enqueue, a hot path for bulk imports: regular expressions
# (C loops) rather than Python loops over characters.
# C0 and C1 controls, and the two Unicode line separators: the key travels in a header.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_WHITESPACE_OR_CONTROL = re.compile(r"[\r\n\t\0 ]")
# The common address in one match: an ASCII dot-atom local part at a host name of two or
# more labels whose last is not all digits. What it accepts, ``check_address`` accepts (its
# lengths aside, checked beside it); anything else takes the full walk, for its own error.
_PLAIN_LABEL = r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)"
_PLAIN_ADDRESS = re.compile(
    rf"{_ATEXT}+(?:\.{_ATEXT}+)*@(?:{_PLAIN_LABEL}\.)+(?=[0-9]*[A-Za-z-]){_PLAIN_LABEL}")


@dataclass(frozen=True, slots=True)
class Limits:
    """What a message is checked against; ``lanes`` are the configured lane names."""

    lanes: Collection[str] = ("interactive", "bulk")
    max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES
    attachments: AttachmentLimits = AttachmentLimits()  # noqa: RUF009 (frozen: shared safely)
    """Per attachment and per message (``docs/content.md`` lists each provider's own)."""


def check_address(address: str, *, field: str = "to") -> None:
    """Raise ``InvalidAddress`` unless ``address`` is a bare, syntactically valid address.

    Internationalized addresses are accepted (``postlane.core.addresses``): a Unicode domain
    that is valid IDNA 2008, a Unicode local part by RFC 6531. Whether a transport can carry
    the local part is the adapter's question, answered at send time."""
    if (type(address) is str and len(address) <= 254 and _PLAIN_ADDRESS.fullmatch(address)
            and address.index("@") <= 64):
        return
    if not isinstance(address, str) or not address:
        raise InvalidAddress(f"{field}: address is empty", field=field)
    if _WHITESPACE_OR_CONTROL.search(address) and not address.startswith('"'):
        raise InvalidAddress(f"{field}: address contains whitespace or control characters",
                             field=field)
    local, sep, domain = address.rpartition("@")
    if not sep or not local or not domain:
        raise InvalidAddress(f"{field}: address has no local part and domain ('user@host')",
                             field=field)
    # RFC 5321's limits are octets; a Unicode local part counts in UTF-8 (RFC 6531).
    local_octets = len(local.encode("utf-8", "surrogatepass"))
    if local_octets > 64:
        raise InvalidAddress(f"{field}: local part is longer than 64 characters", field=field)
    if local.isascii():
        if not (_LOCAL.match(local) or _QUOTED_LOCAL.match(local)):
            raise InvalidAddress(f"{field}: local part is not valid", field=field)
    else:
        problem = unicode_local_problem(local)
        if problem is not None:
            raise InvalidAddress(f"{field}: {problem}", field=field)
    if _ADDRESS_LITERAL.match(domain):
        if local_octets + 1 + len(domain) > 254:
            raise InvalidAddress(f"{field}: address is longer than 254 characters",
                                 field=field)
        return
    if domain.endswith("."):
        # DNS's root dot has no place in an address: RFC 5321 and 5322 refuse it, and
        # Python's email package parses ``To: a@example.com.`` as no address at all.
        raise InvalidAddress(f"{field}: domain {domain!r} ends with a dot; drop it",
                             field=field)
    wire_domain = ascii_domain(domain, field=field)
    if local_octets + 1 + len(wire_domain) > 254:
        raise InvalidAddress(f"{field}: address is longer than 254 characters", field=field)
    labels = wire_domain.split(".")
    if len(labels) < 2 or not all(_LABEL.match(label) for label in labels):
        raise InvalidAddress(f"{field}: domain {domain!r} is not a valid host name", field=field)
    if labels[-1].isdigit():
        raise InvalidAddress(f"{field}: domain {domain!r} has a numeric top-level label",
                             field=field)


def check_header(name: str, value: str) -> None:
    """Refuse header injection: a line break (any ``str.splitlines`` knows) or NUL in a
    value, a malformed name, or a header Postlane sets itself (``check_header_name``)."""
    if not _HEADER_NAME.match(name):
        raise InvalidHeader(f"header name {name!r} is not printable ASCII without ':'",
                            field="headers")
    if "\0" in value or _LINE_BREAK.search(value):
        raise InvalidHeader(f"header {name!r} contains a line break ({LINE_BREAK_NAMES}) "
                            "or NUL", field="headers")
    check_header_name(name)
    if _ENCODED_WORD.search(value):
        raise InvalidHeader(f"header {name!r} {ENCODED_WORD_PROBLEM}", field="headers")
    check_text(value, field="headers")


def check_key(key: str) -> None:
    if not isinstance(key, str) or not key.strip():
        raise InvalidKey("idempotency key is empty; derive it from the business event, "
                         "e.g. 'reset:<token-id>'", field="key")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidKey(f"idempotency key is longer than {MAX_KEY_LENGTH} characters",
                         field="key")
    if _CONTROL.search(key):
        raise InvalidKey("idempotency key contains control characters", field="key")
    if _ENCODED_WORD.search(key):
        raise InvalidKey(f"idempotency key {ENCODED_WORD_PROBLEM}", field="key")


# Every time a store writes must read back on both engines: Python's datetime ends at year
# 9999, PostgreSQL's timestamptz does not (psycopg then fails with "timestamp too large"),
# and SQLite keeps epoch seconds in a REAL, whose rounding can carry 9999-12-31T23:59:59.9
# into year 10000. A day's margin at each end covers the rounding and any display offset.
EARLIEST_TIME = datetime(1, 1, 2, tzinfo=UTC)
LATEST_TIME = datetime(9999, 12, 31, tzinfo=UTC)
"""Times are refused outside ``[EARLIEST_TIME, LATEST_TIME)`` (compared in UTC)."""
_RANGE = f"{EARLIEST_TIME.date().isoformat()} and {(LATEST_TIME - timedelta(days=1)).date()}"


def check_time(value: object, *, field: str) -> None:
    """Raise ``InvalidTime`` unless ``value`` is an aware datetime both stores read back.

    A row holding a time that cannot be read back is a poison delivery: every claim of it
    fails, and with it its whole batch, so it is refused here instead."""
    if not isinstance(value, datetime):
        raise InvalidTime(f"{field} must be a datetime, not {type(value).__name__}",
                          field=field)
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidTime(f"{field} must be timezone-aware", field=field)
    try:
        utc: datetime | None = value.astimezone(UTC)
    except (OverflowError, ValueError):  # 0001-01-01T00:00+01:00 is in year 0 in UTC
        utc = None
    if utc is None or not EARLIEST_TIME <= utc < LATEST_TIME:
        raise InvalidTime(
            f"{field} {value.isoformat()} is out of range: a time must fall between "
            f"{_RANGE} (UTC)", field=field)


def check_span(value: object, *, field: str, zero_ok: bool,
               now: datetime | None = None) -> None:
    """Raise ``InvalidTime`` unless ``value`` is a timedelta (positive, or not negative with
    ``zero_ok``) that, counted from ``now``, still ends before ``LATEST_TIME``."""
    if not isinstance(value, timedelta):
        raise InvalidTime(f"{field} must be a timedelta, not {type(value).__name__}",
                          field=field)
    if value < timedelta(0) or (not zero_ok and not value):
        raise InvalidTime(f"{field} must {'not be negative' if zero_ok else 'be positive'}",
                          field=field)
    if value >= LATEST_TIME - (now or datetime.now(UTC)):
        raise InvalidTime(f"{field} of {value.days} days ends out of range: a time must fall "
                          f"between {_RANGE} (UTC)", field=field)


def check_times(message: Message, now: datetime | None = None) -> None:
    """The message's expiry and delay: one of ``expires_at``/``expires_in``, each readable
    back on both engines once stored (see ``check_time``)."""
    if message.expires_at is not None and message.expires_in is not None:
        raise InvalidMessage("give expires_at or expires_in, not both", field="expires_at")
    if message.expires_at is not None:
        check_time(message.expires_at, field="expires_at")
    if message.expires_in is not None:
        check_span(message.expires_in, field="expires_in", zero_ok=False, now=now)
    if message.delay is not None:
        check_span(message.delay, field="delay", zero_ok=True, now=now)


def validate(message: Message, limits: Limits = Limits()) -> None:
    """Raise a specific ``InvalidMessage`` for the first problem found."""
    check_key(message.key)
    if message.lane not in limits.lanes:
        known = ", ".join(sorted(limits.lanes))
        raise UnknownLane(f"unknown lane {message.lane!r} (configured: {known})", field="lane")
    if message.channel == EMAIL:
        check_address(message.to, field="to")
        if message.sender is not None:
            check_address(message.sender, field="sender")
        if message.text is None and message.html is None:
            raise InvalidMessage("an email needs a text or an html body", field="text")
        check_subject(message.subject)
        if fallback.METADATA_KEY in message.metadata:
            check_sms_fallback(message.metadata[fallback.METADATA_KEY], limits)
    elif message.channel == "sms":
        if not _PHONE.match(message.to):
            raise InvalidAddress("to: not an E.164 phone number (e.g. +4915112345678)",
                                 field="to")
        if not message.text:
            raise InvalidMessage("an SMS needs a text body", field="text")
    else:
        raise InvalidMessage(f"unknown channel {message.channel!r} (email, sms)",
                             field="channel")
    for name, value in message.headers.items():
        check_header(name, value)
    check_times(message)
    check_storable(message)
    size = message.content_size()
    if size > limits.max_content_bytes:
        raise ContentTooLarge(
            f"content is {size} bytes, over the limit of {limits.max_content_bytes}",
            field="content",
        )
    if message.attachments:
        if message.channel != EMAIL:
            raise InvalidAttachment("only an email carries attachments", field="attachments")
        check_attachments(message.attachments, message.html, limits.attachments)


def check_sms_fallback(value: object, limits: Limits) -> None:
    """An email's SMS fallback (``core.fallback``): refused at enqueue, nothing stored, when
    the SMS it would create could not be (a bad number, a text over the segment limit)."""
    spec = fallback.parse_spec(value)
    if not _PHONE.match(spec.to):
        raise InvalidAddress("sms_fallback.to: not an E.164 phone number (e.g. +4915112345678)",
                             field="sms_fallback.to")
    segments = count_segments(spec.text)
    if segments.segments > DEFAULT_MAX_SEGMENTS:
        raise InvalidMessage(
            f"sms_fallback.text is {segments.segments} {segments.encoding} segments "
            f"({segments.units} units), over the limit of {DEFAULT_MAX_SEGMENTS}",
            field="sms_fallback.text")
    check_text(spec.text, field="sms_fallback.text")
    if spec.lane is not None and spec.lane not in limits.lanes:
        raise UnknownLane(f"sms_fallback.lane: unknown lane {spec.lane!r}",
                          field="sms_fallback.lane")


# -- what the wire and the database can carry ---------------------------------------------
# Python's email package folds and splits a header where ``str.splitlines`` breaks a line:
# not only at CR and LF but at VT, FF, FS, GS, RS, NEL, LINE SEPARATOR and PARAGRAPH
# SEPARATOR too. Any of them in a subject or a header value starts a new header line.
LINE_BREAKS = "\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
LINE_BREAK_NAMES = "CR, LF, VT, FF, FS, GS, RS, NEL, U+2028, U+2029"
_LINE_BREAK = re.compile(f"[{re.escape(LINE_BREAKS)}]")
# PostgreSQL refuses NUL in text and jsonb; a lone surrogate has no UTF-8 form at all.
_UNSTORABLE = re.compile(r"[\x00\ud800-\udfff]")
# RFC 2047 encoded-word syntax. Python's email package decodes it in any header value it is
# handed, even inside a word: ``=?utf-8?q?x?=`` goes out as ``x`` over SMTP and SES but
# verbatim through the JSON APIs, so what the recipient reads would depend on the adapter.
_ENCODED_WORD = re.compile(r"=\?[^?]*\?[bBqQ]\?[^?]*\?=")
ENCODED_WORD_PROBLEM = ("contains RFC 2047 encoded-word syntax (=?charset?q?...?=); give the "
                        "text itself: it is encoded on the way out")

RESERVED_HEADERS = frozenset({
    "message-id", "content-type", "mime-version", "content-transfer-encoding",
    "list-unsubscribe", "list-unsubscribe-post",
})
"""Headers the pipeline sets: the MIME structure and the Message-ID derived from the key
(every attempt and replay must be the same message), and the one-click unsubscribe pair,
which carries a signed token only Postlane can make and only bulk lanes carry
(docs/deliverability.md)."""
RESERVED_HEADER_PREFIX = "x-postlane-"
FIELD_HEADERS = {
    "to": "to", "cc": "to", "bcc": "to", "from": "sender", "sender": "sender",
    "subject": "subject",
}
"""Headers a ``Message`` field owns. A caller's ``To``, ``Cc`` or ``Bcc`` would add
recipients the envelope does not name (one delivery is one recipient); ``From`` or
``Sender`` would send in a name the provider never checked; ``Subject`` would shadow the
checked subject."""

MAX_METADATA_DEPTH = 32
"""Deepest nesting of metadata (the object itself is level 1): enough for any caller's
correlation data, far below where hashing or encoding it would exhaust the stack."""


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored (a NUL, a lone surrogate), or None."""
    if value.isascii():  # no surrogate; ``in`` is a memchr, the search a loop
        return "contains a NUL character" if "\0" in value else None
    found = _UNSTORABLE.search(value)
    if found is None:
        return None
    if found.group() == "\0":
        return "contains a NUL character"
    return "is not valid Unicode (a lone surrogate)"


def check_text(value: str, *, field: str) -> None:
    """Raise ``InvalidText`` if no database column can hold ``value``."""
    problem = text_problem(value)
    if problem is not None:
        raise InvalidText(f"{field} {problem}", field=field)


def check_subject(subject: str) -> None:
    """A subject is one header line: no line break of any kind, nothing unstorable."""
    if _LINE_BREAK.search(subject):
        raise InvalidHeader(f"subject contains a line break ({LINE_BREAK_NAMES})",
                            field="subject")
    if _ENCODED_WORD.search(subject):
        raise InvalidHeader(f"subject {ENCODED_WORD_PROBLEM}", field="subject")
    check_text(subject, field="subject")


def check_header_name(name: str) -> None:
    """Refuse a header the pipeline sets itself or a ``Message`` field owns."""
    lower = name.lower()
    if lower in RESERVED_HEADERS or lower.startswith(RESERVED_HEADER_PREFIX):
        why = (" (on bulk lanes, with a signed token: see docs/deliverability.md)"
               if lower.startswith("list-unsubscribe") else "")
        raise InvalidHeader(f"header {name!r} is set by Postlane and cannot be given{why}",
                            field="headers")
    owner = FIELD_HEADERS.get(lower)
    if owner is not None:
        raise InvalidHeader(f"header {name!r} cannot be given: the message's {owner!r} "
                            "field sets it", field="headers")


def json_problem(value: Any, *, max_depth: int = MAX_METADATA_DEPTH) -> str | None:
    """Why ``value`` is not JSON both engines store alike, or None; ``path: reason``.

    Walked with an explicit stack, depth first, so that nesting is refused at
    ``max_depth`` before anything (hashing, encoding, this check) recurses into it.
    """
    stack: list[tuple[Any, str, int]] = [(value, "", 1)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, str):
            problem = text_problem(item)
            if problem is not None:
                return f"{path or 'value'} {problem}"
        elif isinstance(item, bool) or item is None or isinstance(item, int):
            continue
        elif isinstance(item, float):
            if not math.isfinite(item):
                return f"{path or 'value'}: NaN and infinity are not JSON"
        elif isinstance(item, (Mapping, list, tuple)):
            if depth > max_depth:
                return f"nested deeper than {max_depth} levels"
            if isinstance(item, Mapping):
                for key, child in item.items():
                    if not isinstance(key, str):
                        return f"{path or 'value'}: key {key!r} is not a string"
                    problem = text_problem(key)
                    if problem is not None:
                        return f"{path or 'value'}: a key {problem}"
                    stack.append((child, f"{path}.{key}" if path else key, depth + 1))
            else:
                for index, child in enumerate(item):
                    stack.append((child, f"{path}[{index}]", depth + 1))
        else:
            return f"{path or 'value'}: a {type(item).__name__} is not JSON"
    return None


def check_metadata(metadata: Mapping[str, Any]) -> None:
    """Raise ``InvalidMetadata`` unless ``metadata`` is a JSON object within the limits."""
    if not metadata or (type(metadata) is dict and _flat_and_plain(metadata)):
        return
    problem = json_problem(metadata)
    if problem is not None:
        raise InvalidMetadata(f"metadata: {problem}", field="metadata")


def _flat_and_plain(metadata: Mapping[str, Any]) -> bool:
    """Whether ``metadata`` is the common case that ``json_problem`` would pass without a
    walk: one level of ASCII string keys to ASCII strings, integers, booleans or None.
    False only means "look closer"."""
    for key, value in metadata.items():
        if type(key) is not str or not key.isascii() or "\0" in key:
            return False
        kind = type(value)
        if kind is str:
            if not value.isascii() or "\0" in value:
                return False
        elif kind is not int and kind is not bool and value is not None:
            return False
    return True


def check_storable(message: Message) -> None:
    """Every text a delivery row keeps must be storable on both engines and sendable."""
    check_text(message.key, field="key")
    for field, value in (("subject", message.subject), ("text", message.text),
                         ("html", message.html), ("import_id", message.import_id),
                         ("template_id", message.template_id)):
        if value is not None:
            check_text(value, field=field)
    check_metadata(message.metadata)
