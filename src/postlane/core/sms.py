"""SMS segments: how many messages a text becomes, and in which encoding. Pure; no I/O.

A text that fits the GSM 03.38 7-bit alphabet (the basic table, plus the extension table
whose characters take an escape septet and so count twice) is sent as GSM-7: 160 septets in
a single message, 153 per part once it is split (the user data header takes 7). One
character outside that alphabet makes the whole text UCS-2: 70 UTF-16 code units single,
67 per part, and a character outside the Basic Multilingual Plane (most emoji) is a
surrogate pair of two units. A split never separates an escape from its character or the
two halves of a surrogate pair, so a part may carry one unit less than its capacity.

An SMS fallback is a delivery of its own (``channel="sms"``) with a key derived from the
original's (``sms-fallback:<original key>``): a new delivery policy, not a free second
attempt at the email. The segment count and encoding are recorded in its metadata at
enqueue, where cost and length can still be refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from postlane.core.message import Message
from postlane.errors import InvalidMessage

GSM7 = "GSM-7"
UCS2 = "UCS-2"

GSM7_BASIC = frozenset(
    "@£$¥èéùìòÇ\nØø\rÅåΔ_ΦΓΛΩΠΨΣΘΞÆæßÉ !\"#¤%&'()*+,-./0123456789:;<=>?"
    "¡ABCDEFGHIJKLMNOPQRSTUVWXYZÄÖÑÜ§¿abcdefghijklmnopqrstuvwxyzäöñüà"
)
"""The GSM 03.38 basic character set (the escape code 0x1B itself is not a character)."""

GSM7_EXTENSION = frozenset("^{}\\[~]|€\f")
"""Characters reached through the escape code: each one costs two septets."""

GSM7_SINGLE, GSM7_PART = 160, 153
UCS2_SINGLE, UCS2_PART = 70, 67

SMS_CHANNEL = "sms"
FALLBACK_PREFIX = "sms-fallback:"
DEFAULT_MAX_SEGMENTS = 10


@dataclass(frozen=True, slots=True)
class Segments:
    encoding: str
    """``GSM-7`` or ``UCS-2``."""
    segments: int
    units: int
    """Septets (GSM-7) or UTF-16 code units (UCS-2) of the whole text."""
    per_segment: int
    """Capacity of one segment at this length: 160/153 or 70/67."""
    parts: tuple[int, ...]
    """Units in each segment, as the text would be split."""

    def as_metadata(self) -> dict[str, Any]:
        return {"encoding": self.encoding, "segments": self.segments, "units": self.units}


def is_gsm7(text: str) -> bool:
    return all(c in GSM7_BASIC or c in GSM7_EXTENSION for c in text)


def _unit_sizes(text: str) -> tuple[str, list[int]]:
    """The encoding, and each character's size in units (1 or 2)."""
    if is_gsm7(text):
        return GSM7, [2 if c in GSM7_EXTENSION else 1 for c in text]
    return UCS2, [2 if ord(c) > 0xFFFF else 1 for c in text]


def _split(sizes: list[int], capacity: int) -> tuple[int, ...]:
    """Greedy split into parts of at most ``capacity`` units; a 2-unit character (escape
    pair, surrogate pair) never straddles two parts."""
    parts: list[int] = []
    current = 0
    for size in sizes:
        if current + size > capacity:
            parts.append(current)
            current = 0
        current += size
    parts.append(current)
    return tuple(parts)


def count_segments(text: str) -> Segments:
    """The encoding and segment count of ``text``; an empty text is one (empty) segment."""
    encoding, sizes = _unit_sizes(text)
    single, part = (GSM7_SINGLE, GSM7_PART) if encoding == GSM7 else (UCS2_SINGLE, UCS2_PART)
    units = sum(sizes)
    if units <= single:
        return Segments(encoding, 1, units, single, (units,))
    parts = _split(sizes, part)
    return Segments(encoding, len(parts), units, part, parts)


def fallback_key(original_key: str) -> str:
    """The SMS fallback's own idempotency key, derived from the original delivery's."""
    return FALLBACK_PREFIX + original_key


def sms_message(
    *, key: str, to: str, text: str, lane: str = "interactive",
    metadata: Mapping[str, Any] | None = None, import_id: str | None = None,
    template_id: str | None = None, template_version: int | None = None,
    expires_at: datetime | None = None, expires_in: timedelta | None = None,
    max_segments: int = DEFAULT_MAX_SEGMENTS,
) -> Message:
    """An SMS send intent with its segment count and encoding in ``metadata["sms"]``.

    Raises ``InvalidMessage`` when the text would take more than ``max_segments``
    (each segment is billed). The phone number is checked (E.164) by validation at enqueue.
    """
    segments = count_segments(text)
    if segments.segments > max_segments:
        raise InvalidMessage(
            f"SMS text is {segments.segments} {segments.encoding} segments "
            f"({segments.units} units), over the limit of {max_segments}", field="text")
    return Message(
        key=key, to=to, text=text, lane=lane, channel=SMS_CHANNEL,
        metadata={**dict(metadata or {}), "sms": segments.as_metadata()},
        import_id=import_id, template_id=template_id, template_version=template_version,
        expires_at=expires_at, expires_in=expires_in,
    )


def sms_fallback(
    original: Message, *, to: str, text: str, lane: str | None = None,
    expires_in: timedelta | None = None, max_segments: int = DEFAULT_MAX_SEGMENTS,
) -> Message:
    """The SMS fallback of an email ``original`` (a ``Message``, or ``Delivery.as_message()``):
    its own key (``sms-fallback:<original key>``), the original's lane, import and expiry
    unless given, and ``metadata["fallback_of"]`` naming the original key."""
    if expires_in is None and original.expires_at is None:
        expires_in = original.expires_in
    return sms_message(
        key=fallback_key(original.key), to=to, text=text, lane=lane or original.lane,
        metadata={"fallback_of": original.key}, import_id=original.import_id,
        expires_at=original.expires_at if expires_in is None else None,
        expires_in=expires_in, max_segments=max_segments,
    )
