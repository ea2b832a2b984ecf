"""Checks a send intent must pass before anything is written.

Syntax only: no DNS, no mailbox probing. The point is to refuse what can never be sent
(or would corrupt the wire format) at enqueue, where the caller can still fix it, instead
of as a dead letter an hour later.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass

from postlane.core.message import EMAIL, Message
from postlane.errors import (
    ContentTooLarge,
    InvalidAddress,
    InvalidHeader,
    InvalidKey,
    InvalidMessage,
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
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_WHITESPACE_OR_CONTROL = re.compile(r"[\r\n\t\0 ]")


@dataclass(frozen=True, slots=True)
class Limits:
    """What a message is checked against; ``lanes`` are the configured lane names."""

    lanes: Collection[str] = ("interactive", "bulk")
    max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES


def check_address(address: str, *, field: str = "to") -> None:
    """Raise ``InvalidAddress`` unless ``address`` is a bare, syntactically valid address."""
    if not isinstance(address, str) or not address:
        raise InvalidAddress(f"{field}: address is empty", field=field)
    if _WHITESPACE_OR_CONTROL.search(address) and not address.startswith('"'):
        raise InvalidAddress(f"{field}: address contains whitespace or control characters",
                             field=field)
    if len(address) > 254:
        raise InvalidAddress(f"{field}: address is longer than 254 characters", field=field)
    local, sep, domain = address.rpartition("@")
    if not sep or not local or not domain:
        raise InvalidAddress(f"{field}: address has no local part and domain ('user@host')",
                             field=field)
    if len(local) > 64:
        raise InvalidAddress(f"{field}: local part is longer than 64 characters", field=field)
    if not (_LOCAL.match(local) or _QUOTED_LOCAL.match(local)):
        raise InvalidAddress(f"{field}: local part is not valid", field=field)
    if _ADDRESS_LITERAL.match(domain):
        return
    labels = domain.rstrip(".").split(".")
    if len(labels) < 2 or not all(_LABEL.match(label) for label in labels):
        raise InvalidAddress(f"{field}: domain {domain!r} is not a valid host name", field=field)
    if labels[-1].isdigit():
        raise InvalidAddress(f"{field}: domain {domain!r} has a numeric top-level label",
                             field=field)


def check_header(name: str, value: str) -> None:
    """Refuse header injection: CR or LF in a name or value, or a malformed name."""
    if not _HEADER_NAME.match(name):
        raise InvalidHeader(f"header name {name!r} is not printable ASCII without ':'",
                            field="headers")
    if "\r" in value or "\n" in value or "\0" in value:
        raise InvalidHeader(f"header {name!r} contains CR, LF or NUL", field="headers")


def check_key(key: str) -> None:
    if not isinstance(key, str) or not key.strip():
        raise InvalidKey("idempotency key is empty; derive it from the business event, "
                         "e.g. 'reset:<token-id>'", field="key")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidKey(f"idempotency key is longer than {MAX_KEY_LENGTH} characters",
                         field="key")
    if _CONTROL.search(key):
        raise InvalidKey("idempotency key contains control characters", field="key")


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
        if "\r" in message.subject or "\n" in message.subject:
            raise InvalidHeader("subject contains CR or LF", field="subject")
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
    if message.expires_at is not None and message.expires_in is not None:
        raise InvalidMessage("give expires_at or expires_in, not both", field="expires_at")
    if message.expires_at is not None and message.expires_at.tzinfo is None:
        raise InvalidMessage("expires_at must be timezone-aware", field="expires_at")
    if message.expires_in is not None and message.expires_in.total_seconds() <= 0:
        raise InvalidMessage("expires_in must be positive", field="expires_in")
    if message.delay is not None and message.delay.total_seconds() < 0:
        raise InvalidMessage("delay must not be negative", field="delay")
    size = message.content_size()
    if size > limits.max_content_bytes:
        raise ContentTooLarge(
            f"content is {size} bytes, over the limit of {limits.max_content_bytes}",
            field="content",
        )


def redact_address(address: str) -> str:
    """``alice@example.com`` -> ``a***@example.com``: enough to correlate, not to leak."""
    local, sep, domain = address.rpartition("@")
    if not sep:
        return "***" if len(address) < 4 else address[:2] + "***"
    return f"{local[:1]}***@{domain}"
