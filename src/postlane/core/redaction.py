"""Redaction: how secrets and recipient addresses look when they are logged or printed.

One place for both, since the rule "never unredacted in logs" is one rule: the store, the
providers, the CLI and the worker all show URLs and addresses through these.
"""

from __future__ import annotations

import hashlib
import re
from urllib.parse import urlsplit


def redact_address(address: str) -> str:
    """``alice@example.com`` -> ``a***@example.com``: enough to correlate, not to leak."""
    local, sep, domain = address.rpartition("@")
    if not sep:
        return "***" if len(address) < 4 else address[:2] + "***"
    return f"{local[:1]}***@{domain}"


def redact_url(url: str) -> str:
    """Hide the password of a URL (database, provider, limiter) so it can be printed or
    logged."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


_ADDRESS_IN_TEXT = re.compile(
    r"[^\s<>()\[\]\"',;:=&?/]+(?:@|%40)[^\s<>()\[\]\"',;:&?/]+", re.IGNORECASE)


def redact_addresses(text: str) -> str:
    """Every address inside free text (a provider's answer, a log line, a URL's query with
    ``%40``) redacted as by ``redact_address``: an SMTP 550 often quotes the recipient."""
    return _ADDRESS_IN_TEXT.sub(
        lambda m: redact_address(re.sub("%40", "@", m.group(0), flags=re.IGNORECASE)), text)


def mask_address(address: str) -> str:
    """``alice.smith@example.com`` -> ``al***@example.com #1c9e3f``: still redacted, yet two
    entries of a list (``alice.smith``, ``alice.smyth``) can be told apart and matched
    against an address the operator already knows (``suppress list --address``)."""
    local, sep, domain = address.rpartition("@")
    digest = hashlib.sha256(address.strip().lower().encode()).hexdigest()[:6]
    if not sep:
        return f"{redact_address(address)} #{digest}"
    shown = local[:2] if len(local) > 4 else local[:1]
    return f"{shown}***@{domain} #{digest}"
